#!/usr/bin/env bash
# The H200 session of 2026-11-26, one device call: solo_excavator's update at 1,024 envs with
# XLA:GPU command buffers for loops too, and with 8 minibatches instead of 16 (issue 15), then
# the learning sweep of sweep_2026-11-26.txt (issue 12) for the time left. Everything is packed
# into OUT_DIR/session.tgz. (As run, an empty XLA_FLAGS became " " and the base and 8-minibatch
# benchmarks failed at once; they were rerun on the warm machine with the command in
# docs/PERFORMANCE.md. Fixed here since.)
#     OUT_DIR=$OUT TERRA_VENV=/opt/torch/.venv bash docs/experiments/gpu_session_2026-11-26.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
out=${OUT_DIR:?}
rep=$(mktemp -d)
source scripts/euler/env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
"$TERRA_PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())"
base_flags=${XLA_FLAGS:-}
bench() {  # bench NAME EXTRA_XLA_FLAGS [--set ...]
    local name=$1 flags=$2; shift 2
    echo "=== benchmark $name (t=$SECONDS)"
    XLA_FLAGS=$(echo $base_flags $flags) timeout 100 "$TERRA_PYTHON" scripts/benchmark_train.py \
        --config solo_excavator --set num_devices=1 "$@" --updates 8 --json "$rep/bench_$name.json" \
        2>&1 | grep -v "^W0000\|^I0000" | tail -4
}
bench base ""
bench cmdbuf "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1"
bench minibatches8 "" --set num_minibatches=8
left=$((${BUDGET_S:-540} - SECONDS - 20))
echo "=== sweep for $left s (t=$SECONDS)"
OUT_DIR=$rep/sweep bash docs/experiments/gpu_sweep.sh docs/experiments/sweep_2026-11-26.txt "$left"
tar czf "$out/session.tgz" -C "$rep" .
echo "=== done (t=$SECONDS)"
