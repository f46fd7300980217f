"""The algorithm: PPO's loss and GAE, the rollout-plus-update step, evaluation, and the
run's random keys. Pure functions of config, networks and env adapters; it never imports
run management, cluster operations or the command line."""
