"""An update's metrics, reduced over the device axis: the minibatch optimisation
(`optimization_metrics`), the rollout's episodes, value fit and progress (`rollout_metrics`)
and the curriculum (`curriculum_metrics`). Float32 scalars, identical on every device."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from terra_rl.algo.device_axis import AXIS
from terra_rl.nets.loss_scaling import LossScale

NUM_AGE_BUCKETS = 4


def optimization_metrics(step_metrics: dict, loss_scale: LossScale) -> dict[str, jax.Array]:
    """Per-update means of the minibatch metrics ([epochs, minibatches] arrays), the
    gradient norms (already device-averaged gradients) over the finite steps only (NaN
    when every step overflowed; the host drops it), and the precision metrics."""
    finite = step_metrics.pop("finite")
    steps_finite = jnp.sum(finite)
    metrics = {}
    for name, value in step_metrics.items():
        if name.startswith("grad_norm"):
            total = jnp.sum(jnp.where(finite, value, 0.0))
            name = name if "/" in name else f"train/{name}"
            metrics[name] = jnp.where(steps_finite > 0, total / steps_finite, jnp.nan)
        else:
            metrics[f"train/{name}"] = jax.lax.pmean(jnp.mean(value), AXIS)
    metrics.update(
        {
            "precision/loss_scale": loss_scale.scale,
            "precision/overflow_steps": loss_scale.overflow_steps.astype(jnp.float32),
            "precision/skipped_update_fraction": 1.0 - jnp.mean(finite.astype(jnp.float32)),
        }
    )
    return metrics


def rollout_metrics(traj, episodes, done, returns, max_steps: int,
                    has_success: bool = True) -> dict[str, jax.Array]:
    """Rollout statistics over all devices. Ratios whose count is 0 come out NaN (nothing
    to report, e.g. no episode finished); the host drops them instead of logging 0. The
    task-done rate and the episode progress only for envs with a notion of success
    (`has_success`; gymnax envs have none and would log a constant 0)."""
    psum = lambda x: jax.lax.psum(jnp.sum(x), AXIS)  # noqa: E731
    steps = psum(jnp.ones_like(traj.reward))
    finished = psum(episodes["count"])
    nan_if_empty = lambda total, count: jnp.where(count > 0, total / count, jnp.nan)  # noqa: E731
    metrics = {
        "train/reward": psum(traj.reward) / steps,
        "train/done_rate": psum(done) / steps,
        "train/timeout_rate": psum(traj.truncated) / steps,
        "train/episodes_finished": finished,
        "train/episode_return": nan_if_empty(psum(episodes["return"]), finished),
        "train/episode_length": nan_if_empty(psum(episodes["length"]), finished),
    }
    if has_success:
        metrics["train/task_done_rate"] = psum(episodes["task_done"]) / steps
        metrics["train/mean_episode_progress"] = psum(traj.progress) / steps
        metrics["train/max_episode_progress"] = jax.lax.pmax(jnp.max(traj.progress), AXIS)
    errors = returns - traj.value
    overall = value_fit_metrics(errors, returns, jnp.ones_like(returns, bool), psum)
    metrics["train/explained_variance"] = overall["explained_variance"]
    metrics["train/rollout_value_loss"] = overall["value_loss"]
    bucket = jnp.minimum(traj.age * NUM_AGE_BUCKETS // max_steps, NUM_AGE_BUCKETS - 1)
    for b in range(NUM_AGE_BUCKETS):
        lo, hi = b * 100 // NUM_AGE_BUCKETS, (b + 1) * 100 // NUM_AGE_BUCKETS
        fit = value_fit_metrics(errors, returns, bucket == b, psum)
        metrics.update({f"value_by_age/{lo:02d}_{hi}pct/{k}": v for k, v in fit.items()})
    return metrics


def curriculum_metrics(env, env_state) -> dict[str, jax.Array]:
    """Share of envs (over all devices) at each curriculum level after the rollout, as
    `curriculum/<level name>`, and the mean level index; empty without a curriculum."""
    names = env.curriculum_level_names
    if not names:
        return {}
    level = env.curriculum_level(env_state)
    count = jax.lax.psum(jnp.float32(level.shape[0]), AXIS)
    shares = jax.lax.psum(jnp.sum(jax.nn.one_hot(level, len(names)), axis=0), AXIS) / count
    metrics = {f"curriculum/{name}": shares[i] for i, name in enumerate(names)}
    metrics["curriculum/mean_level"] = jax.lax.psum(jnp.sum(level), AXIS) / count
    return metrics


def value_fit_metrics(errors, returns, selected, psum) -> dict[str, jax.Array]:
    """Value loss (0.5 mean squared error of the rollout values against the GAE returns)
    and explained variance over the selected transitions, with their count."""
    weight = selected.astype(jnp.float32)
    count = psum(weight)
    safe = jnp.maximum(count, 1.0)
    mean_sq_error = psum(weight * errors**2) / safe
    error_variance = mean_sq_error - (psum(weight * errors) / safe) ** 2
    return_variance = psum(weight * returns**2) / safe - (psum(weight * returns) / safe) ** 2
    explained = 1.0 - error_variance / jnp.maximum(return_variance, 1e-8)
    return {
        "value_loss": jnp.where(count > 0, 0.5 * mean_sq_error, jnp.nan),
        "explained_variance": jnp.where(count > 1, explained, jnp.nan),
        "count": count,
    }
