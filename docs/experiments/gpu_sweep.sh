#!/usr/bin/env bash
# Several train_mixed.py runs side by side on one lent GPU, each for the same wall time, and their
# metrics.jsonl copied out: a learning sweep that would take hours one at a time on the CPU.
# Each line of SPEC_FILE is `NAME FLAGS...` (blank lines and `#` comments skipped); every run gets
# `--wandb_mode disabled` and its own run directory.
#
#     OUT_DIR=out TERRA_VENV=/opt/torch/.venv bash docs/experiments/gpu_sweep.sh SPEC_FILE SECONDS
#
# Runs share the GPU (no preallocation), so each one's speed is not a benchmark figure;
# compare them at equal updates. Writes OUT_DIR/NAME.jsonl and OUT_DIR/NAME.log (last lines).
# Tried once (docs/PERFORMANCE.md, 2026-11-26): seven runs of the 64-env CPU presets shared
# the H200 at 0.5-0.9k env steps/s each, slower than the 2-core CPU; not worth repeating.
set -uo pipefail
spec=${1:?usage: gpu_sweep.sh SPEC_FILE SECONDS}
seconds=${2:?usage: gpu_sweep.sh SPEC_FILE SECONDS}
out=${OUT_DIR:?set OUT_DIR to the folder for the reports}
[[ -r $spec ]] || { echo "gpu_sweep.sh: error: cannot read $spec" >&2; exit 2; }
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
# shellcheck source=scripts/euler/env.sh
source scripts/euler/env.sh || exit 1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
work=$(mktemp -d)
names=()
while read -r name flags; do
    [[ -z $name || $name == \#* ]] && continue
    names+=("$name")
    # shellcheck disable=SC2086
    timeout -s TERM "$seconds" "$TERRA_PYTHON" train_mixed.py $flags --wandb_mode disabled \
        --runs_dir "$work/runs" --run_name "$name" >"$work/$name.log" 2>&1 &
done <"$spec"
echo "started ${#names[@]} runs for $seconds s: ${names[*]}"
wait
for name in "${names[@]}"; do
    cp "$work/runs/$name/metrics.jsonl" "$out/$name.jsonl" 2>/dev/null \
        || echo "$name: no metrics.jsonl"
    grep -v "^W0000\|^I0000" "$work/$name.log" | tail -25 >"$out/$name.log"
    echo "== $name"; grep -E "completion|update compiled|error" "$out/$name.log" | tail -4
done
