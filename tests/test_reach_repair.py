"""`terra_rl.perf.reach_repair`: the census of the cut-off tests a rollout runs. Wherever its
local repair of the reachable poses answers, the repaired set equals the flood fill's from
scratch (`wrong` never holds), on the states of random masked rollouts at 16x16; and
`scripts/measure_reach_repair.py`'s summary and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_trainer import load_script

from envs import EnvConfig, ExcavationEnv, reachability
from envs.batch import BatchEnv
from terra_rl.perf.reach_repair import (
    make_local_repair,
    make_repair_census,
    make_tracked_fill,
    sweep_seconds,
)
from terra_rl.validation import small

NUM_ENVS = 16
STEPS = 48
MARGINS = (3, 6)


def tracked_rules_env(**overrides) -> ExcavationEnv:
    fields = dict(map_size=16, max_steps=40, wheeled_fraction=0.0, mask_cut_off_digs=True,
                  mask_cut_off_dumps=True, remember_refused_digs=True)
    return ExcavationEnv(EnvConfig(**(fields | overrides)))


@pytest.fixture(scope="module")
def counts():
    """The census of every state of a random masked rollout, [STEPS * NUM_ENVS] arrays."""
    env = tracked_rules_env()
    batch = BatchEnv(env, small.small_params(), NUM_ENVS)

    @jax.jit
    def states(key):
        obs, state = batch.reset(key)

        def body(carry, key):
            obs, state = carry
            key_action, key_step = jax.random.split(key)
            actions = jax.random.categorical(
                key_action, jnp.where(obs["action_mask"], 0.0, -1e9)).astype(jnp.int32)
            obs, next_state, *_ = batch.step(key_step, state, actions)
            return (obs, next_state), state

        return jax.lax.scan(body, (obs, state), jax.random.split(key, STEPS))[1]

    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), states(jax.random.PRNGKey(5)))
    return {k: np.asarray(v) for k, v in make_repair_census(env, MARGINS)(flat).items()}


def test_the_repair_equals_the_fill_from_scratch_wherever_it_answers(counts):
    tested = counts["tested"]
    assert tested.sum() > 50  # the rollout's states ask the test
    removed = tested & ~counts["unchanged"]
    assert removed.sum() > 10  # and some of its DOs remove reachable poses
    for margin in MARGINS:
        accepted = counts[f"accepted_{margin}"]
        assert not counts[f"wrong_{margin}"].any()
        assert (accepted & removed).sum() > 10  # repairs that did work, every one exact
        # Nothing removed: the kept set answers with no fill and no window.
        assert accepted[counts["unchanged"]].all()
        assert (counts[f"sweeps_{margin}"][counts["unchanged"]] == 0).all()
        assert (counts[f"window_{margin}"][counts["unchanged"]] == 0).all()
        assert (counts[f"sweeps_{margin}"][removed & accepted] > 0).all()
        windows = counts[f"window_{margin}"][removed]
        assert (windows > 0).all() and (windows <= 16 * 16).all()
    # A wider window sees at least as many paths around what the DO removed.
    assert counts[f"accepted_{MARGINS[1]}"].sum() >= counts[f"accepted_{MARGINS[0]}"].sum()
    assert (counts["unchanged"] <= counts["connected"]).all()
    assert not (counts["unchanged"] & counts["grew"]).any()
    assert (counts["global_sweeps"] > 0).all()


def test_the_census_refuses_an_env_it_cannot_measure():
    with pytest.raises(ValueError, match="no cut-off test"):
        make_repair_census(tracked_rules_env(mask_cut_off_digs=False, mask_cut_off_dumps=False))
    with pytest.raises(ValueError, match="tracked excavators only"):
        make_repair_census(tracked_rules_env(wheeled_fraction=0.5))
    with pytest.raises(ValueError, match="margins must be more than 2"):
        make_repair_census(tracked_rules_env(), margins=(2, 8))


def test_the_summary_shares_are_of_the_tested_states():
    script = load_script("measure_reach_repair")
    tested = np.array([True, True, True, False])
    counts = {"tested": tested, "cut": np.array([False, True, False, True]),
              "unchanged": np.array([True, False, False, True]),
              "connected": np.array([True, True, False, True]),
              "grew": np.array([False, False, True, False]),
              "global_sweeps": np.array([10, 20, 30, 99]),
              "accepted_4": np.array([True, True, False, True]),
              "wrong_4": np.zeros(4, bool),
              "sweeps_4": np.array([0, 12, 40, 0]), "window_4": np.array([0, 100, 300, 0])}
    result = script.summary(counts, (4,))
    assert (result["states"], result["tests"]) == (4, 3)
    assert result["cut"] == pytest.approx(1 / 3)
    assert result["unchanged"] == pytest.approx(1 / 3)
    assert result["connected"] == pytest.approx(2 / 3)
    assert result["grew"] == pytest.approx(1 / 3)
    assert result["global_sweeps"] == pytest.approx(20.0)
    # The repair's sweeps and window: over the tested states it answered with a fill.
    assert result["margin_4"] == {"accepted": pytest.approx(2 / 3), "wrong": 0,
                                  "sweeps": 12.0, "window_tiles": 100.0}


@pytest.mark.parametrize(("flags", "message"), [
    (["--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["--margins", "4,x"], "--margins takes integers separated by commas"),
])
def test_bad_census_flags_are_one_line(capsys, flags, message):
    script = load_script("measure_reach_repair")
    with pytest.raises(SystemExit) as error:
        script.main(["--config", "cpu_small_maps", *flags])
    assert error.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("measure_reach_repair.py: error:") and message in err
    assert "\n" not in err


def positions_to_poses(mask: np.ndarray) -> jax.Array:
    """Packed pose sets: every heading at the positions of `mask` bool [N, N]."""
    return reachability.pack(jnp.broadcast_to(jnp.asarray(mask), (12, *mask.shape)))


@pytest.mark.parametrize("case", ["pocket", "trapped", "split"])
def test_the_repair_drops_pockets_and_declines_a_split(case):
    """On an open 16x16 map, poses removed around a pocket (a square ring three positions
    wide, wider than a move) or across the map (three columns): the repair drops a pocket
    the agent is outside, keeps only the pocket the agent is in, and does not answer where
    the rest falls into two parts open to the window's band. What it answers equals a fill
    from scratch."""
    config = EnvConfig(map_size=16)
    size = config.map_size
    fill = jax.jit(make_tracked_fill(config))
    empty = jnp.zeros((size, size), jnp.int8)
    free = reachability.make_free_poses(config)(empty, empty)
    rows, cols = np.mgrid[:size, :size]
    ring = np.maximum(abs(rows - 8), abs(cols - 8))
    removed_at = {"pocket": (ring >= 2) & (ring <= 4), "trapped": (ring >= 2) & (ring <= 4),
                  "split": (cols >= 7) & (cols <= 9)}[case]
    agent = (8, 8) if case == "trapped" else (8, 3)
    start = reachability.start_poses(jnp.asarray([agent], jnp.int32), jnp.zeros(1, jnp.int32),
                                     size)[0]
    reach0, _ = fill(start, free)
    kept = reach0 & ~positions_to_poses(removed_at)
    expected, _ = fill(start, kept)
    repair = jax.jit(make_local_repair(config, margin=3))
    answers, reach1, sweeps, tiles = repair(reach0, kept, start)
    reached = np.asarray(reachability.unpack(expected, size)).any(axis=0)
    if case == "split":
        assert not answers
        assert reached[:, :7].any() and not reached[:, 10:].any()
        return
    assert answers and sweeps > 0 and tiles > 0
    np.testing.assert_array_equal(np.asarray(reach1), np.asarray(expected))
    pocket = ring <= 1
    if case == "pocket":  # everything but the pocket and its ring
        assert not reached[pocket].any() and reached[ring >= 6].any()
    else:  # the pocket alone
        assert reached[pocket].any() and not reached[~pocket].any()


def test_sweep_seconds_times_each_size():
    seconds = sweep_seconds(EnvConfig(map_size=16), (8, 16), envs=2, sweeps=2, rounds=1)
    assert list(seconds) == [8, 16]
    assert all(np.isfinite(s) and s > 0 for s in seconds.values())
