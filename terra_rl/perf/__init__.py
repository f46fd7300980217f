"""Measuring speed: timing helpers for benchmarks and the component profiler."""
