"""The policy inputs' work kept through a rollout (`terra_rl.features.reach_cache`): at
every step the goals equal `work_in_reach` of that step's observation, the pose distances
`pose_distances` of it, the dig distances `field_at` of it and the pooled map layers
`pooled_map_layers` of it, bit for bit, on
random masked rollouts with resets, remembered refusals and both excavator types (and
tracked only, with the search over their states), in one pass or many; only envs whose maps
changed are recomputed and the kept searches are swept on, not redone; the policy reads what
the cache adds and a rollout does not store it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import EnvConfig, ExcavationEnv
from envs.batch import BatchEnv
from terra_rl.adapters.train_env import ExcavationTrainEnv
from terra_rl.algo.rollout import Choice, RolloutCarry, Step, rollout
from terra_rl.features.dig_distance import feature_tiles, field_at, work_in_reach
from terra_rl.features.global_maps import map_input, pooled_map_layers
from terra_rl.features.policy_inputs import derived_features
from terra_rl.features.pose_distance import pose_distances
from terra_rl.features.reach_cache import (
    CACHE_KEYS,
    DIG_DISTANCES_KEY,
    IN_REACH_KEY,
    MAP_KEYS,
    POOLED_MAPS_KEY,
    POSE_DISTANCES_KEY,
    default_chunk,
    make_reach_cache,
)
from terra_rl.nets.models import PolicyConfig, make_observation_cache, with_derived_features
from terra_rl.validation import small

NUM_ENVS = 16
STEPS = 48
POOL = 2


def make_batch(wheeled_fraction: float) -> BatchEnv:
    env = ExcavationEnv(EnvConfig(map_size=16, max_steps=40, wheeled_fraction=wheeled_fraction,
                                  mask_cut_off_digs=True, remember_refused_digs=True))
    return BatchEnv(env, small.small_params(), NUM_ENVS)


@pytest.fixture(scope="module")
def batch():
    return make_batch(0.5)


def dig_field(obs, goals):
    """int32 [num_envs, 13]: the dig-distance field from scratch at the agent's tiles."""
    return field_at(obs, *feature_tiles(obs["agent_state"]), goals)


def cached_along_a_rollout(batch, chunk: int, wheeled_agents: bool = True):
    """Per step of a random masked rollout with the cache: whether the goals, the pose and
    dig distances, and the map layers pooled by `POOL`, the choice saw equal those computed
    from its observation alone, and how many envs' maps changed since the step before."""
    cache = make_reach_cache(NUM_ENVS, chunk, wheeled_agents=wheeled_agents, map_pool=POOL)

    def run(key):
        key_reset, key_run = jax.random.split(key)
        obs, state = batch.reset(key_reset)

        def choose(previous, obs, key) -> Choice:
            key_action, key_env = jax.random.split(key)
            plain = {k: v for k, v in obs.items() if k not in CACHE_KEYS}
            goals = work_in_reach(plain)
            same_goals = jnp.array_equal(obs[IN_REACH_KEY], goals)
            same_distances = (
                jnp.array_equal(obs[POSE_DISTANCES_KEY],
                                pose_distances(plain, goals, wheeled_agents))
                & jnp.array_equal(obs[DIG_DISTANCES_KEY], dig_field(plain, goals))
                & jnp.array_equal(obs[POOLED_MAPS_KEY], pooled_map_layers(plain, POOL)))
            changed = jnp.zeros((NUM_ENVS,), bool)
            for name in MAP_KEYS:
                changed |= jnp.any(obs[name] != previous[name], axis=(-2, -1))
            action = jax.random.categorical(
                key_action, jnp.where(obs["action_mask"], 0.0, -1e9)).astype(jnp.int32)
            return Choice(action, key_env, (same_goals, same_distances, jnp.sum(changed), plain))

        def record(_, step: Step):
            *same, changed, plain = step.choice.kept
            return {name: plain[name] for name in MAP_KEYS}, (*same, changed)

        maps = {name: obs[name] for name in MAP_KEYS}
        carry = RolloutCarry(state, obs, maps)
        _, per_step = rollout(ExcavationTrainEnv(batch), batch.params, choose, record, carry,
                              jax.random.split(key_run, STEPS), cache=cache)
        return per_step

    return [np.asarray(x) for x in jax.jit(run)(jax.random.PRNGKey(5))]


@pytest.mark.parametrize("chunk", [1, 2])
def test_the_kept_work_equals_the_work_from_scratch_at_every_step(batch, chunk):
    same_goals, same_distances, changed = cached_along_a_rollout(batch, chunk)
    assert same_goals.all(), np.nonzero(~same_goals)
    assert same_distances.all(), np.nonzero(~same_distances)
    # The maps changed (DOs and resets) in some envs on some steps, never in all at once after
    # the first, and on some step in more envs than one pass takes.
    assert changed[1:].sum() > 0 and (changed[1:] < NUM_ENVS).all()
    assert changed[1:].max() > chunk


def test_the_tracked_only_search_is_kept_exactly_too():
    same_goals, same_distances, _ = cached_along_a_rollout(make_batch(0.0), 2,
                                                           wheeled_agents=False)
    assert same_goals.all() and same_distances.all()


def test_only_envs_whose_maps_changed_are_recomputed(batch):
    obs, _ = jax.jit(batch.reset)(jax.random.PRNGKey(2))
    cache = make_reach_cache(NUM_ENVS, 2)
    refresh = jax.jit(cache.refresh)
    state, first = refresh(cache.init(obs), obs)
    np.testing.assert_array_equal(first[IN_REACH_KEY], work_in_reach(obs))
    np.testing.assert_array_equal(first[POSE_DISTANCES_KEY],
                                  pose_distances(obs, work_in_reach(obs)))
    np.testing.assert_array_equal(first[DIG_DISTANCES_KEY], dig_field(obs, work_in_reach(obs)))
    # The same observation again: nothing to sweep, every search kept as it was.
    again, _ = refresh(state, obs)
    for kept, before in zip(jax.tree.leaves((again.search, again.dig_search)),
                            jax.tree.leaves((state.search, state.dig_search)), strict=True):
        np.testing.assert_array_equal(kept, before)
    # Wrong goals in every env: kept where the maps are the same, replaced in env 3, whose
    # action map changed.
    planted = state._replace(in_reach=~state.in_reach)
    changed = dict(obs, action_map=obs["action_map"].at[3, 0, 0].add(1))
    _, second = refresh(planted, changed)
    expected = (~state.in_reach).at[3].set(work_in_reach(changed)[3])
    np.testing.assert_array_equal(second[IN_REACH_KEY], expected)
    # A state never refreshed is stale everywhere, whatever its maps.
    _, fresh = refresh(cache.init(obs)._replace(in_reach=~state.in_reach), obs)
    np.testing.assert_array_equal(fresh[IN_REACH_KEY], work_in_reach(obs))


def test_a_kept_search_sweeps_on_from_where_it_stopped(batch):
    """Queries beyond the kept search's sweeps extend it: the sweeps only grow, and the
    distances are those of a search from scratch."""
    obs, _ = jax.jit(batch.reset)(jax.random.PRNGKey(2))
    cache = make_reach_cache(NUM_ENVS, 4)
    refresh = jax.jit(cache.refresh)
    state, _ = refresh(cache.init(obs), obs)
    # Every agent moved to the map's far corner, the maps unchanged.
    far = obs["agent_state"].at[:, 0].set(15).at[:, 1].set(15)
    moved = dict(obs, agent_state=far)
    extended, out = refresh(state, moved)
    for search, before in ((extended.search, state.search),
                           (extended.dig_search, state.dig_search)):
        assert (search.sweeps >= before.sweeps).all()
        assert (search.sweeps > before.sweeps).any()
    np.testing.assert_array_equal(out[POSE_DISTANCES_KEY],
                                  pose_distances(moved, work_in_reach(moved)))
    np.testing.assert_array_equal(out[DIG_DISTANCES_KEY], dig_field(moved, work_in_reach(moved)))


def test_the_policy_reads_the_kept_goals_and_a_rollout_does_not_store_them(batch):
    obs, _ = jax.jit(batch.reset)(jax.random.PRNGKey(2))
    config = PolicyConfig(dig_distance=True, pose_distance=True)
    computed = derived_features(obs, config)
    kept = derived_features({**obs, IN_REACH_KEY: work_in_reach(obs)}, config)
    other = derived_features({**obs, IN_REACH_KEY: jnp.zeros_like(work_in_reach(obs))}, config)
    for key in ("dig_distance", "pose_distance"):
        np.testing.assert_array_equal(kept[key], computed[key])
        assert not np.array_equal(other[key], computed[key])  # read, not recomputed
    assert make_observation_cache(_policy(config), NUM_ENVS) is not None
    no_distances = PolicyConfig(dig_distance=False, pose_distance=False)
    assert make_observation_cache(_policy(no_distances), NUM_ENVS) is None
    pose = pose_distances(obs, work_in_reach(obs))
    with_pose = derived_features({**obs, POSE_DISTANCES_KEY: pose + 1}, config)
    assert not np.array_equal(with_pose["pose_distance"], computed["pose_distance"])
    dig = dig_field(obs, work_in_reach(obs))
    with_dig = derived_features({**obs, DIG_DISTANCES_KEY: dig + 1}, config)
    assert not np.array_equal(with_dig["dig_distance"], computed["dig_distance"])
    added = {**obs, IN_REACH_KEY: work_in_reach(obs), POSE_DISTANCES_KEY: pose,
             DIG_DISTANCES_KEY: dig}
    for key in ("dig_distance", "pose_distance"):
        np.testing.assert_array_equal(derived_features(added, config)[key], computed[key])
    stored = with_derived_features(_policy(config), added)
    assert not set(CACHE_KEYS) & set(stored) and "dig_distance" in stored


def test_pooled_maps_alone_are_kept_and_read_by_the_map_input(batch):
    """A cache for the pooled maps only (a flat encoder without the distances) adds them and
    nothing else; the map input built from them equals the one built from the maps, and is
    read from them, not recomputed."""
    obs, _ = jax.jit(batch.reset)(jax.random.PRNGKey(2))
    cache = make_reach_cache(NUM_ENVS, 4, pose_distances=False, dig_distances=False,
                             map_pool=POOL)
    state, out = jax.jit(cache.refresh)(cache.init(obs), obs)
    assert set(out) - set(obs) == {POOLED_MAPS_KEY} and state.search is None
    pooled = out[POOLED_MAPS_KEY]
    assert pooled.shape == (NUM_ENVS, 16 // POOL, 16 // POOL, 6) and pooled.dtype == jnp.float32
    np.testing.assert_array_equal(pooled, pooled_map_layers(obs, POOL))
    np.testing.assert_array_equal(map_input(obs, POOL, pooled), map_input(obs, POOL))
    assert not np.array_equal(map_input(obs, POOL, pooled + 1), map_input(obs, POOL))
    flat = PolicyConfig("flat", 32, 32, dig_distance=False, pose_distance=False, map_pool=POOL)
    assert (make_observation_cache(_policy(flat), NUM_ENVS) is not None) == (
        jax.default_backend() == "cpu")
    with pytest.raises(ValueError, match="map_pool must be >= 0"):
        make_reach_cache(NUM_ENVS, 4, map_pool=-1)


def test_the_default_chunk_and_bad_chunks():
    assert [default_chunk(n, "cpu") for n in (1, 16, 64, 65)] == [1, 1, 4, 5]
    assert [default_chunk(n, "gpu") for n in (1, 16, 1024)] == [1, 8, 512]
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        make_reach_cache(NUM_ENVS, 0)


def _policy(config: PolicyConfig):
    from terra_rl.nets.models import ExcavationPolicy

    return ExcavationPolicy(config, num_actions=8)


def test_only_the_wanted_envs_are_refreshed(batch):
    """`refresh(..., only)` redoes and sweeps the wanted envs alone: the others keep what the
    state held and stay stale, and a later full refresh completes them, keeping the rest."""
    obs, _ = jax.jit(batch.reset)(jax.random.PRNGKey(2))
    cache = make_reach_cache(NUM_ENVS, 2)
    refresh = jax.jit(cache.refresh)
    only = jnp.arange(NUM_ENVS) % 3 == 0
    empty = cache.init(obs)
    state, out = refresh(empty, obs, only)
    goals = work_in_reach(obs)
    np.testing.assert_array_equal(state.fresh, only)
    wanted, other = np.asarray(only), ~np.asarray(only)
    np.testing.assert_array_equal(out[IN_REACH_KEY][wanted], goals[wanted])
    assert not np.asarray(out[IN_REACH_KEY])[other].any()
    np.testing.assert_array_equal(out[POSE_DISTANCES_KEY][wanted],
                                  pose_distances(obs, goals)[wanted])
    np.testing.assert_array_equal(out[DIG_DISTANCES_KEY][wanted], dig_field(obs, goals)[wanted])
    for search, before in zip(jax.tree.leaves((state.search, state.dig_search)),
                              jax.tree.leaves((empty.search, empty.dig_search)), strict=True):
        np.testing.assert_array_equal(np.asarray(search)[other], np.asarray(before)[other])
    full, completed = refresh(state, obs)
    assert np.asarray(full.fresh).all()
    np.testing.assert_array_equal(completed[IN_REACH_KEY], goals)
    np.testing.assert_array_equal(completed[POSE_DISTANCES_KEY], pose_distances(obs, goals))
    for search, before in zip(jax.tree.leaves((full.search, full.dig_search)),
                              jax.tree.leaves((state.search, state.dig_search)), strict=True):
        np.testing.assert_array_equal(np.asarray(search)[wanted], np.asarray(before)[wanted])


def test_the_bootstrap_reads_the_rollouts_cache_and_equals_the_plain_one(batch):
    """The bootstrap's values with the rollout's cache (its last observations refreshed from
    the cache's state, the truncated rows' keys computed from scratch) equal those without it
    bit for bit, over three passes; the first pass reads the cache's state."""
    from terra_rl.algo.final_observations import from_stacked
    from terra_rl.algo.update import make_bootstrap_values_fn, policy_outputs

    config = PolicyConfig("flat", 32, 32, dig_distance=True, pose_distance=True, map_pool=POOL)
    policy = _policy(config)
    obs, state = jax.jit(batch.reset)(jax.random.PRNGKey(3))
    params = jax.jit(policy.init)(jax.random.PRNGKey(0), obs)
    cache = make_observation_cache(policy, NUM_ENVS)
    cache_state, _ = jax.jit(cache.refresh)(cache.init(obs), obs)
    actions = jax.random.randint(jax.random.PRNGKey(4), (NUM_ENVS,), 0, 8)
    last_obs = jax.jit(batch.step)(jax.random.PRNGKey(5), state, actions)[0]
    steps = 3
    final_obs = jax.tree.map(lambda x, y: jnp.stack([x, y, x]), obs, last_obs)
    truncated = jax.random.bernoulli(jax.random.PRNGKey(6), 0.6, (steps, NUM_ENVS))
    assert NUM_ENVS < int(truncated.sum()) < steps * NUM_ENVS  # three passes, one part-full

    def outputs(params, obs):
        return policy_outputs(policy, params, obs, True)

    finals = from_stacked(final_obs, truncated)
    plain = jax.jit(make_bootstrap_values_fn(outputs, NUM_ENVS), static_argnums=3)
    cached = jax.jit(make_bootstrap_values_fn(outputs, NUM_ENVS, cache), static_argnums=3)
    expected = plain(params, last_obs, finals, steps)
    got = cached(params, last_obs, finals, steps, cache_state)
    for value, reference in zip(got, expected, strict=True):
        np.testing.assert_array_equal(value, reference)
    assert np.asarray(got[1])[~np.asarray(truncated)].max() == 0
    _, value = jax.jit(outputs)(params, last_obs)
    np.testing.assert_array_equal(got[0], value)
    # Wrong distances kept for the unchanged envs change their last values: they are read.
    search = cache_state.search
    planted = cache_state._replace(search=search._replace(planes=~search.planes))
    misled = cached(params, last_obs, finals, steps, planted)
    assert not np.array_equal(misled[0], got[0])
    np.testing.assert_array_equal(misled[1], got[1])
