"""BatchEnv: valid spawns, no host callbacks, map pools from datasets and the curriculum.

Fast reset against the unconditional reference (final observations included), batch
timeouts without the terminal bonus and staggered ages are validation gates
(synthetic-batch-step-fast-reset, terminal-reward-only-on-task-done, env-episode-progress)
run by tests/test_validation.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from footprints import footprint_is_free

from envs import CurriculumConfig, EnvConfig, ExcavationEnv, make_env_params
from envs import actions as A
from envs import env as env_module
from envs.dataset import DatasetError, save_map_dataset
from envs.maps import MAP_TYPES, MapSet, generate_maps
from envs.params import params_from_maps


def test_reset_spawns_valid_poses(env16, params16):
    keys = jax.random.split(jax.random.PRNGKey(9), 256)
    _, states = jax.jit(jax.vmap(env16.reset, in_axes=(0, None)))(keys, params16)
    cfg = env16.config
    for pos, heading, target, obstacles in zip(
        np.asarray(states.agent.pos), np.asarray(states.agent.base_heading),
        np.asarray(states.target_map), np.asarray(states.obstacles), strict=True,
    ):
        blocked = (obstacles == 1) | (target != 0)
        assert footprint_is_free(cfg.footprint_length, cfg.footprint_width, pos, heading, blocked)
        assert _room_is_clear(cfg, pos, obstacles)


def _room_is_clear(cfg, pos, obstacles) -> bool:
    """Every tile within `room_to_manoeuvre` of pos is on the map and free of obstacles."""
    from envs.spawn import room_to_manoeuvre

    room, n = room_to_manoeuvre(cfg), obstacles.shape[0]
    rows, cols = np.mgrid[:n, :n]
    near = (rows - pos[0]) ** 2 + (cols - pos[1]) ** 2 <= room**2
    reach = int(np.floor(room))
    on_map = reach <= pos[0] < n - reach and reach <= pos[1] < n - reach
    return on_map and not obstacles[near].any()


def test_spawns_leave_room_to_turn_and_drive(env16):
    """Obstacle walls every 3 columns: the 1-tile-wide footprint fits in the corridors
    between them, but an excavator there could not turn. Every spawn is then in the map's
    clear square, never in a corridor."""
    obstacles = np.zeros((1, 16, 16), np.int8)
    obstacles[0, :, 2::3] = 1
    obstacles[0, 5:12, 5:12] = 0  # the spawn square, clear
    target = np.zeros((1, 16, 16), np.int8)
    target[0, 1, 1] = -1
    maps = MapSet(target, obstacles, 1 - obstacles, np.zeros(1, np.int8),
                  np.array([[8, 8]], np.int32))
    params = params_from_maps(maps)
    keys = jax.random.split(jax.random.PRNGKey(2), 64)
    _, states = jax.jit(jax.vmap(env16.reset, in_axes=(0, None)))(keys, params)
    positions = np.asarray(states.agent.pos)
    assert ((positions >= 5) & (positions <= 11)).all(), positions
    assert all(_room_is_clear(env16.config, pos, obstacles[0]) for pos in positions)


def test_spawn_falls_back_to_the_guaranteed_square(env16):
    """Only the 7x7 spawn square is free: random candidates nearly always fail."""
    obstacles = np.ones((1, 16, 16), np.int8)
    obstacles[0, 5:12, 5:12] = 0
    target = np.zeros((1, 16, 16), np.int8)
    obstacles[0, 1, 1], target[0, 1, 1] = 0, -1
    maps = MapSet(target, obstacles, 1 - obstacles, np.zeros(1, np.int8),
                  np.array([[8, 8]], np.int32))
    params = params_from_maps(maps)
    keys = jax.random.split(jax.random.PRNGKey(1), 64)
    _, states = jax.jit(jax.vmap(env16.reset, in_axes=(0, None)))(keys, params)
    cfg = env16.config
    for pos, heading in zip(np.asarray(states.agent.pos), np.asarray(states.agent.base_heading),
                            strict=True):
        assert footprint_is_free(cfg.footprint_length, cfg.footprint_width, pos, heading,
                                 (obstacles[0] == 1) | (target[0] != 0))


def test_batch_step_has_no_host_callbacks_and_one_unbatched_cond(batch16, params16):
    _, state = jax.eval_shape(batch16.reset, jax.random.PRNGKey(0), params16)
    actions = jnp.zeros((batch16.num_envs,), jnp.int32)
    jaxpr = jax.make_jaxpr(batch16.step)(jax.random.PRNGKey(0), state, actions, params16)
    text = str(jaxpr)
    assert "callback" not in text
    top_level = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    assert top_level.count("cond") == 1  # the reset branch, guarded by jnp.any(done)
    (reset_cond,) = [eqn for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "cond"]
    assert reset_cond.invars[0].aval.shape == ()  # one unbatched predicate


def test_batch_step_traces_the_action_mask_once(batch16, params16, monkeypatch):
    """The mask's searches are the costliest part of an env step to compile: the batch
    step computes them once, on the states after its resets, not once in the step and
    again for the reset envs."""
    _, state = jax.eval_shape(batch16.reset, jax.random.PRNGKey(0), params16)
    traced = []
    env = batch16.env
    original = env_module.analytic_mask
    monkeypatch.setattr(env_module, "analytic_mask",
                        lambda *args, **kwargs: traced.append(1) or original(*args, **kwargs))
    actions = jnp.zeros((batch16.num_envs,), jnp.int32)
    jax.make_jaxpr(batch16.step)(jax.random.PRNGKey(0), state, actions, params16)
    assert env.config.compute_action_mask and len(traced) == 1


def test_dataset_pool_and_environment_variables(tmp_path, monkeypatch, env16):
    maps = generate_maps(("trenches",), 16, 12, seed=4, spawn_clearance=3)
    save_map_dataset(maps, tmp_path / "ds", seed=4, types=("trenches",), spawn_clearance=3)
    params = make_env_params(env16.config, dataset_path=tmp_path / "ds", dataset_size=5)
    assert params.num_maps == 5
    np.testing.assert_array_equal(np.asarray(params.target_map), maps.target_map[:5])
    monkeypatch.setenv("DATASET_PATH", str(tmp_path / "ds"))
    monkeypatch.setenv("DATASET_SIZE", "7")
    assert make_env_params(env16.config).num_maps == 7
    monkeypatch.setenv("DATASET_SIZE", "seven")
    with pytest.raises(DatasetError, match="DATASET_SIZE must be an integer"):
        make_env_params(env16.config)
    monkeypatch.delenv("DATASET_SIZE")
    with pytest.raises(DatasetError, match="16x16 but the env expects 32x32"):
        make_env_params(EnvConfig(map_size=32), dataset_path=tmp_path / "ds")


def test_curriculum_promotes_demotes_and_samples_its_level(params16):
    env = ExcavationEnv(EnvConfig(map_size=16, curriculum=CurriculumConfig(
        levels=("foundations", "trenches"), promote_after=2, demote_after=3)))
    zero = jnp.zeros((), jnp.int32)
    from envs.state import CurriculumState

    state = CurriculumState(zero, zero, zero)
    levels = []
    for success, timeout in [(1, 0), (1, 0), (0, 0), (0, 1), (0, 1), (0, 1), (1, 0)]:
        state = env.update_curriculum(state, jnp.bool_(success), jnp.bool_(timeout))
        levels.append(int(state.level))
    assert levels == [0, 1, 1, 1, 1, 0, 0]

    keys = jax.random.split(jax.random.PRNGKey(0), 64)
    reset = jax.jit(jax.vmap(env.reset_episode, in_axes=(0, None, None, None)))
    for level, name in enumerate(("foundations", "trenches")):
        curriculum = CurriculumState(jnp.int32(level), zero, zero)
        _, states = reset(keys, params16, jnp.int32(A.TRACKED), curriculum)
        map_types = np.asarray(params16.map_type)[np.asarray(states.map_index)]
        assert (map_types == MAP_TYPES.index(name)).all()


def test_final_observations_observe_only_the_finished_envs(batch16, params16):
    """`BatchEnv.step` observes a pre-reset state only where its episode ended, a few envs a
    pass: each final observation equals, leaf for leaf, `step_no_reset`'s observation
    without a mask where the env finished (seven at once here, seven passes), and the new
    observation where it goes on; `step_without_observation` is `step_no_reset` less its
    observation. Two steps: the forced timeouts, then random actions."""
    env = batch16.env
    _, state = jax.jit(batch16.reset)(jax.random.PRNGKey(0), params16)
    finishing = jnp.arange(batch16.num_envs) < 7
    state = state.replace(age=jnp.where(finishing, env.config.max_steps - 1, state.age))
    assert batch16.max_partial_resets < 7

    @jax.jit
    def step_and_reference(key, state, actions):
        obs, new_state, _, terminated, truncated, info = batch16.step(key, state, actions,
                                                                      params16)
        without_mask = functools.partial(env.step_no_reset, with_action_mask=False)
        keys = jax.random.split(key, batch16.num_envs)
        pre_reset, *stepped = jax.vmap(without_mask, in_axes=(0, 0, 0, None))(
            keys, state, actions, params16)
        unobserved = jax.vmap(env.step_without_observation, in_axes=(0, 0, 0, None))(
            keys, state, actions, params16)
        info_without_mask = {k: v for k, v in stepped[-1].items() if k != "action_mask"}
        same = jax.tree.map(jnp.array_equal, (*stepped[:-1], info_without_mask), unobserved)
        done = terminated | truncated
        expected = jax.tree.map(
            lambda a, b: jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b),
            pre_reset, obs)
        return new_state, done, info["final_observation"], expected, obs, same

    dones = []
    for key in jax.random.split(jax.random.PRNGKey(3), 2):
        key_action, key_step = jax.random.split(key)
        actions = jax.random.randint(key_action, (batch16.num_envs,), 0, A.NUM_ACTIONS)
        state, done, final, expected, obs, same = step_and_reference(key_step, state, actions)
        assert all(jax.tree.leaves(same))  # the step less its observation: the same step
        dones.append(np.asarray(done))
        assert set(final) == set(obs)
        for name in final:
            assert final[name].dtype == obs[name].dtype, name
            np.testing.assert_array_equal(final[name], expected[name], err_msg=name)
        assert np.asarray(final["action_mask"])[np.asarray(done)].all()
    assert dones[0][:7].all()
