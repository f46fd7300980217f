"""The DO action on a `[W, W]` window: which tiles can be dug or dumped on, and both
outcomes (dig and dump), computed together so the step selects one without branching."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def traversable(w_obstacles, w_action, drivable_soil_height: int) -> jax.Array:
    """bool [W, W]: tiles the base may cover: no obstacle, not dug, and soil no higher than
    `drivable_soil_height` (`EnvConfig.drivable_soil_height`)."""
    return (w_obstacles == 0) & (w_action >= 0) & (w_action <= drivable_soil_height)


def pickable(has_dump_zones, w_target, misplaced_only: bool):
    """bool [W, W] (or True for all): tiles soil may be picked up from. With
    `misplaced_only` (`EnvConfig.pickup_misplaced_only`) only those outside the zones of a
    map with zones (`has_dump_zones` bool [])."""
    if not misplaced_only:
        return True
    return has_dump_zones & (w_target != 1)


def soil_in_reach(workspace, w_action, pickable=True) -> jax.Array:
    """bool [W, W]: workspace tiles holding dumped soil that may be picked up (`pickable`,
    bool [W, W] or True for all; see `EnvConfig.pickup_misplaced_only`)."""
    return workspace & (w_action > 0) & pickable


def diggable(workspace, w_target, w_action) -> jax.Array:
    """bool [W, W]: undug dig-target tiles in the workspace (digging goes one level)."""
    return workspace & (w_target == -1) & (w_action == 0)


def dumpable(workspace, w_target, w_action, w_dump) -> jax.Array:
    """bool [W, W]: untouched, dumpable tiles of the workspace that are not to be dug."""
    return workspace & (w_dump == 1) & (w_action == 0) & (w_target != -1)


def picks_up(workspace, w_target, w_action, dig_first: bool, pickable=True) -> jax.Array:
    """bool []: whether DO with an empty bucket picks soil up rather than digging. With
    `dig_first` only where no undug target is in reach, else wherever soil is in reach."""
    soil = jnp.any(soil_in_reach(workspace, w_action, pickable))
    if not dig_first:
        return soil
    return soil & ~jnp.any(diggable(workspace, w_target, w_action))


def next_to(tiles) -> jax.Array:
    """int8 [W, W]: 1 on `tiles` (int8 [W, W], 0 or 1) and their 8 neighbours.

    The 3x3 max as a 3x1 max then a 1x3 max: on XLA:CPU the 3x3 `reduce_window` took 8.8 ms
    over 2,048 windows of 25x25 against 1.0 ms, and the 64x64 env step (64 envs x 32 steps,
    one core) 0.0685 against 0.0604 s with the rules, 0.0347 against 0.0309 s without.
    Nine (or 3 + 3) shifted slices were slower than either in the step."""
    rows = jax.lax.reduce_window(tiles, jnp.int8(0), jax.lax.max, (3, 1), (1, 1), "SAME")
    return jax.lax.reduce_window(rows, jnp.int8(0), jax.lax.max, (1, 3), (1, 1), "SAME")


def dig_and_dump(
    workspace, w_target, w_action, w_dump, loaded, dig_first: bool = True, pickable=True
) -> dict[str, jax.Array]:
    """Both DO outcomes; the caller selects by whether the bucket is loaded.

    workspace bool [W, W] (arm sector minus footprint and obstacles); w_* int8 [W, W];
    loaded int32 []; dig_first static; pickable bool [W, W] or True. Dig (empty bucket):
    every diggable tile is dug one level; where `picks_up`, every tile of pickable soil in
    reach gives one unit instead. Dump
    (loaded): the load is split over dumpable tiles, dump zones first, in integer shares
    (the remainder one unit each, row-major order), so soil is conserved exactly.
    """
    soil = soil_in_reach(workspace, w_action, pickable)
    picked_up = picks_up(workspace, w_target, w_action, dig_first, pickable)
    lowered = jnp.where(picked_up, soil, diggable(workspace, w_target, w_action))
    # Tiles next to newly dug ground can no longer take soil.
    newly_dug = (lowered & ~picked_up).astype(jnp.int8)
    near_dug = next_to(newly_dug)
    on_zone = w_target == 1

    allowed = dumpable(workspace, w_target, w_action, w_dump)
    zone_allowed = allowed & on_zone
    dest = jnp.where(jnp.any(zone_allowed), zone_allowed, allowed)
    num_dest = jnp.maximum(jnp.sum(dest, dtype=jnp.int32), 1)
    rank = (jnp.cumsum(dest.ravel().astype(jnp.int32)) - 1).reshape(dest.shape)
    share = jnp.where(dest, loaded // num_dest + (rank < loaded % num_dest), 0).astype(jnp.int32)
    return {
        "dig_action": w_action - lowered.astype(jnp.int8),
        "dig_dumpability": jnp.where(near_dug > 0, jnp.int8(0), w_dump),
        "dig_units": jnp.sum(lowered, dtype=jnp.int32),
        "picked_up": picked_up,
        "pickup_outside_zone": jnp.sum(lowered & picked_up & ~on_zone, dtype=jnp.int32),
        "dump_action": (w_action + share).astype(jnp.int8),
        "dump_units": jnp.sum(share),
        "dump_on_zone": jnp.sum(jnp.where(on_zone, share, 0)),
    }
