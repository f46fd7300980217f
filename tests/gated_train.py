"""`train_mixed.py` with gates, for the preemption test (`tests/test_preemption.py`).

`python tests/gated_train.py TRAIN_FLAG...` runs `train_mixed.py TRAIN_FLAG...` unchanged,
except that the gates named in `TERRA_TEST_GATES` (comma-separated) stop the process at
their point: it creates `TERRA_TEST_GATE_DIR/<gate>.reached` and waits until
`<gate>.release` exists (a signal meanwhile is handled as usual). So a test sends its signal
or its SIGKILL at a known point instead of after a guessed time, and the run cannot finish
before it. Each gate stops once.

    update_<N>   after the dispatch that ends with update N and the eval's background
                 compile, before the stop request is polled (a SIGTERM sent there stops the
                 run at update N, with every record up to N logged)
    compile      when the update starts to compile (after a resume has restored its state)
    checkpoint   inside a checkpoint's write: orbax's temporary directory exists, the
                 checkpoint's config.json is not written yet
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from orbax.checkpoint import handlers  # noqa: E402

from terra_rl.cli.main import cli  # noqa: E402
from terra_rl.run.trainer import Trainer  # noqa: E402

GATES = {name for name in os.environ.get("TERRA_TEST_GATES", "").split(",") if name}
GATE_DIR = Path(os.environ.get("TERRA_TEST_GATE_DIR", "."))


def gate(name: str) -> None:
    if name not in GATES:
        return
    GATES.discard(name)
    (GATE_DIR / f"{name}.reached").touch()
    while not (GATE_DIR / f"{name}.release").exists():
        time.sleep(0.01)


def after_dispatch(run_updates):
    @functools.wraps(run_updates)
    def gated(self, runner, count):
        runner, metrics = run_updates(self, runner, count)
        if any(name.startswith("update_") for name in GATES):
            done = int(np.asarray(jax.device_get(runner.counters.update)).reshape(-1)[0])
            if f"update_{done}" in GATES and self.eval_compile_future is not None:
                # The eval's background compile first: until it is done, the train records
                # wait behind the baseline eval, and a stop would wait for the compile.
                self.eval_compile_future.result()
            gate(f"update_{done}")
        return runner, metrics

    return gated


def before_compile(compile_update):
    @functools.wraps(compile_update)
    def gated(self, runner):
        if self.compiled_update is None:
            gate("compile")
        return compile_update(self, runner)

    return gated


def inside_checkpoint_write(async_save):
    @functools.wraps(async_save)
    async def gated(self, directory, *args, **kwargs):
        gate("checkpoint")
        return await async_save(self, directory, *args, **kwargs)

    return gated


Trainer.run_updates = after_dispatch(Trainer.run_updates)
Trainer.compile_update = before_compile(Trainer.compile_update)
handlers.JsonCheckpointHandler.async_save = inside_checkpoint_write(
    handlers.JsonCheckpointHandler.async_save)

if __name__ == "__main__":
    sys.argv[0] = "train_mixed.py"
    cli()
