"""The command line: the one-line-error parser shared by every script, the training
flags, and `train_mixed.py`'s main."""
