"""Prove the JAX/CUDA runtime before an expensive job.

    python scripts/euler/check_jax_runtime.py --min-devices 4 \\
        [--platform gpu|cpu] [--expect-gpu-regex 'RTX (3090|4090)|H100|H200'] \\
        [--precision bfloat16] [--train-smoke] [--json PATH]

`--help` lists the checks and their exit codes. The logic lives in `terra_rl.ops.runtime_checks`
(the checks), `terra_rl.ops.runtime` (their registry and runner) and `terra_rl.ops.runtime_cli`
(flags, report), which imports JAX only after `--platform cpu` has set JAX_PLATFORMS.
"""

import sys
from pathlib import Path

# Runnable from anywhere without installing the package: the repo root holds terra_rl/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from terra_rl.ops.runtime_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
