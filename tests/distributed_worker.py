"""One process of the loopback multi-process test (`tests/test_distributed.py`).

`python tests/distributed_worker.py OUT_DIR TRAIN_FLAG...` runs, with JAX's gloo CPU
collectives:

1. `train_mixed.py TRAIN_FLAG...` (the flags include `--distributed` and the coordinator),
   a new run; its runner state is saved as stage `first`;
2. a resume of that run from its latest checkpoint, one update further (`train(...,
   resume=True)` with the same compiled trainer, so nothing is compiled twice), stage
   `resumed`;
3. the same extra update from stage 1's in-memory state without any checkpoint, stage
   `continued` (what the resumed run must equal).

Each process saves its own rows of each stage to `OUT_DIR/process<I>.npz`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax

# Cross-process collectives on CPU; must be set before jax.distributed.initialize.
jax.config.update("jax_cpu_collectives_implementation", "gloo")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import terra_rl.cli.main as train_main  # noqa: E402
from terra_rl.run import distributed  # noqa: E402
from terra_rl.run.checkpointing import CheckpointStore  # noqa: E402
from terra_rl.run.logger import NullRunLogger, RunLogger  # noqa: E402
from terra_rl.run.train_loop import train  # noqa: E402


def local_rows(leaf) -> np.ndarray:
    """This process's rows of a global array `[num_devices, ...]`, in device order."""
    return np.stack([np.asarray(shard.data)[0] for shard in leaf.addressable_shards])


def stage_arrays(stage: str, result) -> dict[str, np.ndarray]:
    runner = result.runner
    flat, _ = jax.tree_util.tree_flatten_with_path(runner.policy.params)
    arrays = {f"{stage}/params{jax.tree_util.keystr(path)}": local_rows(leaf)
              for path, leaf in flat}
    arrays.update({
        f"{stage}/rng": local_rows(runner.rng),
        f"{stage}/update": local_rows(runner.counters.update),
        f"{stage}/age": local_rows(runner.env_state.age),
        f"{stage}/env_steps": np.int64(result.env_steps),
        f"{stage}/updates_done": np.int64(result.updates_done),
    })
    return arrays


def main() -> int:
    out_dir, flags = Path(sys.argv[1]), sys.argv[2:]
    calls = []

    def recording_train(trainer, *args, **kwargs):
        result = train(trainer, *args, **kwargs)
        calls.append((trainer, result))
        return result

    train_main.train = recording_train
    if train_main.main(flags) != 0:
        return 1
    ((trainer, first),) = calls
    arrays = stage_arrays("first", first)

    config = trainer.config
    longer = dataclasses.replace(
        trainer, config=dataclasses.replace(
            config, total_timesteps=config.total_timesteps + config.env_steps_per_update))
    run_dir = Path(config.runs_dir) / config.run_name
    writer = distributed.is_writer()
    logger = RunLogger(run_dir, longer.config.num_updates) if writer else NullRunLogger()
    with CheckpointStore(run_dir / "checkpoints", read_only=not writer) as store, logger:
        resumed = train(longer, logger, store, resume=True)
    arrays.update(stage_arrays("resumed", resumed))

    runner, _ = trainer.compiled_update(first.runner, trainer.env_params)
    continued = dataclasses.replace(first, runner=runner, updates_done=first.updates_done + 1,
                                    env_steps=first.env_steps + config.env_steps_per_update)
    arrays.update(stage_arrays("continued", continued))
    arrays.update(
        process_count=np.int64(jax.process_count()),
        device_count=np.int64(jax.device_count()),
        device_ids=np.array([shard.device.id for shard in runner.rng.addressable_shards]),
    )
    np.savez(out_dir / f"process{jax.process_index()}.npz", **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
