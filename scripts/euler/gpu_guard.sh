#!/usr/bin/env bash
# Hard-fail a job on the wrong GPU allocation before any JAX work: compares the GPUs that
# `nvidia-smi --query-gpu=name --format=csv,noheader` lists with what the job expects.
#
#     EXPECTED_GPUS=4 ALLOWED_GPUS='RTX (3090|4090)' scripts/euler/gpu_guard.sh
#
#   EXPECTED_GPUS  exact number of GPUs this node must show
#   ALLOWED_GPUS   extended regex every GPU name must match, e.g. 'RTX 4090' or
#                  'RTX (3090|4090)|H100|H200' (a list is an alternation)
#
# Relies on Slurm's device cgroup (ConstrainDevices), which makes nvidia-smi list only the
# job's GPUs. Prints what it got either way. Exit codes:
#    0  count and names as expected
#    2  EXPECTED_GPUS or ALLOWED_GPUS missing or malformed
#   42  GPU count differs from EXPECTED_GPUS
#   43  a GPU name does not match ALLOWED_GPUS
#   44  nvidia-smi is missing or failed (no GPU driver on this node?)
set -euo pipefail

prog="gpu_guard.sh[$(hostname)]"
expected=${EXPECTED_GPUS:-}
allowed=${ALLOWED_GPUS:-}

if [[ ! $expected =~ ^[0-9]+$ ]]; then
    echo "$prog: error: EXPECTED_GPUS must be a whole number of GPUs, got '$expected'" >&2
    exit 2
fi
if [[ -z $allowed ]]; then
    echo "$prog: error: ALLOWED_GPUS must be a regex of allowed GPU names, e.g. 'RTX 4090'" >&2
    exit 2
fi
matches_empty() { [[ "" =~ $1 ]]; }
status=0
matches_empty "$allowed" || status=$?
if ((status == 2)); then
    echo "$prog: error: ALLOWED_GPUS '$allowed' is not a valid extended regex" >&2
    exit 2
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "$prog: FAIL: nvidia-smi not found on PATH; no GPU driver here (is this a GPU node?)" >&2
    exit 44
fi
if ! listing=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1); then
    echo "$prog: FAIL: nvidia-smi failed: ${listing//$'\n'/ }" >&2
    exit 44
fi

gpus=()
while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}   # trim leading whitespace
    line=${line%"${line##*[![:space:]]}"}   # trim trailing whitespace
    [[ -n $line ]] && gpus+=("$line")
done <<<"$listing"

echo "$prog: ${#gpus[@]} GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}," \
    "expected $expected matching /$allowed/):"
for index in "${!gpus[@]}"; do
    echo "  [$index] ${gpus[$index]}"
done

if ((${#gpus[@]} != expected)); then
    echo "$prog: FAIL: ${#gpus[@]} GPU(s) allocated but EXPECTED_GPUS=$expected; resubmit" \
        "with a matching --gpus request" >&2
    exit 42
fi
wrong=()
for name in "${gpus[@]}"; do
    [[ $name =~ $allowed ]] || wrong+=("$name")
done
if ((${#wrong[@]})); then
    echo "$prog: FAIL: GPU type(s) not allowed by ALLOWED_GPUS='$allowed':" \
        "$(printf '%s\n' "${wrong[@]}" | sort -u | paste -sd, - | sed 's/,/, /g')" >&2
    exit 43
fi
echo "$prog: OK"
