# shellcheck shell=bash
# The environment every terra_rl job exports, derived from the virtualenv. Source it:
#
#     source scripts/euler/env.sh
#
# Inputs (all optional):
#   TERRA_VENV                   virtualenv (default: <repo>/.venv)
#   TERRA_RUNS_DIR               run directories (default: <repo>/runs)
#   TERRA_COMPILATION_CACHE_DIR  persistent XLA compilation cache
#                                (default: ${SCRATCH:-$HOME/.cache}/terra_rl/xla-cache)
#   TERRA_DISABLE_AUTOTUNE=1     append --xla_gpu_autotune_level=0 to XLA_FLAGS (the fallback
#                                for CUDNN_STATUS_INTERNAL_ERROR during cuDNN autotuning)
# Exports: TERRA_REPO, TERRA_VENV, TERRA_PYTHON, TERRA_RUNS_DIR, TERRA_COMPILATION_CACHE_DIR,
# JAX_COMPILATION_CACHE_DIR, VIRTUAL_ENV, PATH, PYTHONPATH, LD_LIBRARY_PATH (the pip CUDA
# wheels' nvidia/*/lib directories first), XLA_PYTHON_CLIENT_PREALLOCATE=false, XLA_FLAGS.
# Sourcing it twice adds nothing twice. Returns 1 (with a one-line error) without a venv.

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    echo "env.sh: error: source this file (source scripts/euler/env.sh), do not run it" >&2
    exit 2
fi

_terra_prepend_path() {  # _terra_prepend_path VAR DIR: put DIR first in VAR, once
    local current=":${!1:-}:"
    current=${current//:$2:/:}
    current=${current#:}
    current=${current%:}
    printf -v "$1" '%s' "$2${current:+:$current}"
}

_terra_env() {
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || return 1
    export TERRA_REPO=${TERRA_REPO:-$(cd "$here/../.." && pwd)}
    export TERRA_VENV=${TERRA_VENV:-$TERRA_REPO/.venv}
    if [[ ! -x $TERRA_VENV/bin/python ]]; then
        echo "env.sh: error: no virtualenv at $TERRA_VENV (bin/python missing); create it" \
            "with 'make venv' and pip install -e '.[cuda13]', or set TERRA_VENV" >&2
        return 1
    fi
    export TERRA_PYTHON=$TERRA_VENV/bin/python
    export VIRTUAL_ENV=$TERRA_VENV
    _terra_prepend_path PATH "$TERRA_VENV/bin"
    _terra_prepend_path PYTHONPATH "$TERRA_REPO"
    export PATH PYTHONPATH

    local restore_nullglob lib_dir lib_dirs=()
    restore_nullglob=$(shopt -p nullglob)
    shopt -s nullglob
    lib_dirs=("$TERRA_VENV"/lib/python3*/site-packages/nvidia/*/lib)
    eval "$restore_nullglob"
    if ((${#lib_dirs[@]} == 0)); then
        echo "env.sh: warning: no pip CUDA libraries under $TERRA_VENV/lib/python3*/site-packages/nvidia;" \
            "GPU jobs need pip install -e '.[cuda13]'" >&2
    fi
    for lib_dir in "${lib_dirs[@]}"; do
        _terra_prepend_path LD_LIBRARY_PATH "$lib_dir"
    done
    export LD_LIBRARY_PATH

    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    export TERRA_RUNS_DIR=${TERRA_RUNS_DIR:-$TERRA_REPO/runs}
    export TERRA_COMPILATION_CACHE_DIR=${TERRA_COMPILATION_CACHE_DIR:-${SCRATCH:-$HOME/.cache}/terra_rl/xla-cache}
    export JAX_COMPILATION_CACHE_DIR=$TERRA_COMPILATION_CACHE_DIR
    mkdir -p "$TERRA_COMPILATION_CACHE_DIR"
    if [[ ${TERRA_DISABLE_AUTOTUNE:-0} == 1 && " ${XLA_FLAGS:-} " != *" --xla_gpu_autotune_level="* ]]; then
        export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0"
    fi
}

if _terra_env; then
    unset -f _terra_env _terra_prepend_path
else
    unset -f _terra_env _terra_prepend_path
    return 1
fi
