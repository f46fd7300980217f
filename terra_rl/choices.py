"""The named choices of the configuration's string fields, without the code behind them.

`terra_rl.config_checks` validates a config against these names and the networks
(`terra_rl.nets`) implement them, so the static config never imports network code or JAX.
"""

PRECISIONS = ("float32", "bfloat16", "float16")
"""`--precision`: the encoders' compute dtype (`terra_rl.nets.precision.compute_dtype`)."""
MAP_ENCODERS = ("atari", "resnet", "flat", "none")
"""`--map_encoder`: the excavation policy's map encoder (`terra_rl.nets.models`)."""
IMAGE_ENCODERS = ("cnn", "mlp")
"""`--image_encoder`: the encoder of a gymnax task's image observations."""
GYMNAX_ACTIVATIONS = ("tanh", "relu")
"""`--gymnax_activation`: the hidden activation of the gymnax tasks' networks."""
