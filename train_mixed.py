"""Train a PPO excavation policy: `python train_mixed.py --config solo_excavator [--flag ...]`.

`--help` lists every flag with the preset's value. The logic lives in `terra_rl.main`.
"""

import sys

from terra_rl.main import main

if __name__ == "__main__":
    sys.exit(main())
