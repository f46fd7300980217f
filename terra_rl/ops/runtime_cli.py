"""Command line of the runtime preflight, `scripts/euler/check_jax_runtime.py`.

Flags are parsed before JAX is imported, so `--platform cpu` can set `JAX_PLATFORMS` first;
the checks themselves are `terra_rl.ops.runtime`.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from terra_rl import env_vars
from terra_rl.choices import PRECISIONS
from terra_rl.cli.parser import OneLineErrorParser
from terra_rl.ops.preflight_types import EXIT_OK, PLATFORMS, Check, PreflightOptions
from terra_rl.ops.runtime import CHECKS, format_result, run_preflight, write_json_report

PROG = "check_jax_runtime.py"
EXIT_USAGE = 2
EXIT_REPORT_UNWRITABLE = 3


def exit_code_table(checks: Sequence[Check] = CHECKS) -> str:
    rows = [f"  {EXIT_OK:>3}  every check passed or was skipped",
            f"  {EXIT_USAGE:>3}  bad command line",
            f"  {EXIT_REPORT_UNWRITABLE:>3}  checks passed but the --json report could not be "
            "written"]
    rows += [f"  {c.exit_code:>3}  {c.name}: {c.summary}" for c in checks]
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog=PROG,
        description="Prove the JAX/CUDA runtime before an expensive job: CUDA libraries, "
        "devices, a conv backward pass on every device, a pmap all-reduce, optionally one "
        "trainer update. Each check prints PASS/FAIL/SKIP with its time and detail.",
        epilog="exit codes (the first failing check decides):\n" + exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--platform", choices=PLATFORMS, default="gpu",
                        help="expected JAX backend (default: gpu); cpu sets JAX_PLATFORMS=cpu")
    parser.add_argument("--min-devices", type=int, default=1, metavar="N",
                        help="fail unless at least N devices are visible (default: 1)")
    parser.add_argument("--expect-gpu-regex", default="", metavar="RE",
                        help="fail unless every device kind matches RE, e.g. "
                        "'RTX (3090|4090)|H100|H200'")
    parser.add_argument("--precision", default="", metavar="DTYPE",
                        help="compute dtype of the conv and train checks: float32, bfloat16 "
                        "or float16 (default: bfloat16 on gpu, float32 on cpu)")
    parser.add_argument("--train-smoke", action="store_true",
                        help="also run one real trainer update at a small shape (compiles "
                        "an update: tens of seconds)")
    parser.add_argument("--site-packages", default="", metavar="DIR",
                        help="look for nvidia/*/lib under DIR instead of this interpreter's "
                        "site-packages; the CUDA library check then runs on cpu too")
    parser.add_argument("--json", default="", metavar="PATH",
                        help="also write the report as JSON to PATH")
    return parser


def parse_options(argv: Sequence[str]) -> tuple[PreflightOptions, str]:
    """(options, json path). Bad values exit with code 2 and one line on stderr."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.min_devices < 1:
        parser.error(f"--min-devices must be >= 1, got {args.min_devices}")
    try:
        re.compile(args.expect_gpu_regex)
    except re.error as error:
        parser.error(f"--expect-gpu-regex {args.expect_gpu_regex!r} is not a regex: {error}")
    if args.precision and args.precision not in PRECISIONS:
        parser.error(f"--precision must be one of {list(PRECISIONS)}, got {args.precision!r}")
    if args.site_packages and not Path(args.site_packages).is_dir():
        parser.error(f"--site-packages {args.site_packages} is not a directory")
    options = PreflightOptions(
        platform=args.platform,
        min_devices=args.min_devices,
        expect_gpu_regex=args.expect_gpu_regex,
        precision=args.precision,
        train_smoke=args.train_smoke,
        site_packages=args.site_packages,
    )
    return options, args.json


def main(argv: Sequence[str] | None = None) -> int:
    options, json_path = parse_options(sys.argv[1:] if argv is None else argv)
    if options.platform == "cpu":
        # JAX reads JAX_PLATFORMS when it is imported; nothing above imported it (an
        # in-process caller may have: then the config update applies, if no backend is up).
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", "cpu")
        env_vars.set_value("JAX_PLATFORMS", "cpu")
    import jax
    print(f"JAX runtime preflight: jax {jax.__version__}, {sys.executable}, host "
          f"{socket.gethostname()}, expecting {options.platform} x>={options.min_devices}",
          flush=True)
    report = run_preflight(options, report=lambda r: print(format_result(r), flush=True))
    exit_code = report.exit_code
    if json_path:
        try:
            write_json_report(json_path, report)
        except OSError as error:
            print(f"{PROG}: error: cannot write --json {json_path}: {error}",
                  file=sys.stderr)
            exit_code = exit_code or EXIT_REPORT_UNWRITABLE
    print(report.verdict, flush=True)
    return exit_code
