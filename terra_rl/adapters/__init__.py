"""Environments as the trainer sees them: the excavation env and gymnax tasks behind one
batched interface (`train_env.make_train_env`)."""
