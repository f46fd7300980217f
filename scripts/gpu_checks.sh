#!/usr/bin/env bash
# The GPU figures, one mode a call, each within one device call (docs/PERFORMANCE.md, "GPU
# figures"; docs/RESULTS.md for the presets). Everything lands in OUT_DIR.
#
#   OUT_DIR=out bash scripts/gpu_checks.sh train PRESET SEED [FLAGS...]   (<= 9 minutes)
#       From a cold compilation cache: train PRESET (solo_excavator, trench_excavator,
#       mixed_excavators) with --seed SEED on one GPU, then evaluate the final policy greedily
#       on >= 256 held-out episodes per (map type, excavator) group (scripts/evaluate.py).
#       Writes summary.json (completion per group with 95% intervals, the curve, env
#       steps/s, compile and first-update seconds), curves.png, final_eval.json, the metrics
#       and the log. FLAGS go to train_mixed.py (e.g. --precision float32 for an A/B).
#   OUT_DIR=out bash scripts/gpu_checks.sh speed [PRESET]                 (<= 5 minutes)
#       The preset's own shape (default solo_excavator), cold cache: seconds to the first
#       update and to the eval's compile, and steady env steps/s (scripts/benchmark_train.py).
#   OUT_DIR=out bash scripts/gpu_checks.sh xla [PRESET]                   (<= 9 minutes)
#       XLA_FLAGS A/Bs at the preset's shape, each with a cold cache of its own: steady env
#       steps/s as scripts/euler/env.sh sets the flags and with while loops and conditionals
#       recorded into CUDA graphs (command buffers); the cold start (seconds to the first
#       update and to the eval's compile) as set, with GPU autotuning off and with LLVM at
#       -O1. Runs the budget no longer holds are skipped, the least wanted first.
#   OUT_DIR=out bash scripts/gpu_checks.sh environment                    (<= 1 minute)
#       The stack the other modes run on: the GPU, the Python chosen and its packages.
#   OUT_DIR=out bash scripts/gpu_checks.sh profile                        (<= 9 minutes)
#       The runtime preflight, the component profile of solo_excavator with a trace of 3
#       updates and its top ops, and a benchmark at 4x the envs per device.
#
# Inputs: TERRA_VENV as in scripts/euler/env.sh; without one and without .venv, python3's own
# virtualenv where it is one and imports jax, else a virtualenv over the machine's own Python
# packages (--system-site-packages: jax, flax, optax, orbax preinstalled, no internet) made
# under a temporary folder. BUDGET_S overrides the mode's wall-time budget. PLATFORM=cpu and
# SHAPE="--num_envs_per_device 8 --eval_episodes 8" try the script on a CPU at a small shape.
set -uo pipefail
usage="usage: gpu_checks.sh train PRESET SEED [FLAGS...] | speed [PRESET] | xla [PRESET] | profile |
    environment"
mode=${1:?$usage}
shift
case $mode in
train | speed | xla | profile | environment) ;;
*)
    echo "gpu_checks.sh: error: unknown mode '$mode'; use train, speed, xla, profile or environment" >&2
    exit 2
    ;;
esac
out=${OUT_DIR:?set OUT_DIR to the folder for the reports}
platform=${PLATFORM:-gpu}
read -r -a shape <<<"${SHAPE:-}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT  # the reports are in OUT_DIR; the runs and the cache go
if [[ -z ${TERRA_VENV:-} && ! -x .venv/bin/python ]]; then
    # A python3 that is itself a virtualenv holding jax is used as it is: a virtualenv made
    # over it with --system-site-packages would see the base interpreter's packages alone.
    own=$(python3 -c 'import sys, jax; print(sys.prefix if sys.prefix != sys.base_prefix else "")' \
        2>/dev/null)
    if [[ -n $own ]]; then
        export TERRA_VENV=$own
    else
        python3 -m venv --without-pip --system-site-packages "$work/venv" || exit 1
        export TERRA_VENV=$work/venv
    fi
fi
export TERRA_COMPILATION_CACHE_DIR=$work/xla-cache  # cold: nothing compiled before
# shellcheck source=scripts/euler/env.sh
source scripts/euler/env.sh || exit 1
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
[[ $platform == cpu ]] && export JAX_PLATFORMS=cpu
py=$TERRA_PYTHON
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
step() { echo; echo "=== $1 (t=$((SECONDS - start)) s, $(left) s left)"; }
environment() {
    step "environment"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
    "$py" -c "import sys, jax, flax, optax; print('python', sys.executable, sys.version.split()[0], \
'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
}
cache=(--compilation_cache_dir "$TERRA_COMPILATION_CACHE_DIR")

case $mode in
train)
    budget=${BUDGET_S:-530}
    preset=${1:?usage: gpu_checks.sh train PRESET SEED [FLAGS...]}
    seed=${2:?usage: gpu_checks.sh train PRESET SEED [FLAGS...]}
    shift 2
    run=$work/runs/$preset-s$seed
    environment | tee "$out/environment.txt"
    step "train $preset, seed $seed, from a cold cache"
    # The final evaluation needs about a minute (its program is the run's eval, cached).
    train_s=$(($(left) - 75))
    timeout -s TERM "$train_s" "$py" train_mixed.py --config "$preset" --seed "$seed" \
        --num_devices 1 --runs_dir "$work/runs" --run_name "$(basename "$run")" \
        "${cache[@]}" ${shape[@]+"${shape[@]}"} "$@" 2>&1 \
        | grep --line-buffered -v "^W0000\|^I0000" | tee "$out/train.log" | tail -40
    if [[ ! -f $run/config.json ]]; then
        echo "gpu_checks.sh: error: train_mixed.py made no run (its log: $out/train.log)" >&2
        exit 1
    fi
    cp "$run/metrics.jsonl" "$run/config.json" "$out/" 2>/dev/null
    step "the final policy on the held-out maps"
    episodes=()
    [[ -n ${SHAPE:-} ]] || episodes=(--episodes "$("$py" -c "
import json; c = json.load(open('$run/config.json'))
groups = len(c['map_types']) * (2 if 0 < c['wheeled_fraction'] < 1 else 1)
print(max(c['eval_episodes'], 256 * groups))")")
    timeout $(($(left) - 10)) "$py" scripts/evaluate.py "$run" --checkpoint latest \
        ${episodes[@]+"${episodes[@]}"} --json "$out/final_eval.json" 2>&1 \
        | grep -v "^W0000\|^I0000"
    "$py" -m terra_rl.analysis.run_summary "$run" --log "$out/train.log" \
        --eval "$out/final_eval.json" --out "$out"
    ;;
speed)
    budget=${BUDGET_S:-290}
    preset=${1:-solo_excavator}
    environment | tee "$out/environment.txt"
    step "$preset: 3 updates and an eval from a cold cache"
    timeout 170 "$py" train_mixed.py --config "$preset" --num_devices 1 --max_updates 3 \
        --log_eval_interval 3 --runs_dir "$work/runs" --run_name speed "${cache[@]}" \
        ${shape[@]+"${shape[@]}"} 2>&1 | grep -v "^W0000\|^I0000" | tee "$out/speed_start.log"
    step "$preset: steady env steps/s"
    sets=(--set num_devices=1)
    [[ $platform == cpu ]] && sets+=(--set num_envs_per_device=8 --set eval_episodes=8)
    timeout $(($(left) - 5)) "$py" scripts/benchmark_train.py --config "$preset" "${sets[@]}" \
        --updates 20 --json "$out/speed_benchmark.json"
    "$py" -c "
import json
from terra_rl.analysis.run_summary import parse_log
bench = json.load(open('$out/speed_benchmark.json'))
figures = {'cold_start': parse_log(open('$out/speed_start.log').read()),
           'steady': {k: bench.get(k) for k in ('steps_per_second', 'seconds_per_update',
                                                'env_steps_per_update', 'compile_seconds')},
           'benchmark': bench}
json.dump(figures, open('$out/speed.json', 'w'), indent=2)
print(json.dumps({k: figures[k] for k in ('cold_start', 'steady')}, indent=2))"
    ;;
xla)
    budget=${BUDGET_S:-520}
    preset=${1:-solo_excavator}
    environment | tee "$out/environment.txt"
    set_flags=${XLA_FLAGS:-}
    joined() { echo "$1${1:+${2:+ }}$2"; }  # XLA reads a value without "--" as a file name
    sets=(--set num_devices=1)
    [[ $platform == cpu ]] && sets+=(--set num_envs_per_device=8 --set eval_episodes=8)
    graphs="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
    # kind|name|extra XLA flags, most wanted first; a run the budget no longer holds is
    # skipped. start: 3 updates and an eval (train_mixed.py); steady: benchmark_train.py.
    runs=("steady|as_set|" "steady|graphs|$graphs" "start|as_set|"
          "start|autotune_off|--xla_gpu_autotune_level=0"
          "steady|graphs_min1|$graphs --xla_gpu_graph_min_graph_size=1"
          "start|opt_level_1|--xla_backend_optimization_level=1")
    done_runs=()
    for entry in "${runs[@]}"; do
        IFS='|' read -r kind name extra <<<"$entry"
        limit=$([[ $kind == start ]] && echo 130 || echo 90)
        if (($(left) < limit + 10)); then
            echo "gpu_checks.sh: skipped $kind $name: $(left) s left" >&2
            continue
        fi
        done_runs+=("${kind}_$name")
        step "$preset: $kind, $name (XLA_FLAGS: ${extra:-as set})"
        if [[ $kind == start ]]; then
            XLA_FLAGS=$(joined "$set_flags" "$extra") timeout "$limit" "$py" train_mixed.py \
                --config "$preset" --num_devices 1 --max_updates 3 --log_eval_interval 3 \
                --runs_dir "$work/runs" --run_name "start_$name" \
                --compilation_cache_dir "$work/cache_start_$name" ${shape[@]+"${shape[@]}"} \
                2>&1 | grep -v "^W0000\|^I0000" | tee "$out/xla_start_$name.log" | tail -4
        else
            XLA_FLAGS=$(joined "$set_flags" "$extra") timeout "$limit" "$py" \
                scripts/benchmark_train.py --config "$preset" "${sets[@]}" --updates 20 \
                --compilation-cache-dir "$work/cache_steady_$name" \
                --json "$out/xla_steady_$name.json" 2>&1 | grep -v "^W0000\|^I0000" | tail -3
        fi
    done
    OUT=$out RUNS="${done_runs[*]}" "$py" -c "
import json, os
from terra_rl.analysis.run_summary import parse_log
out = os.environ['OUT']
def steady(text):
    bench = json.loads(text)
    return {key: bench.get(key) for key in ('steps_per_second', 'seconds_per_update',
                                            'compile_seconds')}
figures = {'cold_start': {}, 'steady': {}, 'xla_flags_as_set': os.environ.get('XLA_FLAGS', '')}
for run in os.environ['RUNS'].split():
    kind, name = run.split('_', 1)
    start = kind == 'start'
    path = f'{out}/xla_start_{name}.log' if start else f'{out}/xla_steady_{name}.json'
    try:
        text = open(path).read()
        figure = parse_log(text) if start else steady(text)
    except (OSError, ValueError) as error:
        figure = {'error': str(error)}
    figures['cold_start' if start else 'steady'][name] = figure
json.dump(figures, open(f'{out}/xla.json', 'w'), indent=2)
print(json.dumps(figures, indent=2))"
    ;;
profile)
    budget=${BUDGET_S:-520}
    environment | tee "$out/environment.txt"
    step "preflight"
    smoke=(--train-smoke --expect-gpu-regex 'H100|H200')
    [[ $platform == cpu ]] && smoke=()
    timeout 150 "$py" scripts/euler/check_jax_runtime.py --platform "$platform" \
        --min-devices 1 ${smoke[@]+"${smoke[@]}"} --json "$out/preflight.json"
    step "component profile of solo_excavator, with a trace of 3 updates"
    timeout 240 "$py" scripts/profile_rollout_components.py --config solo_excavator \
        --num_devices 1 ${shape[@]+"${shape[@]}"} --repeats 5 --json "$out/profile.json" \
        --trace "$work/trace"
    "$py" scripts/trace_top_ops.py "$work/trace" --top 25 --json "$out/top_ops.json"
    gzip -c "$work/trace/update.hlo.txt" >"$out/update.hlo.txt.gz"
    step "solo_excavator at 4x the envs per device"
    sets=(--set num_envs_per_device=4096)
    [[ $platform == cpu ]] && sets=(--set num_envs_per_device=16 --set map_size=16)
    timeout $(($(left) - 5)) "$py" scripts/benchmark_train.py --config solo_excavator \
        --set num_devices=1 "${sets[@]}" --updates 10 --json "$out/benchmark_4x.json"
    ;;
environment)
    budget=${BUDGET_S:-60}
    environment | tee "$out/environment.txt"
    ;;
esac
step "done"
