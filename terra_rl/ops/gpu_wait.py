"""Wait until a GPU has enough free memory, then run a command (`scripts/euler/wait_for_gpu.py`).

    wait_for_gpu.py --min-free MB [--gpu INDEX] [--sleep S] [--timeout S]
                    [--fallback-arg ARG ...] -- COMMAND ...

Free memory comes from `nvidia-smi --query-gpu=index,memory.free`. Without `--gpu` every GPU
nvidia-smi lists must have `--min-free` MB free; with it, that GPU only, and the command runs
with `CUDA_VISIBLE_DEVICES=INDEX` (and `CUDA_DEVICE_ORDER=PCI_BUS_ID`, the order nvidia-smi
numbers GPUs in). On timeout the command runs with the fallback arguments appended (e.g. a
smaller `--num_envs_per_device`), or the wrapper exits 124 when there are none. The command
replaces this process, so its exit code (and signals) are the wrapper's. Imports no JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from terra_rl import env_vars
from terra_rl.cli.parser import OneLineErrorParser

PROG = "wait_for_gpu.py"
EXIT_USAGE = 2
EXIT_QUERY_FAILED = 3
EXIT_TIMEOUT = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
QUERY = ("--query-gpu=index,memory.free", "--format=csv,noheader,nounits")


class GpuQueryError(RuntimeError):
    """nvidia-smi is missing, failed, or printed something unparsable; one-line message."""


def parse_free_memory(text: str) -> dict[int, int]:
    """`nvidia-smi --query-gpu=index,memory.free --format=csv,noheader,nounits` output ->
    {gpu index: free MiB}."""
    free = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split(",")]
        try:
            index, megabytes = int(parts[0]), int(float(parts[1]))
        except (IndexError, ValueError):
            raise GpuQueryError(f"cannot parse nvidia-smi line {line.strip()!r}") from None
        free[index] = megabytes
    if not free:
        raise GpuQueryError("nvidia-smi listed no GPUs")
    return free


def query_free_memory(nvidia_smi: str = "nvidia-smi") -> dict[int, int]:
    """Free MiB per GPU index, from nvidia-smi."""
    try:
        result = subprocess.run([nvidia_smi, *QUERY], capture_output=True, text=True,
                                timeout=60, check=False)
    except FileNotFoundError:
        raise GpuQueryError(f"{nvidia_smi} not found on PATH (no GPU driver here?)") from None
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"{nvidia_smi} did not answer within 60 s") from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise GpuQueryError(f"{nvidia_smi} failed (exit {result.returncode}): "
                            f"{message[0] if message else 'no output'}")
    return parse_free_memory(result.stdout)


def select_free(free: dict[int, int], gpu: int | None) -> dict[int, int]:
    """The GPUs that must have room: `gpu` alone, or all of them."""
    if gpu is None:
        return free
    if gpu not in free:
        raise GpuQueryError(f"--gpu {gpu} is not present; nvidia-smi lists GPUs {sorted(free)}")
    return {gpu: free[gpu]}


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def describe(free: dict[int, int]) -> str:
    return ", ".join(f"GPU {index}: {mb} MB free" for index, mb in sorted(free.items()))


def wait_for_free_memory(
    min_free_mb: int,
    gpu: int | None = None,
    sleep_s: float = 30.0,
    timeout_s: float | None = None,
    *,
    query: Callable[[], dict[int, int]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    report: Callable[[str], None] = print,
) -> bool:
    """Poll until the selected GPUs have `min_free_mb` free (True) or `timeout_s` has passed
    (False; None waits forever). Reports progress once per poll. `query` defaults to
    `query_free_memory`. Raises GpuQueryError."""
    query = query or query_free_memory
    start = clock()
    while True:
        selected = select_free(query(), gpu)
        elapsed = clock() - start
        if all(mb >= min_free_mb for mb in selected.values()):
            report(f"{PROG}: {describe(selected)} (>= {min_free_mb} MB) after "
                   f"{_seconds(elapsed)}")
            return True
        if timeout_s is not None and elapsed >= timeout_s:
            report(f"{PROG}: timed out after {_seconds(elapsed)}: {describe(selected)}, "
                   f"need {min_free_mb} MB")
            return False
        limit = "" if timeout_s is None else f" of {_seconds(timeout_s)}"
        report(f"{PROG}: waiting: {describe(selected)}, need {min_free_mb} MB "
               f"({_seconds(elapsed)}{limit} elapsed)")
        sleep(sleep_s if timeout_s is None else max(0.0, min(sleep_s, timeout_s - elapsed)))


@dataclasses.dataclass(frozen=True)
class WaitArgs:
    min_free: int
    gpu: int | None
    sleep: float
    timeout: float | None
    fallback_args: tuple[str, ...]
    command: tuple[str, ...]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog=PROG,
        usage=f"{PROG} --min-free MB [--gpu INDEX] [--sleep S] [--timeout S] "
        "[--fallback-arg ARG ...] -- COMMAND ...",
        description="Wait until a GPU has --min-free MB free (nvidia-smi), then run COMMAND.",
        epilog="exit codes: COMMAND's own; 2 bad arguments; 3 nvidia-smi missing, failed or "
        f"unparsable; {EXIT_TIMEOUT} timed out without --fallback-arg; 126/127 COMMAND not "
        "executable/found. Example: wait_for_gpu.py --min-free 20000 --gpu 1 --timeout 3600 "
        "--fallback-arg --num_envs_per_device --fallback-arg 256 -- python train_mixed.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--min-free", type=int, required=True, metavar="MB",
                        help="free memory (MiB, as nvidia-smi reports) the GPU must have")
    parser.add_argument("--gpu", type=int, default=None, metavar="INDEX",
                        help="nvidia-smi index of the GPU to wait for; the command then sees "
                        "only it (CUDA_VISIBLE_DEVICES). Default: every GPU must have room")
    parser.add_argument("--sleep", type=float, default=30.0, metavar="S",
                        help="seconds between polls (default: 30)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up waiting after S seconds (default: wait forever)")
    parser.add_argument("--fallback-arg", action="append", default=[], metavar="ARG",
                        dest="fallback_args",
                        help="appended to COMMAND when the wait times out; repeat for "
                        "several (values may start with --)")
    return parser


def parse_args(argv: Sequence[str]) -> WaitArgs:
    """Split at the first `--`; `--fallback-arg X` takes X verbatim, even `--flag`."""
    parser = build_parser()
    argv = list(argv)
    if "--" not in argv:
        if any(arg in ("-h", "--help") for arg in argv):
            parser.parse_args(["--help"])
        parser.error("give the command after --, e.g. -- python train_mixed.py")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    joined, i = [], 0
    while i < len(options):
        if options[i] == "--fallback-arg" and i + 1 < len(options):
            joined.append(f"--fallback-arg={options[i + 1]}")
            i += 2
        else:
            joined.append(options[i])
            i += 1
    args = parser.parse_args(joined)
    if not command:
        parser.error("no command after --")
    if args.min_free < 0:
        parser.error(f"--min-free must be >= 0 MB, got {args.min_free}")
    if args.sleep <= 0:
        parser.error(f"--sleep must be > 0 seconds, got {args.sleep:g}")
    if args.timeout is not None and args.timeout < 0:
        parser.error(f"--timeout must be >= 0 seconds, got {args.timeout:g}")
    if args.gpu is not None and args.gpu < 0:
        parser.error(f"--gpu must be a GPU index >= 0, got {args.gpu}")
    return WaitArgs(args.min_free, args.gpu, args.sleep, args.timeout,
                    tuple(args.fallback_args), tuple(command))


def command_environment(gpu: int | None, base: dict[str, str] | None = None) -> dict[str, str]:
    env = env_vars.process_environment() if base is None else dict(base)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def _report(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None, *, exec_fn=os.execvpe) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        ready = wait_for_free_memory(args.min_free, args.gpu, args.sleep, args.timeout,
                                     report=_report)
    except GpuQueryError as error:
        _report(f"{PROG}: error: {error}")
        return EXIT_QUERY_FAILED
    command = list(args.command)
    if not ready:
        if not args.fallback_args:
            _report(f"{PROG}: error: no GPU memory within --timeout and no --fallback-arg; "
                    "not running the command")
            return EXIT_TIMEOUT
        command += args.fallback_args
        _report(f"{PROG}: running with fallback arguments {' '.join(args.fallback_args)}")
    env = command_environment(args.gpu)
    pinned = f" (CUDA_VISIBLE_DEVICES={args.gpu})" if args.gpu is not None else ""
    _report(f"{PROG}: exec {shlex.join(command)}{pinned}")
    try:
        exec_fn(command[0], command, env)
    except FileNotFoundError:
        _report(f"{PROG}: error: command not found: {command[0]}")
        return EXIT_NOT_FOUND
    except PermissionError:
        _report(f"{PROG}: error: command not executable: {command[0]}")
        return EXIT_NOT_EXECUTABLE
    return 0  # only reached with a test's exec_fn
