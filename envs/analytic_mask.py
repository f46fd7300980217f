"""The excavation env's action mask, analytic on the step's window: the valid actions
(footprint checks and the DO preconditions), less the rules of `envs.action_rules`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs import action_rules, excavation
from envs import actions as A
from envs import geometry as geo


def analytic_mask(
    env, agent, window, sectors, w_target, w_action, w_obstacles, w_dump,
    last_action, recent_poses, has_dump_zones, valid_only=False, full_maps=None,
    targets_cut_off=None,
):
    """bool [8]: `env`'s (an `envs.env.ExcavationEnv`) analytic mask for one agent, on
    the window layers around it: four footprint checks and the DO preconditions (with
    `valid_only`, only these: the actions that would change the state), then the
    forbidden digs and dumps (`action_rules.do_is_forbidden`, on `full_maps`) and the
    returns to a recent pose (`EnvConfig.revisit_memory`). `targets_cut_off` replaces
    the cut-off test (`envs.reachability.make_targets_cut_off`'s signature)."""
    cfg = env.config
    is_wheeled = agent.agent_type == A.WHEELED
    is_loaded = agent.loaded > 0
    traversable = excavation.traversable(w_obstacles, w_action, cfg.drivable_soil_height)
    base_actions = jnp.arange(4, dtype=jnp.int32)
    deltas, headings, wheels = jax.vmap(lambda a: env._candidate_pose(agent, a))(
        base_actions
    )
    pose_free = jax.vmap(lambda d, h: env._pose_is_free(window, traversable, agent.pos, d, h))(
        deltas, headings
    )
    base_ok = pose_free & ~is_loaded
    limit = cfg.wheel_angle_limit
    wheels_ok = jnp.stack([agent.wheel_angle < limit, agent.wheel_angle > -limit])
    turns_ok = jnp.where(is_wheeled, wheels_ok, base_ok[2:])

    workspace = env._workspace(agent, window, w_obstacles, sectors[0])
    pickable = excavation.pickable(has_dump_zones, w_target, cfg.pickup_misplaced_only)
    can_dig = jnp.any(
        excavation.soil_in_reach(workspace, w_action, pickable)
        | excavation.diggable(workspace, w_target, w_action)
    )
    can_dump = jnp.any(excavation.dumpable(workspace, w_target, w_action, w_dump))
    do_ok = jnp.where(is_loaded, can_dump, can_dig)
    true = jnp.ones((), bool)
    wait_ok = jnp.asarray(not cfg.mask_do_nothing)
    mask = jnp.stack(
        [base_ok[0], base_ok[1], turns_ok[0], turns_ok[1], true, true, do_ok, wait_ok]
    )
    if valid_only:
        return mask
    picks_up = excavation.picks_up(
        workspace, w_target, w_action, cfg.dig_before_pickup, pickable
    )
    forbid_do = jnp.zeros((), bool)  # these rules mask DO only: the cabin turns stay
    if (cfg.mask_dead_end_digs or cfg.mask_dead_end_pickups or cfg.mask_cut_off_digs
            or cfg.mask_cut_off_dumps):
        forbid_do |= action_rules.do_is_forbidden(
            cfg, agent, window, sectors, workspace, w_target, w_action, w_obstacles,
            w_dump, pickable, picks_up, full_maps,
            targets_cut_off or env.targets_cut_off)
    if cfg.mask_dump_outside_zones:
        forbid_do |= action_rules.dump_is_outside_zone_in_reach(
            cfg, agent, window, sectors, workspace, w_target, w_action, w_obstacles,
            w_dump, has_dump_zones)
    dump_rules = cfg.mask_cut_off_dumps or cfg.mask_dump_outside_zones
    if dump_rules and cfg.dump_after_full_turn and cfg.revisit_memory >= geo.NUM_HEADINGS:
        # Its base fixed, a loaded excavator that turned full circle without a dump has
        # met no dump the rules allow: they yield rather than hold the load for good.
        forbid_do &= ~(is_loaded & action_rules.cabin_turned_round(cfg, agent, recent_poses))
    mask = mask.at[A.DO].set(mask[A.DO] & ~forbid_do)
    if not cfg.revisit_memory:
        return mask
    strict = mask & ~action_rules.repeats(
        cfg, agent, deltas, headings, wheels, recent_poses, last_action, picks_up
    )
    return jnp.where(jnp.any(strict), strict, mask)
