"""`scripts/validation/validate_gates.py`: run validation gates by name, print one line per
case as it finishes and a summary, optionally write JSON; exit 1 if any case fails, 2 on
bad arguments.

Importing this module imports no JAX: `--jax-platforms` is applied before JAX loads.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from terra_rl import env_vars
from terra_rl.cli.parser import OneLineErrorParser

PROG = "validate_gates.py"
CACHE_ENV_VAR = env_vars.TEST_CACHE


def default_cache_dir() -> str:
    """The pytest suite's cache (tests/conftest.py), so gates after pytest reuse its compiles."""
    return env_vars.get(CACHE_ENV_VAR) or str(Path.home() / ".cache/terra_rl/jax-test-cache")


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(
        prog=PROG,
        description="CPU validation gates to run before a launch (docs/VALIDATION.md).",
    )
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="NAME",
        help="a case to run (repeatable), or 'all'",
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument(
        "--jax-platforms",
        metavar="PLATFORMS",
        help="set JAX_PLATFORMS before JAX loads, e.g. 'cpu'",
    )
    parser.add_argument(
        "--disable-jit",
        action="store_true",
        help="run the cases that allow it under jax.disable_jit() (slow)",
    )
    parser.add_argument(
        "--dataset-path",
        metavar="DIR",
        help="map dataset for env-action-mask (default: DATASET_PATH, else generated maps)",
    )
    parser.add_argument(
        "--dataset-size",
        type=int,
        metavar="K",
        help="use the first K maps of the dataset (default: DATASET_SIZE, else all)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--compilation-cache-dir",
        metavar="DIR",
        default=None,
        help=f"persistent XLA cache (default: ${CACHE_ENV_VAR}, else "
        "~/.cache/terra_rl/jax-test-cache, shared with pytest); '' disables it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.case and not args.list:
        parser.error("give --case NAME (repeatable), --case all or --list")
    if args.jax_platforms:
        env_vars.set_value("JAX_PLATFORMS", args.jax_platforms)

    from envs.dataset import DatasetError
    from envs.params import dataset_from_environment
    from terra_rl.validation.gate import GateOptions, run_gate
    from terra_rl.validation.registry import GATES, select_gates

    if args.list:
        width = max(len(gate.name) for gate in GATES)
        for gate in GATES:
            jit_only = "" if gate.supports_disable_jit else "  [always jitted]"
            print(f"{gate.name:<{width}}  {gate.description}{jit_only}")
        return 0
    try:
        gates = select_gates(args.case)
        env_path, env_size = dataset_from_environment()
    except (ValueError, DatasetError) as error:
        parser.error(str(error))
    dataset_path = args.dataset_path or env_path
    if args.dataset_size is not None and not dataset_path:
        parser.error("--dataset-size needs --dataset-path (or DATASET_PATH)")
    # As in training, DATASET_SIZE without a dataset is ignored.
    dataset_size = args.dataset_size if args.dataset_size is not None else env_size
    if not dataset_path:
        dataset_size = None
    if dataset_size is not None and dataset_size < 1:
        parser.error(f"--dataset-size must be >= 1, got {dataset_size}")

    import jax

    cache_dir = (
        default_cache_dir() if args.compilation_cache_dir is None else (args.compilation_cache_dir)
    )
    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(cache_dir))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    options = GateOptions(
        dataset_path=dataset_path, dataset_size=dataset_size, disable_jit=args.disable_jit
    )

    width = max(len(gate.name) for gate in gates)
    start = time.perf_counter()
    results = []
    for gate in gates:
        result = run_gate(gate, options)
        print(result.line(width), flush=True)
        results.append(result)
    seconds = time.perf_counter() - start
    failed = [result.name for result in results if not result.passed]
    backend = f"{jax.default_backend()}, jax {jax.__version__}"
    summary = f"{len(results) - len(failed)} passed, {len(failed)} failed in {seconds:.1f}s"
    print(
        f"{summary} ({backend})" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True
    )
    if args.json:
        report = {
            "cases": [result.to_dict() for result in results],
            "passed": len(results) - len(failed),
            "failed": len(failed),
            "seconds": round(seconds, 3),
            "backend": jax.default_backend(),
            "jax_version": jax.__version__,
            "options": {
                "dataset_path": dataset_path,
                "dataset_size": dataset_size,
                "disable_jit": args.disable_jit,
                "compilation_cache_dir": cache_dir,
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0
