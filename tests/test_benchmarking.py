"""`terra_rl.perf.benchmarking`: timing helpers of the benchmark scripts and the profiler. No
figure is asserted, only which calls were timed, in which order."""

from __future__ import annotations

import pytest

from terra_rl.perf.benchmarking import time_in_rounds, time_repeated


def test_time_in_rounds_times_every_call_once_a_round_in_order():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("env", "forward", "update")}
    samples = time_in_rounds(calls, 3)
    assert order == ["env", "forward", "update"] * 3
    assert list(samples) == ["env", "forward", "update"]
    assert all(len(times) == 3 and all(t >= 0 for t in times) for times in samples.values())


def test_timing_helpers_refuse_zero_rounds():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        time_in_rounds({"a": lambda: None}, 0)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        time_repeated(lambda: None, 0)
