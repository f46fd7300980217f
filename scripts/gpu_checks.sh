#!/usr/bin/env bash
# The GPU checks of one lent GPU session, in one command (docs/PERFORMANCE.md, GPU figures):
# the runtime preflight, the component profile of solo_excavator with a trace and its top ops,
# a benchmark at 4x the envs (does the speed scale with the batch, i.e. is the update
# latency-bound?), then solo_excavator training until the time budget ends (SIGTERM: it
# checkpoints and exits cleanly). Everything lands in OUT_DIR.
#
#     OUT_DIR=out TERRA_VENV=/opt/torch/.venv bash scripts/gpu_checks.sh [BUDGET_S]
#
# Inputs: BUDGET_S (default 520) is the wall time all steps share. TERRA_VENV as in
# scripts/euler/env.sh. PLATFORM=cpu and SHAPE="--num_envs_per_device 16 --map_size 16
# --precision float32" try the script on a CPU at a small shape.
set -uo pipefail
budget=${1:-520}
out=${OUT_DIR:?set OUT_DIR to the folder for the reports}
platform=${PLATFORM:-gpu}
read -r -a shape <<<"${SHAPE:-}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/euler/env.sh
source scripts/euler/env.sh || exit 1
export PYTHONUNBUFFERED=1
py=$TERRA_PYTHON
work=$(mktemp -d)
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
step() { echo; echo "=== $1 (t=$((SECONDS - start)) s, $(left) s left)"; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
"$py" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, \
'optax', optax.__version__, jax.devices())"

step "preflight"
smoke=(--train-smoke --expect-gpu-regex 'H100|H200')
[[ $platform == cpu ]] && smoke=()
timeout 150 "$py" scripts/euler/check_jax_runtime.py --platform "$platform" --min-devices 1 \
    ${smoke[@]+"${smoke[@]}"} --json "$out/preflight.json"

step "component profile of solo_excavator, with a trace of 3 updates"
timeout 240 "$py" scripts/profile_rollout_components.py --config solo_excavator \
    --num_devices 1 ${shape[@]+"${shape[@]}"} --repeats 5 --json "$out/profile.json" \
    --trace "$work/trace"
"$py" scripts/trace_top_ops.py "$work/trace" --top 25 --json "$out/top_ops.json"
gzip -c "$work/trace/update.hlo.txt" >"$out/update.hlo.txt.gz"

step "solo_excavator at 4x the envs per device"
sets=(--set num_envs_per_device=4096)
[[ $platform == cpu ]] && sets=(--set num_envs_per_device=16 --set map_size=16 --set precision=float32)
timeout 150 "$py" scripts/benchmark_train.py --config solo_excavator --set num_devices=1 \
    "${sets[@]}" --updates 10 --json "$out/benchmark_4x.json"

step "solo_excavator training until the budget ends"
train_s=$(($(left) - 15))
if ((train_s > 60)); then
    timeout -s TERM "$train_s" "$py" train_mixed.py --config solo_excavator --num_devices 1 \
        ${shape[@]+"${shape[@]}"} --wandb_mode disabled --runs_dir "$work/runs" \
        --run_name solo_gpu 2>&1 | grep -v "^W0000\|^I0000" | tail -60
    cp "$work/runs/solo_gpu/metrics.jsonl" "$out/solo_metrics.jsonl"
else
    echo "skipped: ${train_s} s left"
fi
step "done"
