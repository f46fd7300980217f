"""`tests/gated_train.py` with more gates, for the kill-point tests (`tests/test_kill_points.py`).

`python tests/kill_train.py TRAIN_FLAG...` runs `train_mixed.py TRAIN_FLAG...` as
`gated_train.py` does (its gates `update_<N>`, `compile` and `checkpoint` work here too),
and stops the process at these gates when `TERRA_TEST_GATES` names them:

    eval_compile  in the eval's background compile, before it lowers: the compile stays
                  unfinished until the test releases it, however fast the cache makes it
    eval_wait     where the host loop is about to wait for that unfinished compile (an eval,
                  a checkpoint or the end needs it)
    dispatch_<N>  right after the dispatch that ends with update N, before its records,
                  checkpoint and stop poll (without waiting for the eval's compile)
    save_<N>      before the periodic checkpoint of update N is written
    saved_<N>     after it is complete on disk

While any gate is set, `TERRA_TEST_GATE_DIR/dispatched` holds the last update dispatched,
so a test held at `eval_wait` knows at which update the loop waits.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gated_train  # noqa: E402  (its gates and the repo on sys.path)
import jax  # noqa: E402
import numpy as np  # noqa: E402

from terra_rl.cli.main import cli  # noqa: E402
from terra_rl.run import trainer as trainer_module  # noqa: E402
from terra_rl.run.checkpointing import CheckpointStore  # noqa: E402
from terra_rl.run.trainer import Trainer  # noqa: E402

gate = gated_train.gate


def note_dispatched(done: int) -> None:
    path = gated_train.GATE_DIR / "dispatched"
    path.with_suffix(".tmp").write_text(str(done))
    os.replace(path.with_suffix(".tmp"), path)


def after_dispatch(run_updates):
    @functools.wraps(run_updates)
    def gated(self, runner, count):
        runner, metrics = run_updates(self, runner, count)
        if gated_train.GATES:
            done = int(np.asarray(jax.device_get(runner.counters.update)).reshape(-1)[0])
            note_dispatched(done)
            gate(f"dispatch_{done}")
        return runner, metrics

    return gated


def hold_eval_compile(compile_in_background):
    @functools.wraps(compile_in_background)
    def held(lower, start, background, thread_name, **options):
        if background and thread_name == "eval-compile":
            lower_now = lower

            def lower():
                gate("eval_compile")
                return lower_now()

        return compile_in_background(lower, start, background, thread_name, **options)

    return held


def before_eval_wait(compile_eval):
    @functools.wraps(compile_eval)
    def gated(self, runner):
        future = self.eval_compile_future
        if self.compiled_eval is None and future is not None and not future.done():
            gate("eval_wait")
        return compile_eval(self, runner)

    return gated


def around_save(save):
    @functools.wraps(save)
    def gated(self, step, *args, **kwargs):
        gate(f"save_{step}")
        became_best = save(self, step, *args, **kwargs)
        gate(f"saved_{step}")
        return became_best

    return gated


Trainer.run_updates = after_dispatch(Trainer.run_updates)
Trainer.compile_eval = before_eval_wait(Trainer.compile_eval)
trainer_module._compile = hold_eval_compile(trainer_module._compile)
CheckpointStore.save = around_save(CheckpointStore.save)

if __name__ == "__main__":
    sys.argv[0] = "train_mixed.py"
    cli()
