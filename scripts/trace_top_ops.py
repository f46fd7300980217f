"""The ops that take a `jax.profiler` trace's device time, named by the source line that made them.

    .venv/bin/python scripts/profile_rollout_components.py --config cpu_demo --trace trace
    .venv/bin/python scripts/trace_top_ops.py trace --updates 3 --top 25

Reads the newest `*.trace.json.gz` under TRACE_DIR and, when the profiler wrote one,
`update.hlo.txt` (the compiled update's HLO, beside the trace). Each device op event (an event
with an `hlo_op` argument: a GPU kernel, or an XLA:CPU thunk) is charged to its HLO op. The HLO
text maps each op to its JAX name stack (`op_name`) and the innermost source line.

Prints three tables: device time by source file, by source line, and the top ops, each in ms per
update and as a share of all device op time; and the device's busy share of the traced span
(the union of its op intervals over the span from the first to the last op: far below 100% on
a GPU means the device waits on launches or the host). `--json PATH` writes the same as one
object. Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PROG = "trace_top_ops.py"

_OP_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?metadata=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_SCOPE_NOISE = re.compile(r"(^|/)(jit\(_fun\)|pmap\([^)]*\)|jit\(main\)|while/body|while/cond|"
                          r"closed_call|cond/branch_\d+_fun|checkpoint|remat)(?=/|$)")


@dataclass(frozen=True)
class OpSource:
    """Where one HLO op came from: its JAX name stack and innermost source line."""

    op_name: str
    location: str  # "path/file.py:123 (function)" or "" when the HLO has no stack frames


def _tables(lines: list[str]) -> dict[str, dict[int, str]]:
    """The HLO text's FileNames, FunctionNames, FileLocations and StackFrames tables."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in lines:
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
            continue
        row = _TABLE_ROW.match(line) if current is not None else None
        if row is None:
            current = None
            continue
        current[int(row.group(1))] = row.group(2).strip().strip('"')
    return tables


def _short_path(path: str) -> str:
    """A source path from the repo's own folders on ('envs/x.py'), else its last two parts."""
    parts = Path(path).parts
    for root in ("envs", "terra_rl", "scripts", "tests"):
        if root in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(root) - 1:])
    return "/".join(parts[-2:])


def _frame_locations(tables: dict[str, dict[int, str]]) -> dict[int, str]:
    """stack_frame_id -> "file:line (function)" of that frame's own location."""
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations = {}
    for location_id, text in tables.get("FileLocations", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", text))
        file_name = _short_path(files.get(int(fields.get("file_name_id", 0)), "?"))
        function = functions.get(int(fields.get("function_name_id", 0)), "?")
        locations[location_id] = f"{file_name}:{fields.get('line', '?')} ({function})"
    frames = {}
    for frame_id, text in tables.get("StackFrames", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", text))
        frames[frame_id] = locations.get(int(fields.get("file_location_id", 0)), "")
    return frames


def parse_hlo_sources(text: str) -> dict[str, OpSource]:
    """HLO op name -> OpSource, from a compiled module's `as_text()`."""
    lines = text.splitlines()
    frames = _frame_locations(_tables(lines))
    sources = {}
    for line in lines:
        match = _OP_LINE.match(line)
        if match is None:
            continue
        op, metadata = match.groups()
        op_name = _OP_NAME.search(metadata)
        frame = _FRAME_ID.search(metadata)
        sources[op] = OpSource(
            op_name=short_scope(op_name.group(1)) if op_name else "",
            location=frames.get(int(frame.group(1)), "") if frame else "")
    return sources


def short_scope(op_name: str) -> str:
    """A JAX name stack without the wrappers every op shares (jit(_fun), while/body, ...)."""
    return _SCOPE_NOISE.sub("", op_name).strip("/")


def load_trace_events(trace_dir: Path, module: str = "") -> list[dict]:
    """The newest trace's complete events that ran an HLO op (of `module` when any did)."""
    traces = sorted(trace_dir.rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}: pass the --trace "
                                "folder of profile_rollout_components.py")
    with gzip.open(traces[-1], "rt") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})
           and not e.get("name", "").startswith("end: ")]
    of_module = [e for e in ops if e["args"].get("hlo_module") == module]
    return of_module or ops


def hlo_module_name(text: str) -> str:
    """The module name on the HLO text's first line ('HloModule jit__fun, ...')."""
    match = re.match(r"HloModule ([\w.\-]+)", text)
    return match.group(1) if match else ""


def busy_share(events: list[dict]) -> float:
    """Union of the op intervals over the span from the first op's start to the last op's end."""
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in events)
    if not intervals:
        return 0.0
    busy, start, end = 0.0, *intervals[0]
    for lo, hi in intervals[1:]:
        if lo > end:
            busy += end - start
            start, end = lo, hi
        else:
            end = max(end, hi)
    busy += end - start
    span = max(hi for _, hi in intervals) - intervals[0][0]
    return busy / span if span > 0 else 1.0


def summarise(events: list[dict], sources: dict[str, OpSource], updates: int, top: int) -> dict:
    """Device time per update by file, by source line and by op (ms), each sorted, top `top`."""
    by_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for event in events:
        entry = by_op[event["args"]["hlo_op"]]
        entry[0] += event["dur"] / 1e3 / updates
        entry[1] += 1
    total = sum(ms for ms, _ in by_op.values())
    by_line: dict[str, float] = collections.Counter()
    by_file: dict[str, float] = collections.Counter()
    for op, (ms, _) in by_op.items():
        location = sources.get(op, OpSource("", "")).location or "(no source line)"
        by_line[location] += ms
        by_file[location.split(":")[0]] += ms

    def rows(counter):
        return [{"name": name, "ms_per_update": ms, "share": ms / total if total else 0.0}
                for name, ms in sorted(counter.items(), key=lambda kv: -kv[1])[:top]]

    ops = []
    for op, (ms, count) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        source = sources.get(op, OpSource("", ""))
        ops.append({"hlo_op": op, "ms_per_update": ms, "share": ms / total if total else 0.0,
                    "calls_per_update": count / updates, "op_name": source.op_name,
                    "location": source.location})
    return {"updates": updates, "device_op_ms_per_update": total,
            "busy_share": busy_share(events), "by_file": rows(by_file),
            "by_line": rows(by_line), "ops": ops}


def _tail(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[3 - width:]


def format_report(summary: dict) -> str:
    lines = [f"device op time {summary['device_op_ms_per_update']:.2f} ms per update over "
             f"{summary['updates']} update(s); device busy {summary['busy_share']:.1%} of the "
             "traced span"]
    for title, key in (("by source file", "by_file"), ("by source line", "by_line")):
        lines += ["", f"{title:<60}  ms/upd  share"]
        lines += [f"{_tail(row['name'], 60):<60} {row['ms_per_update']:7.2f} {row['share']:6.1%}"
                  for row in summary[key]]
    lines += ["", f"{'top ops':<34} ms/upd  share  calls  name stack / source line"]
    for row in summary["ops"]:
        lines.append(f"{row['hlo_op'][:34]:<34} {row['ms_per_update']:6.2f} {row['share']:6.1%} "
                     f"{row['calls_per_update']:6.0f}  {_tail(row['op_name'], 70)}")
        if row["location"]:
            lines.append(f"{'':>56}{row['location']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir", type=Path, help="the --trace folder of the profiler")
    parser.add_argument("--hlo", type=Path, default=None,
                        help="compiled HLO text (default: TRACE_DIR/update.hlo.txt if present)")
    parser.add_argument("--updates", type=int, default=3,
                        help="updates the trace covers; times are per update (default: 3)")
    parser.add_argument("--top", type=int, default=20, help="rows per table (default: 20)")
    parser.add_argument("--json", type=Path, default=None, help="also write the tables here")
    args = parser.parse_args(argv)
    if args.updates < 1 or args.top < 1:
        parser.error("--updates and --top must be >= 1")
    if not args.trace_dir.is_dir():
        parser.error(f"{args.trace_dir} is not a folder: pass the profiler's --trace folder")
    hlo = args.hlo or args.trace_dir / "update.hlo.txt"
    if args.hlo is not None and not hlo.is_file():
        parser.error(f"--hlo {hlo} does not exist")
    hlo_text = hlo.read_text() if hlo.is_file() else ""
    try:
        events = load_trace_events(args.trace_dir, hlo_module_name(hlo_text))
    except (FileNotFoundError, OSError, json.JSONDecodeError, KeyError) as error:
        parser.error(str(error))
    if not events:
        parser.error(f"the trace under {args.trace_dir} has no device op events")
    sources = parse_hlo_sources(hlo_text)
    summary = summarise(events, sources, args.updates, args.top)
    print(format_report(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
