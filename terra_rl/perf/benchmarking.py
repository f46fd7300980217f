"""Small timing helpers for benchmarks of jitted JAX code."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jaxlib


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall seconds of repeated calls of the same work."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return min(self.samples)


def time_once(call: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one `call()`, waiting until its device work is finished."""
    start = time.perf_counter()
    result = jax.block_until_ready(call())
    return time.perf_counter() - start, result


def time_repeated(call: Callable[[], Any], repeats: int) -> Timing:
    """Times `repeats` calls of `call()`; warm it up (compile) before calling this."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    return Timing(tuple(time_once(call)[0] for _ in range(repeats)))


def time_in_rounds(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Wall seconds of each call, `rounds` times, in rounds: every call once a round, in the
    dict's order. On a machine whose speed drifts over minutes, the calls then see the same
    drift, where timing one call's repeats after another's would give the drift to whichever
    came last. Warm the calls up (compile) first."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(time_once(call)[0])
    return samples


def runtime_info() -> dict[str, Any]:
    """Where a benchmark ran: date, versions, JAX backend and device, host CPUs."""
    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
    }


def _cpu_model() -> str | None:
    """The host CPU's model name (Linux), else whatever `platform` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
