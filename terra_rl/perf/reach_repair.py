"""How much of the cut-off test's flood fill a repair could skip: a census of the tests a
rollout runs, for the design that keeps each env's reachable poses and repairs them after
a DO instead of filling from scratch (docs/PERFORMANCE.md, "The cut-off mask's cost").

For a state whose observation depends on the test (`envs.batch.BatchEnv.observe` runs the
fill there), let R0 be the base poses reachable on the state's maps, R1 those reachable on
the maps after the DO the test asks about, and P the poses of R0 still free after it. A dig
or a dump only blocks tiles, so R1 lies within P; a pickup that lowers a pile to a drivable
height could free one (`grew`). The census reports, per state:

- whether the DO removes no pose of R0 (R1 = R0: a kept R0 answers the test with one cover
  test and no fill);
- whether the rest stays connected (R1 = P);
- for each window margin m, whether a local repair answers, and how much it sweeps. The
  repair groups the poses of P next to the removed ones by fills inside the window (the
  removed poses' positions, m tiles wider each way); a group that reaches no pose of the
  window's outer band (as wide as the longest move) and holds no agent is a pocket cut off
  from the rest. It answers where every such pose fell into one of `max_groups` groups
  and the agent's group is closed (R1 is that group) or the only one reaching the band (R1
  is P without the pockets). Where it answers, its R1 is checked against the fill from
  scratch (`wrong`).

Tracked excavators only (their moves: `envs.reachability`)."""

from __future__ import annotations

import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from envs import EnvConfig, ExcavationEnv, reachability
from envs import geometry as geo
from terra_rl.perf.benchmarking import time_in_rounds

H = reachability.H
BAND = 2
"""Width of the window's outer band in tiles: the longest base move (2 tiles at 16x16 to
64x64; `make_tracked_fill` checks it)."""


def make_next_to(config: EnvConfig, size: int | None = None):
    """`next_to(poses) -> poses`, packed uint32 [..., 12, words, N] pose sets
    (`envs.reachability.pack`; N = `size`, default the map's): the poses one tracked move
    or turn of `config`'s excavator away from `poses`."""
    steps = geo.move_displacements(config.move_step)
    if int(np.max(np.abs(steps))) > BAND:
        raise ValueError(f"moves longer than {BAND} tiles need a wider band")
    straight = reachability.make_moves(
        [(h, h, *(sign * steps[2 * h])) for h in range(H) for sign in (1, -1)], H,
        size or config.map_size)
    return lambda poses: (straight(poses) | jnp.roll(poses, 1, axis=-3)
                          | jnp.roll(poses, -1, axis=-3))


def make_tracked_fill(config: EnvConfig):
    """`fill(seed, region) -> (reached, sweeps)` for one env's packed pose sets: the poses
    of `region` a tracked excavator reaches from those of `seed` in it (`make_next_to` a
    sweep until none grows), and the sweeps (the last, which finds no growth, included)."""
    next_to = make_next_to(config)

    def fill(seed, region):
        def body(carry):
            reach, _, sweeps = carry
            grown = reach | (next_to(reach) & region)
            return grown, jnp.any(grown != reach), sweeps + 1

        reach, _, sweeps = jax.lax.while_loop(
            lambda c: c[1], body, (seed & region, jnp.bool_(True), jnp.int32(0)))
        return reach, sweeps

    return fill


def make_local_repair(config: EnvConfig, margin: int, max_groups: int = 4):
    """`repair(reach0, kept, start) -> (answers, reach1, sweeps, window_tiles)` for one env:
    R0, P = R0 minus the poses a DO blocked, and the agent's pose, packed pose sets
    (`make_tracked_fill`). Where `answers`, `reach1` is the poses the agent reaches in P
    (see the module docstring); `sweeps` sums its fills' sweeps, `window_tiles` counts the
    tiles of its window (both 0 where the DO removed nothing)."""
    if margin <= BAND:
        raise ValueError(f"margins must be more than {BAND} tiles, got {margin}")
    n = config.map_size
    fill, next_to = make_tracked_fill(config), make_next_to(config)
    index = jnp.arange(n)

    def first_pose(poses):  # one pose of `poses` (none where it is empty)
        bits = reachability.unpack(poses, n).reshape(-1)
        one = (jnp.arange(bits.size) == jnp.argmax(bits)) & jnp.any(bits)
        return reachability.pack(one.reshape(H, n, n))

    def window(removed):  # (window, its outer band) packed [1, words, N], window tiles
        positions = reachability.unpack(
            jax.lax.reduce(removed, jnp.uint32(0), jax.lax.bitwise_or, (0,)), n)

        def box(extra):
            def span(used):
                low, high = jnp.argmax(used), n - 1 - jnp.argmax(used[::-1])
                return (index >= low - extra) & (index <= high + extra)

            return span(jnp.any(positions, axis=1))[:, None] & span(jnp.any(positions, axis=0))

        inside = box(margin)
        return (reachability.pack(inside)[None],
                reachability.pack(inside & ~box(margin - BAND))[None], jnp.sum(inside))

    def repair(reach0, kept, start):
        removed = reach0 & ~kept
        inside, band, tiles = window(removed)
        region = kept & inside
        left = next_to(removed) & kept
        pockets = trapped = jnp.zeros_like(kept)
        open_groups = sweeps = jnp.int32(0)
        for _ in range(max_groups):
            group, swept = fill(first_pose(left), region)
            seen = jnp.any(group != 0)
            has_agent = jnp.any((group & start) != 0)
            closed = seen & ~jnp.any((group & band) != 0)
            open_groups += seen & ~closed
            sweeps += jnp.where(seen, swept, 0)
            pockets |= jnp.where(closed & ~has_agent, group, 0)
            trapped |= jnp.where(closed & has_agent, group, 0)
            left &= ~group
        # The agent's part of P holds a pose next to a removed one (R0 was connected), so
        # with every such pose grouped it is a group: a closed one, or the one open group.
        nothing_removed, is_trapped = jnp.all(removed == 0), jnp.any(trapped != 0)
        answers = nothing_removed | (jnp.all(left == 0) & (is_trapped | (open_groups <= 1)))
        reach1 = jnp.where(is_trapped, trapped, kept & ~pockets)
        return answers, reach1, sweeps, jnp.where(nothing_removed, 0, tiles)

    return repair


def make_repair_census(env: ExcavationEnv, margins: tuple[int, ...] = (4, 8, 12),
                       max_groups: int = 4):
    """Jitted `census(states) -> dict of [B] arrays` for a batch of `env`'s states (EnvState
    with a leading axis B): "tested", "cut", "unchanged", "connected", "grew" bool,
    "global_sweeps" int32 (a fill of R1 from scratch to convergence, the sweep that finds no
    growth included); per margin m, "accepted_m" and "wrong_m" bool, "sweeps_m" and
    "window_m" int32 (`make_local_repair`). `max_groups` fills at most per repair; more
    groups and it does not answer."""
    config = env.config
    if not env.checks_cut_off:
        raise ValueError("the env runs no cut-off test: turn on mask_cut_off_digs or "
                         "mask_cut_off_dumps")
    if config.wheeled_fraction > 0:
        raise ValueError("the census drives tracked excavators only: set wheeled_fraction 0")
    repairs = {m: jax.vmap(make_local_repair(config, m, max_groups)) for m in margins}
    fill = jax.vmap(make_tracked_fill(config))
    reachable_one = reachability.make_reachable_poses(config, wheeled=False)

    def reachable(*args):  # the env's own fill, packed
        return reachability.pack(jax.vmap(reachable_one)(*args))

    free_poses = jax.vmap(reachability.make_free_poses(config))
    cut_off = reachability.make_batch_cut_off(config, False)
    axes = (-3, -2, -1)

    @jax.jit
    def census(states):
        if_kept, if_cut, _ = jax.vmap(env.observation_either_way)(states)
        target, after, obstacles, pos, heading, wheeled = jax.vmap(env.cut_off_arguments)(states)
        reach0 = reachable(states.action_map, obstacles, pos, heading, wheeled)
        reach1 = reachable(after, obstacles, pos, heading, wheeled)
        free_after = free_poses(after, obstacles)
        kept = reach0 & free_after
        start = reachability.start_poses(pos, heading, config.map_size)
        out = {
            "tested": jnp.any(if_kept["action_mask"] != if_cut["action_mask"], axis=1),
            "cut": cut_off(target, after, obstacles, pos, heading, wheeled),
            "unchanged": jnp.all(reach1 == reach0, axis=axes),
            "connected": jnp.all(reach1 == kept, axis=axes),
            "grew": jnp.any((reach1 & ~reach0) != 0, axis=axes),
            "global_sweeps": fill(start, free_after)[1],
        }
        for margin, repair in repairs.items():
            answers, repaired, sweeps, tiles = repair(reach0, kept, start)
            out[f"accepted_{margin}"] = answers
            out[f"wrong_{margin}"] = answers & jnp.any(repaired != reach1, axis=axes)
            out[f"sweeps_{margin}"] = sweeps
            out[f"window_{margin}"] = tiles
        return out

    return census


def sweep_seconds(config: EnvConfig, sizes: tuple[int, ...], envs: int, sweeps: int = 24,
                  rounds: int = 9) -> dict[int, float]:
    """Median wall seconds of one sweep of `make_tracked_fill`'s loop for `envs` envs on
    pose sets `size` x `size` (random regions), per size in `sizes`, timed in rounds
    (`benchmarking.time_in_rounds`): what a repair's window saves per sweep against the
    whole map."""
    calls = {}
    for size in sizes:
        next_to = make_next_to(config, size)
        words = -(-size // reachability.WORD)
        keys = jax.random.split(jax.random.PRNGKey(size))
        region = jax.random.bits(keys[0], (envs, H, words, size), jnp.uint32)
        seed = jnp.zeros_like(region).at[:, 0, 0, size // 2].set(1)
        run = jax.jit(lambda seed, region, next_to=next_to: jax.lax.fori_loop(
            0, sweeps, lambda _, reach: reach | (next_to(reach) & region), seed))
        jax.block_until_ready(run(seed, region))
        calls[size] = functools.partial(run, seed, region)
    samples = time_in_rounds(calls, rounds)
    return {size: statistics.median(times) / sweeps for size, times in samples.items()}
