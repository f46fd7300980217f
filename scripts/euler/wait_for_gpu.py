"""Wait until a GPU has enough free memory, then run a command.

    python scripts/euler/wait_for_gpu.py --min-free 20000 [--gpu 1] [--sleep 30] \\
        [--timeout 3600] [--fallback-arg --num_envs_per_device --fallback-arg 256] \\
        -- python train_mixed.py --config solo_excavator

`--help` documents the flags and exit codes; the logic lives in `terra_rl.ops.gpu_wait`.
"""

import sys
from pathlib import Path

# Runnable from anywhere without installing the package: the repo root holds terra_rl/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from terra_rl.ops.gpu_wait import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
