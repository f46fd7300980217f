"""terra_rl: the PPO trainer library (arrives with the trainer issue); benchmark helpers."""
