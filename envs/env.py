"""The single excavation environment: `reset` and `step_no_reset`, pure and jittable.

A step does all of its map work in one `[W, W]` window around the pre-step position: the
chosen move's collision check, the DO (dig or dump), and then, seen from the post-step
pose, the next observation's local maps and the analytic action mask. Actions share this
geometry and their results are selected with `jnp.where`; there is no `lax.switch` over
action bodies, so a step compiles one body whatever the action.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs import action_rules, excavation, reachability, rewards, spawn
from envs import actions as A
from envs import curriculum as curriculum_rules
from envs import geometry as geo
from envs.analytic_mask import analytic_mask
from envs.config import EnvConfig
from envs.maps import MAP_TYPES
from envs.state import AgentState, CurriculumState, EnvParams, EnvState

NUM_LOCAL_LAYERS = 6
LOCAL_LAYER_NAMES = ("dug", "dumped", "dig_target", "dump_zone", "dumpable", "obstacles")


class ExcavationEnv:
    """Excavation gridworld for one agent; vmap it (see `envs.batch.BatchEnv`).

    Observation dict (N = map size):
      agent_state   int32 [6]      row, col, base_heading, cabin_heading, wheel_angle, loaded
      agent_type    int32 []       0 tracked, 1 wheeled
      local_maps    int16 [12, 6]  workspace sums per arm heading (index 0 = current arm
                                   heading, then anticlockwise) of LOCAL_LAYER_NAMES
      target_map, action_map, obstacles, dumpability   int8 [N, N]
      last_actions  int32 [K]      most recent first; NO_ACTION (8) before the first step
      action_mask   bool [8]       the valid actions less dead-end digs and revisits
      refused_digs  bool [N, N]    only with `EnvConfig.remember_refused_digs`: targets whose
                                   dig the mask refused since the map last changed
    """

    def __init__(self, config: EnvConfig):
        self.config = config
        self._displacements = geo.move_displacements(config.move_step)
        self._extents = geo.footprint_extents(config)
        self.targets_cut_off = reachability.make_targets_cut_off(config)
        self._level_map_types = None  # int32 [levels]: each curriculum level's map type
        if config.curriculum is not None:
            unknown = set(config.curriculum.levels) - set(MAP_TYPES)
            if unknown:
                raise ValueError(f"curriculum levels {sorted(unknown)} not in {MAP_TYPES}")
            self._level_map_types = np.array(
                [MAP_TYPES.index(name) for name in config.curriculum.levels], np.int32
            )

    # ------------------------------------------------------------------ reset

    def reset(
        self,
        key: jax.Array,
        params: EnvParams,
        agent_type: jax.Array | int = A.TRACKED,
        map_index: jax.Array | int | None = None,
    ) -> tuple[dict, EnvState]:
        """A first episode at curriculum level 0; `map_index` (int32 []) picks the map
        instead of sampling one (held-out evaluation covers its pool that way)."""
        zero = jnp.zeros((), jnp.int32)
        curriculum = CurriculumState(
            level=zero, consecutive_successes=zero, consecutive_failures=zero
        )
        return self.reset_episode(
            key, params, jnp.asarray(agent_type, jnp.int32), curriculum, map_index
        )

    def reset_episode(
        self,
        key: jax.Array,
        params: EnvParams,
        agent_type: jax.Array,
        curriculum: CurriculumState,
        map_index: jax.Array | int | None = None,
    ) -> tuple[dict, EnvState]:
        """A new episode that keeps the env's agent type and curriculum progress."""
        state = self.reset_state(key, params, agent_type, curriculum, map_index)
        obs = self.observation(state)
        return obs, self.remember_refusals(state, obs)

    def reset_state(
        self,
        key: jax.Array,
        params: EnvParams,
        agent_type: jax.Array,
        curriculum: CurriculumState,
        map_index: jax.Array | int | None = None,
    ) -> EnvState:
        """`reset_episode`'s state without its observation."""
        key_map, key_spawn, key_heading, key_fallback = jax.random.split(key, 4)
        if map_index is None:
            map_index = spawn.sample_map_index(
                self.config, self._level_map_types, key_map, params, curriculum.level)
        map_index = jnp.asarray(map_index, jnp.int32)
        target_map = params.target_map[map_index]
        obstacles = params.obstacles[map_index]
        pos, heading = spawn.spawn_pose(
            self.config,
            self._extents,
            key_spawn,
            key_heading,
            key_fallback,
            target_map,
            obstacles,
            params.spawn_pose[map_index],
        )
        zero = jnp.zeros((), jnp.int32)
        agent = AgentState(
            pos=pos,
            base_heading=heading,
            cabin_heading=zero,
            wheel_angle=zero,
            loaded=zero,
            agent_type=agent_type,
        )
        return self.make_state(
            target_map,
            obstacles,
            params.dumpability[map_index],
            agent,
            map_index=map_index,
            curriculum=curriculum,
        )

    def make_state(
        self,
        target_map,
        obstacles,
        dumpability,
        agent: AgentState,
        *,
        action_map=None,
        age=0,
        map_index=0,
        curriculum: CurriculumState | None = None,
    ) -> EnvState:
        """An EnvState from maps ([N, N], any int dtype) and an agent; the progress counters
        are derived from the maps. Used by reset and to build exact states in tests
        (`envs.spawn.initial_state`)."""
        return spawn.initial_state(self.config, target_map, obstacles, dumpability, agent,
                                   action_map=action_map, age=age, map_index=map_index,
                                   curriculum=curriculum)

    # ------------------------------------------------------------------ step

    def step_no_reset(
        self, key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams,
        with_action_mask: bool = True,
    ) -> tuple[dict, EnvState, jax.Array, jax.Array, jax.Array, dict[str, Any]]:
        """One step without auto-reset. The dynamics are deterministic; `key` and `params`
        are part of the contract for environments that need them. With `with_action_mask`
        False the observation's mask is all True, not computed (`BatchEnv` computes it once,
        after its resets)."""
        del key, params
        new_state, reward, task_done, truncated, info, view = self._transition(state, action)
        obs = self._observe(new_state, *view, with_action_mask)
        if with_action_mask:
            new_state = self.remember_refusals(new_state, obs)
        info = dict(info, action_mask=obs["action_mask"])
        return obs, new_state, reward, task_done, truncated, info

    def step_without_observation(
        self, key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams,
    ) -> tuple[EnvState, jax.Array, jax.Array, jax.Array, dict[str, Any]]:
        """`step_no_reset(..., with_action_mask=False)` less its observation: (state, reward,
        terminated, truncated, info without "action_mask"). `BatchEnv` observes the states
        after its resets, the pre-reset ones only where an episode ended."""
        del key, params
        return self._transition(state, action)[:-1]

    def observation_without_mask(self, state: EnvState) -> dict:
        """`state`'s observation with an all-True mask and no refusal added: what
        `step_no_reset(..., with_action_mask=False)` observes of the state it reaches."""
        return self._observe(state, *self._window_layers(state), with_action_mask=False)

    def _transition(self, state: EnvState, action: jax.Array):
        """The step's dynamics: (new state, reward, terminated, truncated, info without
        "action_mask", (window, target, action, obstacles, dumpability) cropped around the
        new pose) for `_observe`."""
        cfg = self.config
        agent = state.agent
        action = jnp.asarray(action, jnp.int32)
        window = geo.make_window(agent.pos, cfg.map_size, cfg.window_radius)
        w_target = geo.crop(state.target_map, window)
        w_action = geo.crop(state.action_map, window)
        w_obstacles = geo.crop(state.obstacles, window)
        w_dump = geo.crop(state.dumpability, window)

        # Base moves and turns: one candidate pose, one collision check.
        is_wheeled = agent.agent_type == A.WHEELED
        is_loaded = agent.loaded > 0
        delta, cand_heading, new_wheel = self._candidate_pose(agent, action)
        is_drive = (action == A.FORWARD) | (action == A.BACKWARD)
        is_base_turn = ~is_wheeled & ((action == A.CLOCK) | (action == A.ANTICLOCK))
        is_wheel_turn = is_wheeled & ((action == A.WHEELS_LEFT) | (action == A.WHEELS_RIGHT))
        is_base_action = is_drive | is_base_turn
        traversable = excavation.traversable(w_obstacles, w_action, cfg.drivable_soil_height)
        pose_ok = self._pose_is_free(window, traversable, agent.pos, delta, cand_heading)
        moved = is_base_action & ~is_loaded & pose_ok
        collided = is_base_action & ~is_loaded & ~pose_ok
        blocked_by_load = is_base_action & is_loaded

        # DO from the pre-step pose (a DO never moves the base).
        workspace = self._workspace(agent, window, w_obstacles)
        pickable = excavation.pickable(state.has_dump_zones, w_target, cfg.pickup_misplaced_only)
        dig = excavation.dig_and_dump(
            workspace, w_target, w_action, w_dump, agent.loaded, cfg.dig_before_pickup, pickable
        )
        is_do = action == A.DO
        digging = is_do & ~is_loaded
        dumping = is_do & is_loaded
        new_w_action = jnp.where(
            digging, dig["dig_action"], jnp.where(dumping, dig["dump_action"], w_action)
        )
        new_w_dump = jnp.where(digging, dig["dig_dumpability"], w_dump)
        new_loaded = jnp.where(
            digging,
            agent.loaded + dig["dig_units"],
            jnp.where(dumping & (dig["dump_units"] > 0), 0, agent.loaded),
        )
        do_effect = jnp.where(digging, dig["dig_units"] > 0, dig["dump_units"] > 0)

        cabin_delta = jnp.where(
            action == A.CABIN_ANTICLOCK, 1, jnp.where(action == A.CABIN_CLOCK, -1, 0)
        )
        new_agent = agent.replace(
            pos=jnp.where(moved, agent.pos + delta, agent.pos),
            base_heading=jnp.where(moved, cand_heading, agent.base_heading),
            cabin_heading=(agent.cabin_heading + cabin_delta) % geo.NUM_HEADINGS,
            wheel_angle=jnp.where(is_wheel_turn, new_wheel, agent.wheel_angle),
            loaded=new_loaded,
        )

        has_zones = state.has_dump_zones
        newly_dug = jnp.where(digging & ~dig["picked_up"], dig["dig_units"], 0)
        misplaced_delta = jnp.where(
            has_zones,
            jnp.where(digging, -dig["pickup_outside_zone"], 0)
            + jnp.where(dumping, dig["dump_units"] - dig["dump_on_zone"], 0),
            0,
        )
        dig_tiles_done = state.dig_tiles_done + newly_dug
        misplaced_soil = state.misplaced_soil + misplaced_delta
        task_done = (
            (dig_tiles_done >= state.dig_tiles_total) & (misplaced_soil == 0) & (new_loaded == 0)
        )
        age = state.age + 1
        recent_poses = action_rules.remember(
            cfg, state.recent_poses, self.pose_code(new_agent), is_do & do_effect
        )
        progress = dig_tiles_done - misplaced_soil
        steps_since_progress = jnp.where(
            progress > state.best_progress, 0, state.steps_since_progress + 1
        )
        stalled = (cfg.stall_steps > 0) & (steps_since_progress >= cfg.stall_steps)
        truncated = ((age >= cfg.max_steps) | stalled) & ~task_done

        terms = rewards.step_reward_terms(
            cfg.reward,
            dig_tiles_total=state.dig_tiles_total,
            dig_tiles_done=state.dig_tiles_done,
            misplaced_soil=state.misplaced_soil,
            next_dig_tiles_done=dig_tiles_done,
            next_misplaced_soil=misplaced_soil,
            collided=collided,
            moved_while_loaded=blocked_by_load,
            do_no_effect=is_do & ~do_effect,
            task_done=task_done,
        )
        reward = sum(terms.values())

        new_state = state.replace(
            agent=new_agent,
            action_map=geo.paste(state.action_map, new_w_action, window),
            dumpability=geo.paste(state.dumpability, new_w_dump, window),
            dig_tiles_done=dig_tiles_done,
            misplaced_soil=misplaced_soil,
            best_progress=jnp.maximum(state.best_progress, progress),
            steps_since_progress=steps_since_progress,
            last_actions=jnp.concatenate([action[None], state.last_actions[:-1]]),
            recent_poses=recent_poses,
            refused_digs=state.refused_digs & ~(is_do & do_effect),  # a new map: all afresh
            age=age,
            curriculum=self.update_curriculum(state.curriculum, task_done, truncated),
        )
        # The post-step observation is seen from the new pose inside the same window.
        new_window = window.shifted(new_agent.pos - agent.pos)
        view = (new_window, w_target, new_w_action, w_obstacles, new_w_dump)
        info = {
            "task_done": task_done,
            "truncated": truncated,
            "episode_progress": self.episode_progress(new_state),
            "reward_terms": terms,
            "curriculum_level": new_state.curriculum.level,
        }
        return new_state, reward, task_done, truncated, info, view

    def _candidate_pose(self, agent: AgentState, action: jax.Array):
        """Pose a base action would reach: (delta int32 [2], heading, wheel angle).

        Tracked: FORWARD/BACKWARD go straight; CLOCK/ANTICLOCK turn in place. Wheeled:
        FORWARD/BACKWARD follow an arc, turning the heading by the wheel angle and moving
        along the mean heading; WHEELS_LEFT/RIGHT change the wheel angle.
        """
        cfg = self.config
        is_wheeled = agent.agent_type == A.WHEELED
        direction = jnp.where(action == A.FORWARD, 1, jnp.where(action == A.BACKWARD, -1, 0))
        wheel = jnp.where(is_wheeled, agent.wheel_angle, 0)
        half_angle = (2 * agent.base_heading + direction * wheel) % (2 * geo.NUM_HEADINGS)
        delta = direction * jnp.asarray(self._displacements)[half_angle]
        turn = jnp.where(action == A.ANTICLOCK, 1, jnp.where(action == A.CLOCK, -1, 0))
        heading_change = jnp.where(is_wheeled, direction * wheel, turn)
        heading = (agent.base_heading + heading_change) % geo.NUM_HEADINGS
        wheel_change = jnp.where(
            action == A.WHEELS_LEFT, 1, jnp.where(action == A.WHEELS_RIGHT, -1, 0)
        )
        limit = cfg.wheel_angle_limit
        new_wheel = jnp.clip(agent.wheel_angle + wheel_change, -limit, limit)
        return delta.astype(jnp.int32), heading, new_wheel

    def pose_code(self, agent: AgentState, **replaced) -> jax.Array:
        """int32 []: `envs.action_rules.pose_code` of `agent` on this env's maps."""
        return action_rules.pose_code(self.config, agent, **replaced)

    def _pose_is_free(self, window, traversable, pos, delta, heading) -> jax.Array:
        """bool []: the footprint at pos + delta with `heading` is on the map and free."""
        on_map = geo.footprint_in_map(self._extents, pos + delta, heading, self.config.map_size)
        clear = geo.footprint_is_clear(self.config, traversable, pos + delta - window.start,
                                       heading)
        return on_map & clear

    def _workspace(self, agent: AgentState, window, w_obstacles, arm_sector=None) -> jax.Array:
        """bool [W, W]: tiles the arm reaches, minus the agent's own footprint and obstacles.
        `arm_sector` may pass the sector at the arm heading when it is already computed."""
        if arm_sector is None:
            arm = (agent.base_heading + agent.cabin_heading) % geo.NUM_HEADINGS
            arm_sector = geo.sector_masks(self.config, window, arm)
        under_agent = geo.footprint_mask(self.config, window, agent.base_heading)
        return arm_sector & ~under_agent & (w_obstacles == 0)

    def update_curriculum(self, curriculum: CurriculumState, success, timeout):
        """`envs.curriculum.advance` under this env's `CurriculumConfig`."""
        return curriculum_rules.advance(self.config.curriculum, curriculum, success, timeout)

    # ------------------------------------------------------------------ observation

    def observation(self, state: EnvState) -> dict:
        return self._observe(state, *self._window_layers(state))

    @property
    def checks_cut_off(self) -> bool:
        """Whether the action mask runs the cut-off flood fill (`mask_cut_off_digs` or
        `mask_cut_off_dumps`, with the mask computed)."""
        cfg = self.config
        return cfg.compute_action_mask and (cfg.mask_cut_off_digs or cfg.mask_cut_off_dumps)

    def observation_either_way(self, state: EnvState):
        """`state`'s observation both ways the cut-off test could answer, and that test's
        arguments, for a batch to run the flood fill only where the answer matters
        (`envs.batch.BatchEnv`; needs `checks_cut_off`).

        Returns (obs if no target is cut off, obs if one is, cut-off arguments): the
        observation is the first where `envs.reachability.make_targets_cut_off`'s test, run
        on the arguments (`cut_off_arguments`), is False, the second where it is True."""
        layers = self._window_layers(state)
        if_kept, arguments = self._observe_recording_cut_off(state, layers)
        if_cut = self._observe(state, *layers, targets_cut_off=lambda *_: jnp.ones((), bool))
        return if_kept, if_cut, arguments

    def cut_off_arguments(self, state: EnvState):
        """The arguments `state`'s observation passes the cut-off test: the target, action
        and obstacles maps int8 [N, N] with what DO would do pasted into the action map,
        pos int32 [2], heading int32 [], is_wheeled bool []. Of the observation's work, a
        compiled program keeps only what builds them (needs `checks_cut_off`)."""
        return self._observe_recording_cut_off(state, self._window_layers(state))[1]

    def _observe_recording_cut_off(self, state: EnvState, layers):
        """(the observation where no target is cut off, the cut-off test's arguments)."""
        recorded = []

        def record(*args):
            recorded.append(args)
            return jnp.zeros((), bool)

        obs = self._observe(state, *layers, targets_cut_off=record)
        (arguments,) = recorded
        return obs, arguments

    def remember_refusals(self, state: EnvState, obs: dict) -> EnvState:
        """`state` with the digs its observation's action mask refused
        (`EnvConfig.remember_refused_digs`; `state` itself where that is off)."""
        if "refused_digs" not in obs:
            return state
        return state.replace(refused_digs=obs["refused_digs"])

    def final_refusals(self, state: EnvState) -> jax.Array:
        """bool [N, N]: the `refused_digs` of `state`'s own observation, mask computed: what
        a training observation of this state carries, for an episode's last observation,
        which is taken without its mask."""
        return self.observation(state)["refused_digs"]

    def _window_layers(self, state: EnvState):
        """(window, target, action, obstacles, dumpability cropped to it [W, W])."""
        window = geo.make_window(state.agent.pos, self.config.map_size, self.config.window_radius)
        maps = (state.target_map, state.action_map, state.obstacles, state.dumpability)
        return (window, *(geo.crop(layer, window) for layer in maps))

    def action_mask(self, state: EnvState) -> jax.Array:
        """bool [8]: `obs["action_mask"]` of `state`: `valid_actions` less forbidden digs
        (dead ends, targets cut off), forbidden dumps (targets cut off, outside a zone in
        reach) and returns to a recent pose (see `EnvConfig`)."""
        return self.observation(state)["action_mask"]

    def valid_actions(self, state: EnvState) -> jax.Array:
        """bool [8]: True where the action would change the state; DO_NOTHING unless
        `EnvConfig.mask_do_nothing`. The action mask before its dig and revisit rules."""
        window, *layers = self._window_layers(state)
        arm = (state.agent.base_heading + state.agent.cabin_heading) % geo.NUM_HEADINGS
        arm_headings = (arm + jnp.arange(geo.NUM_HEADINGS)) % geo.NUM_HEADINGS
        return analytic_mask(
            self, state.agent, window, geo.sector_masks(self.config, window, arm_headings),
            *layers, state.last_actions[0], state.recent_poses, state.has_dump_zones,
            valid_only=True,
        )

    def episode_progress(self, state: EnvState) -> jax.Array:
        """float32 []: fraction of the dig target done, 0..1."""
        total = jnp.maximum(state.dig_tiles_total, 1)
        return (state.dig_tiles_done / total).astype(jnp.float32)

    def _observe(self, state, window, w_target, w_action, w_obstacles, w_dump,
                 with_action_mask: bool = True, targets_cut_off=None) -> dict:
        cfg = self.config
        agent = state.agent
        arm = (agent.base_heading + agent.cabin_heading) % geo.NUM_HEADINGS
        arm_headings = (arm + jnp.arange(geo.NUM_HEADINGS)) % geo.NUM_HEADINGS
        sectors = geo.sector_masks(cfg, window, arm_headings)  # [12, W, W], index 0 = arm
        layers = jnp.stack(
            [
                jnp.maximum(-w_action, 0),
                jnp.maximum(w_action, 0),
                w_target == -1,
                w_target == 1,
                w_dump == 1,
                w_obstacles == 1,
            ]
        ).astype(jnp.int8)
        local_maps = geo.sector_sums(sectors, layers)
        if cfg.compute_action_mask and with_action_mask:
            mask = analytic_mask(
                self, agent, window, sectors, w_target, w_action, w_obstacles, w_dump,
                state.last_actions[0], state.recent_poses, state.has_dump_zones,
                full_maps=(state.target_map, state.action_map, state.obstacles),
                targets_cut_off=targets_cut_off,
            )
        else:
            mask = jnp.ones((A.NUM_ACTIONS,), bool)
        extra = {}
        if cfg.remember_refused_digs:
            refused = state.refused_digs
            if cfg.compute_action_mask and with_action_mask:
                workspace = self._workspace(agent, window, w_obstacles, sectors[0])
                diggable = excavation.diggable(workspace, w_target, w_action)
                refused_here = diggable & ~mask[A.DO] & (agent.loaded == 0)
                # Only the window can gain a refusal: O(W^2), not O(N^2).
                refused = geo.paste(refused, geo.crop(refused, window) | refused_here, window)
            extra["refused_digs"] = refused
        agent_state = jnp.stack(
            [
                agent.pos[0],
                agent.pos[1],
                agent.base_heading,
                agent.cabin_heading,
                agent.wheel_angle,
                agent.loaded,
            ]
        )
        return {
            "agent_state": agent_state.astype(jnp.int32),
            "agent_type": agent.agent_type,
            "local_maps": local_maps,
            "target_map": state.target_map,
            "action_map": state.action_map,
            "obstacles": state.obstacles,
            "dumpability": state.dumpability,
            "last_actions": state.last_actions,
            "action_mask": mask,
            **extra,
        }
