# shellcheck shell=bash
# The steps every terra_rl Slurm job runs, shared by the sbatch scripts. `terra_job CONFIG
# [TRAIN_FLAGS...]` runs them in order and exits with the first failing step's code:
#
#   1. setup: TERRA_MODULES, then scripts/euler/env.sh                              (40)
#   2. gpu_guard.sh on every node: GPU count and names, before any JAX work   (42, 43, 44)
#   3. check_jax_runtime.py preflight on every node                  (its codes: 2, 3, 10-14)
#   4. first-update smoke, W&B disabled: train_mixed.py must log update 1              (45)
#   5. the real run: resumed with --resume when its run directory has a checkpoint, else
#      new (a directory without a checkpoint is moved aside)           (train_mixed.py's)
#
# USR1 (sbatch --signal=B:USR1@300) requeues the job (scontrol requeue) and sends TERM to the
# running step. TERM (preemption, scancel) is passed on to the running step. train_mixed.py
# answers either signal by checkpointing the update in flight and exiting 75; the job then
# requeues itself (unless USR1 already did) and ends with 0. The requeued job keeps its
# SLURM_JOB_ID, so it finds the same run directory and resumes from the latest checkpoint.
# A resume with nothing left to do (train_mixed.py exit 3) counts as finished.
#
# Parameters (environment):
#   TERRA_REPO          repository root (the sbatch scripts default it to SLURM_SUBMIT_DIR)
#   EXPECTED_GPUS       GPUs per node; ALLOWED_GPUS: regex of allowed names (gpu_guard.sh)
#   TERRA_RUN_NAME      run name (default <CONFIG>-<SLURM_JOB_ID>); reuse it to continue a run
#                       in a new job
#   TERRA_MODULES       modules to `module load` first (space separated), e.g. eth_proxy
#   TERRA_PREFLIGHT_ARGS extra check_jax_runtime.py flags, e.g. "--train-smoke"
#   TERRA_RESUME_ARGS   extra train_mixed.py flags when resuming, e.g. "--total_timesteps N"
#   TERRA_SKIP_SMOKE=1  skip step 4 (only for a config whose smoke passed on this GPU type)
# Arrays the sbatch script may set before calling terra_job:
#   TERRA_LAUNCH        prefix that runs a command once per node, e.g. (srun --ntasks-per-node=1)
#   TERRA_RUNTIME_ARGS  flags for every train_mixed.py call (smoke, new, resume), e.g.
#                       (--distributed)

declare -p TERRA_LAUNCH >/dev/null 2>&1 || TERRA_LAUNCH=()
declare -p TERRA_RUNTIME_ARGS >/dev/null 2>&1 || TERRA_RUNTIME_ARGS=()
TERRA_CHILD_PID=""
TERRA_TRAPPED=0
TERRA_REQUEUED=0
TERRA_GPU_SUMMARY="unknown"

terra_log() {
    printf '[%s terra_job] %s\n' "$(date '+%F %T')" "$*"
}

# Run a command in the background and wait for it, so a USR1 or TERM trap fires while it
# runs. A trapped signal ends `wait` early with 128 + the signal: wait again for the
# command's own status (bash keeps it until waited for; 127 means the first wait had it).
terra_run() {
    local status=0 again
    "$@" &
    TERRA_CHILD_PID=$!
    TERRA_TRAPPED=0
    wait "$TERRA_CHILD_PID" || status=$?
    while ((TERRA_TRAPPED)); do
        TERRA_TRAPPED=0
        again=0
        wait "$TERRA_CHILD_PID" || again=$?
        ((again == 127)) || status=$again
    done
    TERRA_CHILD_PID=""
    return "$status"
}

# train_mixed.py's exit codes (terra_rl/cli/main.py, docs/OPERATIONS.md).
TERRA_EXIT_NOTHING_TO_DO=3
TERRA_EXIT_STOPPED=75

terra_requeue() {
    TERRA_REQUEUED=1
    terra_log "requeueing job ${SLURM_JOB_ID:-?}: $* (it resumes from the latest" \
        "checkpoint of ${TERRA_RUN_DIR:-its run directory})"
    if ! scontrol requeue "${SLURM_JOB_ID:-}"; then
        terra_log "scontrol requeue failed; resubmit with TERRA_RUN_NAME=${TERRA_RUN_NAME:-?}" \
            "to resume"
    fi
}

terra_on_usr1() {
    TERRA_TRAPPED=1
    terra_requeue "USR1, time limit near"
    if [[ -n $TERRA_CHILD_PID ]]; then
        kill -TERM "$TERRA_CHILD_PID" 2>/dev/null || true
    fi
}

terra_on_term() {
    TERRA_TRAPPED=1
    terra_log "TERM received: the running step checkpoints and stops"
    if [[ -n $TERRA_CHILD_PID ]]; then
        kill -TERM "$TERRA_CHILD_PID" 2>/dev/null || true
    fi
}

terra_setup() {
    if [[ -n ${TERRA_MODULES:-} ]]; then
        if ! type module >/dev/null 2>&1; then
            echo "terra_job: error: TERRA_MODULES='$TERRA_MODULES' but there is no" \
                "'module' command; unset TERRA_MODULES or use a login shell" >&2
            return 40
        fi
        set +u  # module scripts read unset variables
        # shellcheck disable=SC2086 # a space-separated list of module names
        module load $TERRA_MODULES || { set -u; return 40; }
        set -u
    fi
    # shellcheck source=SCRIPTDIR/env.sh
    source "$TERRA_REPO/scripts/euler/env.sh" || return 40
    TERRA_JOB_DIR=$TERRA_RUNS_DIR/_jobs/${SLURM_JOB_ID:-local-$$}
    export TERRA_JOB_DIR
    mkdir -p "$TERRA_JOB_DIR" || return 40
}

terra_print_environment() {
    terra_log "host $(hostname), job ${SLURM_JOB_ID:-none} (restart" \
        "${SLURM_RESTART_COUNT:-0}), nodes ${SLURM_JOB_NODELIST:-$(hostname)}"
    terra_log "python $TERRA_PYTHON; runs $TERRA_RUNS_DIR; job files $TERRA_JOB_DIR"
    terra_log "XLA cache $TERRA_COMPILATION_CACHE_DIR; XLA_FLAGS='${XLA_FLAGS:-}'"
    terra_log "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
}

terra_step_guard() {
    terra_log "step 1/4: GPU guard (EXPECTED_GPUS=${EXPECTED_GPUS:-?}," \
        "ALLOWED_GPUS='${ALLOWED_GPUS:-}')"
    local status=0
    "${TERRA_LAUNCH[@]}" "$TERRA_REPO/scripts/euler/gpu_guard.sh" || status=$?
    if ((status != 0)); then
        terra_log "GPU guard failed (exit $status): wrong allocation, nothing was run"
        return "$status"
    fi
    TERRA_GPU_SUMMARY=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c |
        awk '{count = $1; $1 = ""; printf "%s%dx%s", sep, count, $0; sep = ", "}')
}

terra_step_preflight() {
    terra_log "step 2/4: runtime preflight (reports: $TERRA_JOB_DIR/preflight-<host>.json)"
    local status=0 extra=()
    read -r -a extra <<<"${TERRA_PREFLIGHT_ARGS:-}"
    # shellcheck disable=SC2016 # $(hostname) expands on each node, not here
    terra_run "${TERRA_LAUNCH[@]}" bash -c \
        'exec "$@" --json "$TERRA_JOB_DIR/preflight-$(hostname).json"' preflight \
        "$TERRA_PYTHON" "$TERRA_REPO/scripts/euler/check_jax_runtime.py" --platform gpu \
        --min-devices "$EXPECTED_GPUS" --expect-gpu-regex "$ALLOWED_GPUS" "${extra[@]}" ||
        status=$?
    if ((status != 0)); then
        terra_log "preflight failed (exit $status); see docs/OPERATIONS.md for its exit codes"
    fi
    return "$status"
}

# terra_step_smoke CONFIG [TRAIN_FLAGS...]: one update of the real config and shapes.
terra_step_smoke() {
    local config=$1 status=0
    shift
    if [[ ${TERRA_SKIP_SMOKE:-0} == 1 ]]; then
        terra_log "step 3/4: first-update smoke SKIPPED (TERRA_SKIP_SMOKE=1)"
        return 0
    fi
    local smoke_runs=$TERRA_JOB_DIR/smoke smoke_name="smoke-r${SLURM_RESTART_COUNT:-0}"
    rm -rf "${smoke_runs:?}/$smoke_name"
    terra_log "step 3/4: first-update smoke, W&B disabled ($smoke_runs/$smoke_name)"
    terra_run "${TERRA_LAUNCH[@]}" "$TERRA_PYTHON" "$TERRA_REPO/train_mixed.py" \
        --config "$config" "$@" "${TERRA_RUNTIME_ARGS[@]}" --runs_dir "$smoke_runs" \
        --run_name "$smoke_name" --max_updates 1 --wandb_mode disabled \
        --compilation_cache_dir "$TERRA_COMPILATION_CACHE_DIR" || status=$?
    if ((status == TERRA_EXIT_STOPPED)); then
        terra_log "first-update smoke stopped by a signal"
        ((TERRA_REQUEUED)) || terra_requeue "stopped by a signal"
        return 0
    fi
    if ((status != 0)); then
        terra_log "first-update smoke failed: train_mixed.py exited $status"
        return 45
    fi
    if ! grep -Eq '^\{"update": 1[,}]' "$smoke_runs/$smoke_name/metrics.jsonl" 2>/dev/null; then
        terra_log "first-update smoke failed: train_mixed.py exited 0 but" \
            "$smoke_runs/$smoke_name/metrics.jsonl has no record of update 1"
        return 45
    fi
    terra_log "first-update smoke passed: update 1 logged"
}

# Newest complete checkpoint step of run directory $1 (orbax writes <step>/ when complete).
terra_latest_checkpoint() {
    local entry step latest=""
    for entry in "$1"/checkpoints/*/; do
        step=$(basename "$entry")
        [[ $step =~ ^[0-9]+$ ]] || continue
        if [[ -z $latest ]] || ((10#$step > 10#$latest)); then
            latest=$step
        fi
    done
    [[ -n $latest ]] && echo "$latest"
}

# terra_step_train CONFIG [TRAIN_FLAGS...]
terra_step_train() {
    local config=$1 status=0 step extra=()
    shift
    step=$(terra_latest_checkpoint "$TERRA_RUN_DIR") || step=""
    if [[ -n $step ]]; then
        read -r -a extra <<<"${TERRA_RESUME_ARGS:-}"
        terra_log "step 4/4: resuming $TERRA_RUN_DIR from checkpoint $step"
        terra_run "${TERRA_LAUNCH[@]}" "$TERRA_PYTHON" "$TERRA_REPO/train_mixed.py" \
            --resume "$TERRA_RUN_DIR" "${TERRA_RUNTIME_ARGS[@]}" \
            --compilation_cache_dir "$TERRA_COMPILATION_CACHE_DIR" "${extra[@]}" || status=$?
    else
        if [[ -e $TERRA_RUN_DIR/config.json ]]; then
            local aside
            aside="$TERRA_RUN_DIR.incomplete-$(date +%Y%m%d-%H%M%S)"
            terra_log "$TERRA_RUN_DIR has no checkpoint; moving it to $aside and starting anew"
            mv "$TERRA_RUN_DIR" "$aside" || return 1
        fi
        terra_log "step 4/4: training $TERRA_RUN_DIR"
        terra_run "${TERRA_LAUNCH[@]}" "$TERRA_PYTHON" "$TERRA_REPO/train_mixed.py" \
            --config "$config" "$@" "${TERRA_RUNTIME_ARGS[@]}" --runs_dir "$TERRA_RUNS_DIR" \
            --run_name "$TERRA_RUN_NAME" \
            --compilation_cache_dir "$TERRA_COMPILATION_CACHE_DIR" || status=$?
    fi
    if ((status == TERRA_EXIT_STOPPED)); then
        terra_log "train_mixed.py stopped on a signal with a checkpoint (exit $status)"
        ((TERRA_REQUEUED)) || terra_requeue "stopped by a signal"
        return 0
    fi
    if ((status == TERRA_EXIT_NOTHING_TO_DO)) && [[ -n $step ]]; then
        terra_log "$TERRA_RUN_DIR was already complete at checkpoint $step"
        return 0
    fi
    return "$status"
}

# The job's summary as one Markdown table row, for a team's own log of jobs
# (docs/OPERATIONS.md#what-a-job-does-and-its-exit-codes):
# terra_ledger_row STATUS STAGE CONFIG [TRAIN_FLAGS...]. The failure signature and whether
# W&B has real history are left to fill in by hand ("?").
terra_ledger_row() {
    local status=$1 stage=$2 wandb_id="none"
    shift 2
    if [[ -f ${TERRA_RUN_DIR:-}/wandb_run_id ]]; then
        wandb_id=$(<"$TERRA_RUN_DIR/wandb_run_id")
    fi
    terra_log "ledger row: | $(date '+%F') | ${SLURM_JOB_ID:-local} | $wandb_id |" \
        "$TERRA_GPU_SUMMARY | $* | ${TERRA_RUN_DIR:-} | exit $status at $stage | ? | ? |"
}

# terra_job CONFIG [TRAIN_FLAGS...]: the whole job; exits with the failing step's code.
terra_job() {
    local config=$1 status=0 stage
    shift
    trap terra_on_usr1 USR1
    trap terra_on_term TERM
    TERRA_RUN_NAME=${TERRA_RUN_NAME:-$config-${SLURM_JOB_ID:-local}}
    terra_setup || exit $?
    TERRA_RUN_DIR=$TERRA_RUNS_DIR/$TERRA_RUN_NAME
    terra_print_environment
    for stage in guard preflight smoke train; do
        case $stage in
            guard) terra_step_guard || status=$? ;;
            preflight) terra_step_preflight || status=$? ;;
            smoke) terra_step_smoke "$config" "$@" || status=$? ;;
            train) terra_step_train "$config" "$@" || status=$? ;;
        esac
        if ((TERRA_REQUEUED)); then
            terra_log "requeued during $stage; this run of the job ends here"
            terra_ledger_row "$status" "$stage (requeued)" "$config" "$@"
            exit 0
        fi
        if ((status != 0)); then
            terra_ledger_row "$status" "$stage" "$config" "$@"
            exit "$status"
        fi
    done
    terra_log "training finished: $TERRA_RUN_DIR"
    terra_ledger_row 0 end "$config" "$@"
}
