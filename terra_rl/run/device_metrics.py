"""Device metrics to host floats: the update's and the eval's metrics are float32 scalars,
identical on every device (with several updates a dispatch, one row per update); the host
reads this process's first device and drops the optional metrics that had nothing to
measure."""

from __future__ import annotations

import math

import jax
import numpy as np

from terra_rl.run import distributed

# Metrics that are NaN when there was nothing to measure (no episode finished, an empty
# age bucket): dropped from the logs rather than logged as a fake 0 or as null.
OPTIONAL_METRIC_MARKERS = (
    "episode_return",
    "episode_length",
    "avg_positive_episode_length",
    "value_by_age/",
    "explained_variance",
    "grad_norm",  # every minibatch step of the update overflowed: counted, not a norm
    "completion_rate/",  # an episode group with no eval env
    "steps_to_completion",
)


def host_metrics(device_metrics: dict) -> dict[str, float]:
    """Device metrics (identical on every device) -> floats, without the optional ones
    that had nothing to measure. Reads this process's first device only, so it needs no
    collective when the arrays span several processes."""
    return metrics_row(fetch_metrics(device_metrics), 0)


def fetch_metrics(device_metrics: dict) -> dict[str, np.ndarray]:
    """This process's first shard of every metric, on the host: one transfer."""
    return jax.device_get({name: distributed.first_local_row(value)
                           for name, value in device_metrics.items()})


def metrics_row(host: dict[str, np.ndarray], row: int) -> dict[str, float]:
    """Update `row`'s floats from `fetch_metrics` of one or several updates' metrics
    (`Trainer.run_updates`), without the optional ones that had nothing to measure."""
    out = {}
    for name, value in host.items():
        # A scalar per device and update: the shard flattens to its updates.
        value = float(np.asarray(value).reshape(-1)[row])
        if math.isnan(value) and any(marker in name for marker in OPTIONAL_METRIC_MARKERS):
            continue
        out[name] = value
    return out
