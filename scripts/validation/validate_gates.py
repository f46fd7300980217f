"""CPU validation gates before a launch: named checks with a PASS/FAIL each.

    .venv/bin/python scripts/validation/validate_gates.py --case all --jax-platforms cpu
    .venv/bin/python scripts/validation/validate_gates.py --case ppo-mask --case env-action-mask
    .venv/bin/python scripts/validation/validate_gates.py --list

The cases live in `terra_rl/validation/`; docs/VALIDATION.md says what each proves and when
to run it.
"""

from __future__ import annotations

import sys

from terra_rl.validation.cli import main

if __name__ == "__main__":
    sys.exit(main())
