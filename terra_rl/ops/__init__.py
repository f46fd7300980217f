"""Cluster operations: the JAX/CUDA runtime preflight and the GPU wait wrapper."""
