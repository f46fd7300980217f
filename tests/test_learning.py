"""PPO learns to finish a task: on one-tile trench maps, greedy completion on held-out maps
goes from 0 to above 90% within a fixed number of updates (counted, never timed), on at least
2 of 3 seeds. A seed passes when one of its evaluations after 100, 120, 140 and 160 updates
reaches 90%, none of them is below 75%, and its successful episodes are shorter than the
horizon.

The maps: a free 10x10 square (the rest obstacles) with one tile to dig outside the spawn
square. Every fourth tile position is held out for evaluation, the others are trained on. The
agent spawns anywhere in the square and must find the tile, dig, turn and dump.

Why seeds: one trajectory passes or fails by the host CPU's numerics. On the AMD EPYC machine
of 2026-11-25 seed 0 stayed at 11/13 from update 100 to 160 while seeds 1 and 2 passed; at a
later commit it passes again. The init, the update and the eval compile as training compiles
them (`Trainer.compiler_options`, tests/xla_flags.py), not with the suite's quicker flags:
seed 0's parameters after 5 updates equal, bit for bit, those of a process with no XLA_FLAGS.
On a 2-core AMD EPYC CPU (2026-11-29) seeds 0-4 all pass, 13/13 at every evaluation, 2.9 s
of training and evaluation a seed after 17 s for the first (compiles included); at the
suite's -O0 they passed too but took 13 s a seed. With 100 updates (the learning rate
annealed over those, at -O0) only 3 of 5 passed, 8/13 and 10/13 on the others, so the test
keeps 160. The seeds share one trainer: the seed enters the init and the eval as an argument
(`Trainer.run_key`), so one compiled init, update and eval serve all three. The seeds run in
order until the verdict is settled: the third trains only when one of the first two fails.

Measured earlier (docs/RESULTS.md), compass on, entropy coefficient 0.03, 4 epochs x 4
minibatches, the learning rate annealed linearly to 0 at the last update, minibatches of
single transitions: after 160 updates 12, 12, 13 and 13 of the 13 held-out maps on seeds 0-3.
With 2 epochs x 2 minibatches (4 optimizer steps per update, approx KL about 0.001) 100
updates ended anywhere between 0/13 and 12/13: this shape needs optimizer steps, not samples.
One evaluation of 13 episodes moves in steps of 7.7%, so a seed needs 90% at one of the four
evaluations and 75% at all of them.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from envs.maps import MAP_TYPES, MapSet
from envs.params import params_from_maps
from terra_rl.config import TrainConfig, resolve
from terra_rl.run.trainer import EVAL_COMPILER_OPTIONS, INIT_COMPILER_OPTIONS, build_trainer
from tests.xla_flags import as_training_compiles

FREE = slice(3, 13)
SPAWN_SQUARE = range(4, 11)  # rows and cols of the spawn square around (7, 7): no targets
UPDATES = 160
"""Updates trained; the learning rate anneals linearly to 0 over exactly these."""
EVAL_UPDATES = (100, 120, 140, 160)
"""Held-out evaluations: one of them must pass 90%, and none may fall below 75%."""
SEEDS = (0, 1, 2)
SEEDS_REQUIRED = 2
"""Seeds of `SEEDS` that must pass."""


def tile_positions() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training, held-out) tile positions: the free square minus the spawn square, every
    fourth position (row-major) held out."""
    cells = [(row, col) for row in range(FREE.start, FREE.stop)
             for col in range(FREE.start, FREE.stop)
             if not (row in SPAWN_SQUARE and col in SPAWN_SQUARE)]
    held_out = cells[1::4]
    return [cell for cell in cells if cell not in held_out], held_out


def one_tile_maps(tiles: list[tuple[int, int]]) -> MapSet:
    count = len(tiles)
    target = np.zeros((count, 16, 16), np.int8)
    obstacles = np.ones((count, 16, 16), np.int8)
    obstacles[:, FREE, FREE] = 0
    for index, (row, col) in enumerate(tiles):
        target[index, row, col] = -1
    map_type = np.full(count, MAP_TYPES.index("tiny_trenches"), np.int8)
    spawn = np.tile(np.array([[7, 7]], np.int32), (count, 1))
    return MapSet(target, obstacles, 1 - obstacles, map_type, spawn)


def make_trainer():
    """The one-tile config's trainer on its training and held-out maps (seed 0)."""
    config = resolve(
        TrainConfig(
            map_size=16, map_types=("tiny_trenches",), use_action_mask=True, max_steps=40,
            num_maps=38, num_devices=1, num_envs_per_device=32, num_steps=16,
            update_epochs=4, num_minibatches=4, map_encoder="flat", map_feature_dim=64,
            hidden_dim=64, use_compass=True, precision="float32", lr=1e-3,
            lr_schedule="linear", gamma=0.95, ent_coef_start=0.03, ent_coef_end=0.03,
            eval_episodes=13, eval_sampling=False, seed=0,
            total_timesteps=32 * 16 * UPDATES, compilation_cache_dir="", wandb_mode="disabled",
        ),
        jax.local_device_count(),
    )
    train_tiles, held_out_tiles = tile_positions()
    assert len(train_tiles) == config.num_maps and len(held_out_tiles) == config.eval_episodes
    trainer = build_trainer(config)
    # The programs training compiles, not the suite's quicker ones: see the docstring.
    trainer.compiler_options = {"init": as_training_compiles(INIT_COMPILER_OPTIONS),
                                "update": as_training_compiles({}),
                                "eval": as_training_compiles(EVAL_COMPILER_OPTIONS)}
    trainer.env_params = trainer.replicate(params_from_maps(one_tile_maps(train_tiles)))
    trainer.eval_env_params = trainer.replicate(params_from_maps(one_tile_maps(held_out_tiles)))
    return trainer


def train_seed(trainer, seed: int) -> dict:
    """Trains `seed` from scratch with the trainer's compiled functions: its untrained
    completion, the completion and steps to completion at each of `EVAL_UPDATES`."""
    trainer.config = dataclasses.replace(trainer.config, seed=seed)
    runner = trainer.init_runner()
    before = trainer.evaluate(runner, 0)["eval/completion_rate"]
    update = trainer.compile_update(runner)
    completion, steps = {}, {}
    for done in range(1, UPDATES + 1):
        runner, _ = update(runner, trainer.env_params)
        if done in EVAL_UPDATES:
            metrics = trainer.evaluate(runner, done)
            completion[done] = metrics["eval/completion_rate"]
            # Absent (NaN, dropped) when no episode finished: that seed fails, the test goes on.
            steps[done] = metrics.get("eval/steps_to_completion", math.nan)
    return {"before": before, "completion": completion, "steps": steps}


def seed_passes(result: dict, max_steps: int) -> bool:
    completion, steps = result["completion"], result["steps"]
    return (max(completion.values()) >= 0.9 and min(completion.values()) >= 0.75
            and all(steps_taken < max_steps for steps_taken in steps.values()))


def test_training_raises_held_out_completion_from_zero_on_most_seeds():
    trainer = make_trainer()
    results, passed = {}, []
    for seed in SEEDS:
        results[seed] = train_seed(trainer, seed)
        # The untrained policy finishes (almost) nothing, whatever the seed.
        assert results[seed]["before"] <= 0.1, results
        passed.append(seed_passes(results[seed], trainer.config.max_steps))
        failed_allowed = len(SEEDS) - SEEDS_REQUIRED
        if passed.count(True) >= SEEDS_REQUIRED or passed.count(False) > failed_allowed:
            break  # the verdict is settled
    assert passed.count(True) >= SEEDS_REQUIRED, results
    # One compiled update and eval for every seed.
    assert trainer.trace_counts == {"update": 1, "eval": 1}
