"""Policy networks and their numerics: the Flax models, the precision policy, dynamic loss
scaling, and the CPU-friendly convolution and dot formulations. Imports only
`terra_rl.features` and `terra_rl.choices`."""
