"""The runtime preflight's checks, each a function of (`PreflightOptions`, `PreflightState`)
that returns its PASS detail or raises `SkipCheck` / `CheckFailed` (`terra_rl.ops.runtime`
registers and runs them). JAX is imported inside the functions, never at module import, so a
command line can set `JAX_PLATFORMS` first."""

from __future__ import annotations

import collections
import contextlib
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from terra_rl import env_vars
from terra_rl.ops.cuda_libs import CUDA_WHEEL_LIBS, library_dir, nvidia_package_dirs
from terra_rl.ops.preflight_types import (
    CheckFailed,
    PreflightOptions,
    PreflightState,
    SkipCheck,
    first_line,
)

# ------------------------------------------------------------------ cuda_libs


def check_cuda_libs(options: PreflightOptions, state: PreflightState) -> str:
    if options.platform == "cpu" and not options.site_packages:
        raise SkipCheck("platform cpu: CUDA libraries not needed")
    roots = [p.parent for p in nvidia_package_dirs(options.site_packages)]
    if not roots:
        raise CheckFailed(
            f"no pip CUDA wheels (no 'nvidia' package) for {sys.executable}; "
            "install them with pip install -e '.[cuda13]'"
        )
    ld_path = (env_vars.get("LD_LIBRARY_PATH") or "") if options.ld_library_path is None \
        else options.ld_library_path
    on_path = {os.path.realpath(entry) for entry in ld_path.split(":") if entry}
    missing, empty, not_on_path, found = [], [], [], []
    for name, relative, pattern in CUDA_WHEEL_LIBS:
        directory = library_dir(roots, relative, pattern)
        if directory is None:
            missing.append(f"{name} ({roots[0] / relative})")
        elif not any(directory.glob(pattern)):
            empty.append(f"{name} (no {pattern} in {directory})")
        elif os.path.realpath(directory) not in on_path:
            not_on_path.append(f"{name} ({directory})")
        else:
            found.append(f"{name} ({directory.relative_to(directory.parents[2])})")
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)}; reinstall with pip install -e '.[cuda13]'")
    if empty:
        problems.append(f"empty: {', '.join(empty)}")
    if not_on_path:
        problems.append(
            f"not on LD_LIBRARY_PATH: {', '.join(not_on_path)}; source scripts/euler/env.sh"
        )
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{', '.join(found)} on LD_LIBRARY_PATH (under {roots[0]})"


# ------------------------------------------------------------------ backend


def describe_devices(devices: Sequence) -> str:
    """'4 x NVIDIA GeForce RTX 4090' style summary of the device kinds."""
    kinds = collections.Counter(d.device_kind for d in devices)
    return ", ".join(f"{count} x {kind}" for kind, count in kinds.items())


def check_backend(options: PreflightOptions, state: PreflightState) -> str:
    import jax

    try:
        backend = jax.default_backend()
        devices = jax.local_devices()
    except RuntimeError as error:
        raise CheckFailed(
            f"JAX backend failed to initialize: {first_line(error)}"
        ) from error
    if backend != options.platform:
        hint = (" (CUDA plugin not loaded: check the jax[cuda13] install, LD_LIBRARY_PATH "
                "and JAX_PLATFORMS)") if options.platform == "gpu" else ""
        raise CheckFailed(
            f"default backend is {backend} with {describe_devices(devices)}, expected "
            f"{options.platform}{hint}"
        )
    state.devices = list(devices)
    found = f"{len(devices)} {backend} device(s): {describe_devices(devices)}"
    problems = []
    if len(devices) < options.min_devices:
        problems.append(f"need at least {options.min_devices} (--min-devices)")
    if options.expect_gpu_regex:
        pattern = re.compile(options.expect_gpu_regex)
        wrong = sorted({d.device_kind for d in devices
                        if not (pattern.search(d.device_kind) or pattern.search(str(d)))})
        if wrong:
            problems.append(f"kinds {wrong} do not match --expect-gpu-regex "
                            f"{options.expect_gpu_regex!r}")
    if problems:
        raise CheckFailed(f"{found}; {'; '.join(problems)}")
    return found


# ------------------------------------------------------------------ conv


def make_conv_probe(dtype) -> Callable:
    """Jitted `(x [N, H, W, C] f32, kernels) -> (loss f32 [], grads)`: two convolutions
    (stride 2 then 1, NHWC/HWIO) computed in `dtype`, loss and grads in float32."""
    import jax
    import jax.numpy as jnp

    def conv(x, kernel, stride):
        return jax.lax.conv_general_dilated(
            x, kernel.astype(dtype), (stride, stride), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )

    def loss_fn(x, kernels):
        first, second = kernels
        hidden = jax.nn.relu(conv(x.astype(dtype), first, 2))
        out = conv(hidden, second, 1).astype(jnp.float32)
        return jnp.mean(jnp.square(out))

    return jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))


def conv_inputs() -> tuple[Any, tuple[Any, Any]]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16, 16, 8)).astype(np.float32)
    kernels = (
        (rng.standard_normal((3, 3, 8, 16)) / 8).astype(np.float32),
        (rng.standard_normal((3, 3, 16, 16)) / 12).astype(np.float32),
    )
    return x, kernels


def check_conv(options: PreflightOptions, state: PreflightState) -> str:
    import jax
    import numpy as np

    from terra_rl.nets.precision import compute_dtype

    if not state.devices:
        raise SkipCheck(f"no {options.platform} devices (backend check failed)")
    dtype = compute_dtype(options.compute_precision)
    probe = make_conv_probe(dtype)
    x, kernels = conv_inputs()
    losses, failures = [], []
    for device in state.devices:
        try:
            loss, grads = probe(jax.device_put(x, device), jax.device_put(kernels, device))
            loss, grads = jax.device_get((loss, grads))
        except Exception as error:  # noqa: BLE001 - reported per device
            failures.append(f"{device}: {type(error).__name__}: {first_line(error)}")
            continue
        leaves = [np.asarray(loss), *map(np.asarray, jax.tree.leaves(grads))]
        if not all(np.all(np.isfinite(leaf)) for leaf in leaves):
            failures.append(f"{device}: non-finite loss or gradient")
        elif not all(np.any(leaf != 0) for leaf in leaves[1:]):
            failures.append(f"{device}: all-zero gradient")
        else:
            losses.append(float(loss))
    if failures:
        raise CheckFailed(
            f"conv fwd+bwd ({dtype.name}) failed on {len(failures)}/{len(state.devices)} "
            f"device(s): {'; '.join(failures)}"
        )
    spread = (max(losses) - min(losses)) / max(abs(losses[0]), 1e-12)
    tolerance = 1e-5 if dtype.name == "float32" else 2e-2
    if spread > tolerance:
        raise CheckFailed(
            f"conv loss differs between devices by {spread:.2g} (relative, > {tolerance}): "
            f"{[f'{v:.6g}' for v in losses]}"
        )
    return (f"conv fwd+bwd in {dtype.name} finite on {len(losses)} device(s), "
            f"loss {losses[0]:.6g}")


# ------------------------------------------------------------------ psum


def check_psum(options: PreflightOptions, state: PreflightState) -> str:
    import jax
    import numpy as np

    if not state.devices:
        raise SkipCheck(f"no {options.platform} devices (backend check failed)")
    num_devices = len(state.devices)
    all_reduce = jax.pmap(lambda x: jax.lax.psum(x, "devices"), axis_name="devices",
                          devices=state.devices)
    # Device i contributes i + 1 everywhere: every device must get n (n + 1) / 2 exactly.
    values = np.arange(1, num_devices + 1, dtype=np.float32)[:, None] * np.ones(
        (num_devices, 1024), np.float32
    )
    out = np.asarray(jax.device_get(all_reduce(values)))
    expected = num_devices * (num_devices + 1) / 2
    if out.shape != values.shape or not np.all(out == expected):
        wrong = sorted({float(v) for v in np.unique(out) if v != expected})[:5]
        raise CheckFailed(
            f"psum over {num_devices} device(s) gave {wrong}, expected {expected:g} everywhere"
        )
    return f"psum over {num_devices} device(s) = {expected:g} exactly"


# ------------------------------------------------------------------ train_smoke


@contextlib.contextmanager
def _procedural_maps() -> Iterator[None]:
    """Hide DATASET_PATH/DATASET_SIZE: the smoke proves the runtime, not a dataset."""
    with env_vars.hidden(("DATASET_PATH", "DATASET_SIZE")):
        yield


def smoke_config(num_devices: int, precision: str):
    """The validation gates' tiny training config (16x16 trench maps, 8 envs x 8 steps per
    device, episodes ending inside the rollout) on `num_devices` devices, one update long,
    on procedural maps, resolved."""
    from terra_rl.validation import small

    one_update = small.SMOKE_FIELDS["num_steps"] * small.SMOKE_FIELDS["num_envs_per_device"]
    with _procedural_maps():
        return small.smoke_config(num_devices=num_devices, precision=precision,
                                  eval_episodes=num_devices,
                                  total_timesteps=one_update * num_devices)


def check_train_smoke(options: PreflightOptions, state: PreflightState) -> str:
    import jax
    import numpy as np

    from terra_rl.run.device_metrics import host_metrics
    from terra_rl.run.trainer import build_trainer

    config = smoke_config(len(state.devices), options.compute_precision)
    with _procedural_maps():
        trainer = build_trainer(config)
    runner = trainer.init_runner()
    update = trainer.compile_update(runner)
    start = time.perf_counter()
    runner, device_metrics = update(runner, trainer.env_params)
    metrics = host_metrics(device_metrics)
    seconds = time.perf_counter() - start
    updates_done = np.asarray(jax.device_get(runner.counters.update)).reshape(-1)
    if not np.all(updates_done == 1):
        raise CheckFailed(f"update counter is {updates_done.tolist()} after one update, not 1")
    bad = sorted(name for name, value in metrics.items() if not math.isfinite(value))
    if bad or not metrics:
        raise CheckFailed(f"non-finite metrics after update 1: {bad or 'no metrics at all'}")
    return (
        f"update 1 of {config.env_steps_per_update} env steps on {trainer.num_devices} "
        f"device(s) ({config.precision}): compile {trainer.compile_seconds:.1f} s, "
        f"update {seconds:.2f} s, {len(metrics)} metrics finite"
    )
