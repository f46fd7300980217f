"""`scripts/trace_top_ops.py` on a hand-written trace and HLO text: the op-to-source mapping,
the per-update sums and the device's busy share are checked against numbers worked out by
hand. (The profiler's real trace is read in tests/test_profiling.py.)"""

from __future__ import annotations

import gzip
import json

import pytest
from test_trainer import load_script

HLO = """HloModule jit__fun, is_scheduled=true

FileNames
1 "/work/repo/envs/env.py"
2 "/work/repo/terra_rl/nets/models.py"

FunctionNames
1 "ExcavationEnv.step"
2 "Policy.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=9}
2 {file_name_id=2 function_name_id=2 line=42 end_line=42 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}

ENTRY %main (p: f32[4]) -> f32[4] {
  %fusion.1 = f32[4]{0} fusion(%p), kind=kLoop, metadata={op_name="{STEP}" stack_frame_id=1}
  %dot.2 = f32[4]{0} dot(%p, %p), metadata={op_name="{DENSE}" stack_frame_id=2}
  ROOT %copy.3 = f32[4]{0} copy(%dot.2), metadata={op_name="copy"}
}
""".replace("{STEP}", "jit(_fun)/while/body/closed_call/BatchEnv.step/add").replace(
    "{DENSE}", "jit(_fun)/while/body/Policy/Dense_0/dot_general")


TOP_OPS = load_script("trace_top_ops")


def op_event(op: str, ts: float, dur: float, module: str = "jit__fun") -> dict:
    return {"ph": "X", "pid": 1, "tid": 1, "ts": ts, "dur": dur, "name": op,
            "args": {"hlo_op": op, "hlo_module": module}}


@pytest.fixture
def trace_dir(tmp_path):
    events = [
        op_event("fusion.1", 0, 1000), op_event("dot.2", 500, 1000),  # overlap: busy 0-1500
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 9000, "name": "ThunkExecutor::Execute"},
        op_event("fusion.1", 2000, 1000), op_event("dot.2", 3500, 2000),
        {"ph": "X", "pid": 1, "tid": 1, "ts": 3400, "dur": 1, "name": "end: dot.2",
         "args": {"hlo_op": "dot.2"}},
        op_event("copy.3", 6000, 500), op_event("fusion.9", 7000, 50000, module="jit_other"),
    ]
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "host.trace.json.gz", "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    (tmp_path / "update.hlo.txt").write_text(HLO)
    return tmp_path


def test_ops_are_named_by_their_source_line_and_summed_per_update(trace_dir):
    script = TOP_OPS
    sources = script.parse_hlo_sources(HLO)
    assert sources["fusion.1"].location == "envs/env.py:10 (ExcavationEnv.step)"
    assert sources["fusion.1"].op_name == "BatchEnv.step/add"
    assert sources["dot.2"].location == "terra_rl/nets/models.py:42 (Policy.__call__)"
    assert sources["copy.3"] == script.OpSource("copy", "")
    events = script.load_trace_events(trace_dir, script.hlo_module_name(HLO))
    assert sorted(e["args"]["hlo_op"] for e in events) == [
        "copy.3", "dot.2", "dot.2", "fusion.1", "fusion.1"]  # no other module, no "end:"
    summary = script.summarise(events, sources, updates=2, top=10)
    # ops: dot 3000 us, fusion 2000, copy 500 -> over 2 updates 1.5, 1.0 and 0.25 ms
    assert [(r["hlo_op"], r["ms_per_update"], r["calls_per_update"]) for r in summary["ops"]] \
        == [("dot.2", 1.5, 1.0), ("fusion.1", 1.0, 1.0), ("copy.3", 0.25, 0.5)]
    assert summary["device_op_ms_per_update"] == pytest.approx(2.75)
    assert [(r["name"], r["ms_per_update"]) for r in summary["by_file"]] == [
        ("terra_rl/nets/models.py", 1.5), ("envs/env.py", 1.0), ("(no source line)", 0.25)]
    assert summary["ops"][0]["share"] == pytest.approx(1.5 / 2.75)
    # busy 0-1500, 2000-3000, 3500-5500, 6000-6500 = 5000 us of a 6500 us span
    assert summary["busy_share"] == pytest.approx(5000 / 6500)


def test_cli_prints_the_tables_and_writes_json(trace_dir, capsys, tmp_path):
    out = tmp_path / "top.json"
    assert TOP_OPS.main([str(trace_dir), "--updates", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "terra_rl/nets/models.py:42 (Policy.__call__)" in printed
    assert json.loads(out.read_text())["ops"][0]["hlo_op"] == "dot.2"


@pytest.mark.parametrize("argv, message", [
    (["{missing}"], "is not a folder"),
    (["{empty}"], "no *.trace.json.gz under"),
    (["{trace}", "--updates", "0"], "--updates and --top must be >= 1"),
    (["{trace}", "--hlo", "{missing}"], "does not exist"),
])
def test_bad_input_exits_2_with_one_line(trace_dir, tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "trace": trace_dir}
    with pytest.raises(SystemExit) as error:
        TOP_OPS.main([arg.format(**paths) for arg in argv])
    assert error.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
