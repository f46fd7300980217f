"""Train a PPO excavation policy: `python train_mixed.py --config solo_excavator [--flag ...]`.

`--help` lists every flag with the preset's value. The logic lives in `terra_rl.cli.main`.
"""

from terra_rl.cli.main import cli

if __name__ == "__main__":
    cli()
