"""Rules the action mask adds to the valid actions (`EnvConfig.mask_dead_end_digs`,
`mask_dead_end_pickups`, `mask_cut_off_digs`, `mask_cut_off_dumps`, `mask_dump_outside_zones`,
`dump_after_full_turn`, `revisit_memory`; the cut-off rules' flood fill is
`envs.reachability`): no dig or pick-up that leaves a load with nowhere to go, no dig or dump
that cuts targets off, no dump outside the zones while a zone is in reach (both dump rules
yield once the loaded cabin has turned full circle), no return to a pose the episode was in
since its last dig or dump. Pure functions on one env's window."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs import actions as A
from envs import excavation
from envs import geometry as geo
from envs.config import EnvConfig
from envs.state import AgentState


def pose_code(config: EnvConfig, agent: AgentState, delta=0, heading=None, cabin=None,
              wheel=None) -> jax.Array:
    """int32 []: one number per (row, col, base heading, cabin heading, wheel angle) of
    `agent`, with the given parts replaced (`delta` added to the position)."""
    pos = jnp.asarray(agent.pos) + delta
    heading = agent.base_heading if heading is None else heading
    cabin = agent.cabin_heading if cabin is None else cabin
    wheel = agent.wheel_angle if wheel is None else wheel
    limit = config.wheel_angle_limit
    code = pos[0] * config.map_size + pos[1]
    code = (code * geo.NUM_HEADINGS + heading) * geo.NUM_HEADINGS + cabin % geo.NUM_HEADINGS
    return (code * (2 * limit + 1) + wheel + limit).astype(jnp.int32)


def fresh_memory(config: EnvConfig, code) -> jax.Array:
    """int32 [R]: the revisit memory (`EnvState.recent_poses`) holding only `code`."""
    size = max(1, config.revisit_memory)
    return jnp.full((size,), -1, jnp.int32).at[0].set(code)


def remember(config: EnvConfig, recent_poses, code, map_changed) -> jax.Array:
    """int32 [R]: the memory after a step to pose `code`; a changed map starts it afresh, as
    no state from before the change can come back."""
    shifted = jnp.concatenate([jnp.asarray(code)[None], recent_poses[:-1]])
    return jnp.where(map_changed, fresh_memory(config, code), shifted)


def dig_is_dead_end(config: EnvConfig, agent, window, sectors, w_target, w_obstacles,
                    dig) -> jax.Array:
    """bool []: after DO with the empty bucket (`dig`, the outcomes of
    `excavation.dig_and_dump`: a dig, or a pick-up), no arm heading of this pose (`sectors`
    bool [12, W, W]) reaches a tile to dump on. A loaded excavator cannot move, so the load
    could never be dumped and the task never finished. A pick-up frees a tile for dumping
    only where it takes the pile's last unit: soil is dumped on untouched tiles only."""
    reach = pose_reach(config, agent, window, sectors, w_obstacles)
    after = excavation.dumpable(reach, w_target, dig["dig_action"], dig["dig_dumpability"])
    return ~jnp.any(after)


def pose_reach(config: EnvConfig, agent, window, sectors, w_obstacles) -> jax.Array:
    """bool [W, W]: the tiles some arm heading of this pose reaches (`sectors` bool
    [12, W, W]), minus the agent's footprint and obstacles."""
    under_agent = geo.footprint_mask(config, window, agent.base_heading)
    return geo.arm_ring(config, window, sectors) & ~under_agent & (w_obstacles == 0)


def dump_is_outside_zone_in_reach(config: EnvConfig, agent, window, sectors, workspace,
                                  w_target, w_action, w_obstacles, w_dump,
                                  has_dump_zones) -> jax.Array:
    """bool []: loaded, on a map with dump zones, DO would dump outside them (the arm's
    `workspace` holds no free zone tile) while another arm heading of this pose reaches one
    (`EnvConfig.mask_dump_outside_zones`). A cabin turn then dumps on the zone instead."""
    free_zone = (w_target == 1) & (w_dump == 1) & (w_action == 0)
    zone_here = jnp.any(workspace & free_zone)
    zone_by_turning = jnp.any(pose_reach(config, agent, window, sectors, w_obstacles)
                              & free_zone)
    return (agent.loaded > 0) & has_dump_zones & zone_by_turning & ~zone_here


def do_is_forbidden(config: EnvConfig, agent, window, sectors, workspace, w_target,
                    w_action, w_obstacles, w_dump, pickable, picks_up, full_maps,
                    targets_cut_off) -> jax.Array:
    """bool []: DO is a dig that is a dead end (`EnvConfig.mask_dead_end_digs`), a pick-up
    that is one (`mask_dead_end_pickups`), a dig that cuts targets off (`mask_cut_off_digs`),
    or a dump that cuts targets off
    (`mask_cut_off_dumps`: soil piled higher than `drivable_soil_height` blocks the base as a
    dug tile does). `picks_up` bool []: DO would pick soil up (the cut-off rules never
    forbid it: it lowers a pile). `targets_cut_off` is
    `envs.reachability.make_targets_cut_off`'s test, run once on `full_maps`, the (target,
    action, obstacles) maps [N, N], with what DO would do pasted in: the dig with an empty
    bucket, the dump when loaded."""
    is_loaded = agent.loaded > 0
    outcome = excavation.dig_and_dump(
        workspace, w_target, w_action, w_dump, agent.loaded, config.dig_before_pickup,
        pickable)
    digs = ~is_loaded & ~picks_up
    forbidden = jnp.zeros((), bool)
    fills = jnp.zeros((), bool)  # DOs that fill the bucket and are checked for a dead end
    if config.mask_dead_end_digs:
        fills |= digs
    if config.mask_dead_end_pickups:
        fills |= ~is_loaded & picks_up
    if config.mask_dead_end_digs or config.mask_dead_end_pickups:
        forbidden |= fills & dig_is_dead_end(config, agent, window, sectors, w_target,
                                           w_obstacles, outcome)
    checked = jnp.zeros((), bool)
    if config.mask_cut_off_digs:
        checked |= digs
    if config.mask_cut_off_dumps:
        checked |= is_loaded
    if config.mask_cut_off_digs or config.mask_cut_off_dumps:
        target_map, action_map, obstacles = full_maps
        after = jnp.where(is_loaded, outcome["dump_action"], outcome["dig_action"])
        forbidden |= checked & targets_cut_off(
            target_map, geo.paste(action_map, after, window), obstacles,
            agent.pos, agent.base_heading, agent.agent_type == A.WHEELED,
        )
    return forbidden


def cabin_turned_round(config: EnvConfig, agent: AgentState, recent_poses) -> jax.Array:
    """bool []: `recent_poses` (int32 [R], `pose_code`s since the last dig or dump, -1 empty)
    holds the agent's position and base heading with every one of the 12 cabin headings, at
    any wheel angle. A loaded base cannot move, so after a load this means the cabin has
    turned full circle without a dump."""
    wheels = 2 * config.wheel_angle_limit + 1
    base_key = (agent.pos[0] * config.map_size + agent.pos[1]) * geo.NUM_HEADINGS \
        + agent.base_heading
    here = (recent_poses >= 0) & (recent_poses // (wheels * geo.NUM_HEADINGS) == base_key)
    cabins = (recent_poses // wheels) % geo.NUM_HEADINGS
    seen = here[:, None] & (cabins[:, None] == jnp.arange(geo.NUM_HEADINGS)[None, :])
    return jnp.all(jnp.any(seen, axis=0))


def repeats(config: EnvConfig, agent: AgentState, deltas, headings, wheels, recent_poses,
            last_action, picks_up) -> jax.Array:
    """bool [8]: actions that would bring back a state of the episode since its last dig or
    dump. `deltas` int32 [4, 2], `headings` / `wheels` int32 [4]: the poses the four base
    actions lead to; the cabin turns lead to the cabin one heading either way. A DO that
    would pick soil up (`picks_up`) right after a dump undoes it: an empty bucket right after
    a DO means that DO dumped (a dig or pick-up fills the bucket; a DO without effect is
    masked)."""
    is_wheeled = agent.agent_type == A.WHEELED
    wheels = jnp.where(is_wheeled, wheels, agent.wheel_angle)  # tracked: CLOCK, not wheels
    base_codes = jax.vmap(lambda d, h, w: pose_code(config, agent, d, h, wheel=w))(
        deltas, headings, wheels
    )
    cabin_codes = jnp.stack(
        [pose_code(config, agent, cabin=agent.cabin_heading + turn) for turn in (-1, 1)]
    )
    codes = jnp.concatenate([base_codes, cabin_codes])
    revisits = jnp.any(codes[:, None] == recent_poses[None, :], axis=-1)
    undoes_dump = (last_action == A.DO) & (agent.loaded == 0) & picks_up
    return jnp.concatenate([revisits, undoes_dump[None], jnp.zeros((1,), bool)])
