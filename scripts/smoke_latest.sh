#!/usr/bin/env bash
# A short smoke with the highest versions pyproject.toml's ranges allow, in a fresh virtualenv
# beside .venv (which `make test` fills with constraints.txt's lower bounds). .ci/run calls it
# after `make test`. It checks the import, one training update, one evaluation and a
# checkpoint round trip:
#
#   1. pip install --upgrade -e . into a new virtualenv (no constraints file, no dev extra);
#   2. train_mixed.py --config cpu_demo at a tiny shape, stopped after 1 update with a
#      checkpoint (--max_updates 1);
#   3. train_mixed.py --resume on that run: the checkpoint restored, one more update, its
#      final evaluation on held-out maps;
#   4. scripts/evaluate.py on the run's latest checkpoint (restored again, evaluated).
#
# The run's compilation cache is a new folder of its own: step 2 compiles cold and writes
# it, steps 3 and 4 read their programs back from it, as a resumed run does.
#
#   bash scripts/smoke_latest.sh
#
# Environment: SKIP_SMOKE_LATEST=1 skips it (local runs); SMOKE_PYTHON is the interpreter
# for the virtualenv (default python3.12 where it runs, else python3); SMOKE_VENV reuses or
# keeps the virtualenv at that path (default: a temporary folder, removed at the end).
# Prints the installed versions and the wall time; exits non-zero on the first failure.
set -euo pipefail

if [[ ${SKIP_SMOKE_LATEST:-0} == 1 ]]; then
    echo "smoke_latest: skipped (SKIP_SMOKE_LATEST=1)"
    exit 0
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv=${SMOKE_VENV:-$work/venv}
# The highest jax needs a newer Python than the 3.11 `make test` runs on: take 3.12 where it
# runs here (jax 0.11.x was resolved with it), else python3.
python=${SMOKE_PYTHON:-}
if [[ -z $python ]]; then
    python=python3
    if python3.12 -c 'import sys' >/dev/null 2>&1; then
        python=python3.12
    fi
fi

if [[ ! -x $venv/bin/python ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    --upgrade-strategy eager -e .
"$venv/bin/python" - <<'EOF'
import platform
from importlib.metadata import version

names = ("jax", "jaxlib", "flax", "optax", "chex", "orbax-checkpoint", "gymnax", "numpy")
print("smoke_latest: python", platform.python_version(),
      " ".join(f"{name} {version(name)}" for name in names))
import envs, terra_rl  # noqa: E401,F401  the import itself is the first check
EOF

export JAX_PLATFORMS=cpu WANDB_MODE=disabled
tiny=(--config cpu_demo --runs_dir "$work/runs" --run_name smoke --wandb_mode disabled
      --compilation_cache_dir "$work/cache" --num_devices 1 --num_envs_per_device 8 --num_steps 8
      --num_minibatches 2 --update_epochs 1 --max_steps 24 --eval_episodes 8 --num_maps 16
      --total_timesteps 128 --log_eval_interval 2 --checkpoint_interval 1)
run=$work/runs/smoke

"$venv/bin/python" train_mixed.py "${tiny[@]}" --max_updates 1
"$venv/bin/python" train_mixed.py --resume "$run"  # exit 3 when there is no checkpoint
grep -q '"eval/completion_rate"' "$run/metrics.jsonl" \
    || { echo "smoke_latest: no evaluation in $run/metrics.jsonl" >&2; exit 1; }
"$venv/bin/python" scripts/evaluate.py "$run" --checkpoint latest --episodes 8 \
    --json "$work/eval.json"
"$venv/bin/python" - "$work/eval.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
assert report["update"] == 2, report["update"]
assert 0.0 <= report["all"]["completion_rate"] <= 1.0, report["all"]
EOF
echo "smoke_latest: passed in $((SECONDS - start)) s"
