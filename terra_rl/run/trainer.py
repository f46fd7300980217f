"""Everything built for a config: envs, policy and the pmapped init, update and eval, each
compiled once per `Trainer` (the init and the eval in background threads where that
helps). The host loop that calls them is `terra_rl.run.train_loop`.

The runner state is kept as global arrays over all devices of all processes
(`terra_rl.run.distributed`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from terra_rl import env_vars
from terra_rl.adapters.train_env import make_train_envs
from terra_rl.algo import ppo, run_keys
from terra_rl.algo.evaluation import make_eval_fn, sampled_names, validation_names
from terra_rl.algo.update import RunnerState, make_init_fn, make_update_fn
from terra_rl.config import TrainConfig
from terra_rl.nets.models import PolicyConfig, make_policy
from terra_rl.run import distributed
from terra_rl.run.device_metrics import host_metrics

# On CPU the init and the eval compile at LLVM's level 1: the init runs once, and level 1
# compiles it faster to the same bits as the default level 2; the eval compiles faster, runs
# faster (cpu_demo: 1.5 s an eval against 1.7 s) and gives the same metrics. The update
# keeps level 2, whose bits it was measured with (docs/PERFORMANCE.md). A level set in
# XLA_FLAGS (the tests' 0) is left alone.
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
EVAL_COMPILER_OPTIONS = INIT_COMPILER_OPTIONS

_BACKGROUND_COMPILES: set[concurrent.futures.Future] = set()


def background_compiles_running() -> int:
    """How many compiles `_compile` started on threads of their own are still running (XLA
    cannot cancel one; the interpreter waits for their threads at exit)."""
    # A tuple first: the compile threads' done callbacks remove their futures meanwhile.
    return sum(not future.done() for future in tuple(_BACKGROUND_COMPILES))


@dataclasses.dataclass
class Trainer:
    """Everything built for one config on `num_devices` devices (all processes' together
    in a multi-process run; see `terra_rl.run.distributed`)."""

    config: TrainConfig
    devices: list
    """The pmapped functions' devices in pmap order: row i of the device axis is device i."""
    train_env: Any
    eval_env: Any
    policy: Any
    init_fn: Any
    update_fn: Any
    eval_fn: Any
    env_params: Any
    """The training map pool replicated over the device axis (a pmap argument, never a
    constant), as global arrays."""
    eval_env_params: Any = None
    """The held-out evaluation pool, laid out like `env_params`."""
    validation_env_params: Any = None
    """The validation pool that chooses the best checkpoint, laid out like `env_params`."""
    compiled_init: Any = None
    init_compile_seconds: float = 0.0
    """Of the init: lowering and compile, in the background too (`start_init_compile`)."""
    init_compile_future: Any = None
    """The init's compile running in a background thread, until `init_runner` takes it."""
    init_out_info: Any = None
    """The lowered init's outputs (host-local `jax.ShapeDtypeStruct`s), once lowered."""
    lowered_update: Any = None
    """The update lowered (`lower_update`), until `compile_update` compiles it."""
    update_compile_future: Any = None
    """The update's compile running in a background thread (`start_update_compile`), until
    `compile_update` takes it."""
    update_beside_init: bool | None = None
    """Whether `terra_rl.run.train_loop.train` compiles the update on a thread of its own
    while the init compiles (`compiles_update_beside_init`). None: on an accelerator, whose
    host has the cores and the memory for both; not on a CPU, where the two compiles add up
    their peak memory (`cpu_demo` on 2 cores: the first update 2.5-3.5 s sooner, but a peak
    resident memory of up to 1.98 GB against 1.71-1.75, at the 2 GB budget)."""
    compiled_update: Any = None
    compiled_eval: Any = None
    compile_seconds: float = 0.0
    """Of the update: its lowering and compile (the eval's are not counted)."""
    eval_compile_seconds: float = 0.0
    """Of the eval: lowering and compile, in the background too (`start_eval_compile`)."""
    eval_compile_future: Any = None
    """The eval's compile running in a background thread, until `compile_eval` takes it."""
    eval_compile_wait_seconds: float = 0.0
    """How long `compile_eval` waited for a background compile to finish."""
    compiler_options: dict[str, dict] = dataclasses.field(default_factory=dict)
    """XLA compiler options by program ("init", "update", "eval"), in place of the defaults:
    on CPU `INIT_COMPILER_OPTIONS` and `EVAL_COMPILER_OPTIONS` unless XLA_FLAGS sets a level,
    none for the update. tests/test_learning.py compiles training's own programs this way in
    a test process whose XLA_FLAGS compile faster."""
    trace_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """How often the update and the eval were traced ("update", "eval"): once each per
    trainer, whatever the updates, evals, checkpoints and resumes of its runs."""

    @property
    def num_devices(self) -> int:
        """Devices over all processes (what step accounting counts)."""
        return len(self.devices)

    @functools.cached_property
    def sharding(self):
        """Leading device axis over `devices`: the layout of the runner state."""
        return distributed.device_sharding(self.devices)

    def shard(self, tree):
        """Host pytree `[num_devices, ...]` (the same on every process) -> global arrays
        sharded over the devices (the layout the compiled update returns, so a donated input
        is freed in place); each process transfers only its own devices' rows."""
        return distributed.global_arrays(tree, self.sharding)

    def replicate(self, tree):
        return self.shard(jax.tree.map(lambda x: np.stack([np.asarray(x)] * self.num_devices),
                                       tree))

    def init_runner(self) -> RunnerState:
        """Fresh runner state: one key per device split over the global device count, so
        every device of every process steps its own envs. The init is compiled once per
        trainer (`start_init_compile`, waited for if it runs in the background); like the
        compiled update, it takes and returns global arrays."""
        if self.compiled_init is None:
            self.start_init_compile(background=False)
            self.compiled_init, self.init_compile_seconds = self.init_compile_future.result()
            self.init_compile_future = None
        return self.compiled_init(*self._init_args())

    def start_init_compile(self, background: bool = True) -> None:
        """Lower the init on this thread and compile it, on CPU with
        `INIT_COMPILER_OPTIONS`; with `background` on another thread, so the update can be
        lowered (from `abstract_runner`) beside it (`train` does)."""
        if self.compiled_init is not None or self.init_compile_future is not None:
            return
        start = time.perf_counter()
        lowered = self.init_fn.lower(*self._local(*self._init_args()))
        self.init_out_info = lowered.out_info
        self.init_compile_future = _compile(
            lambda: lowered, start, background, "init-compile",
            compiler_options=self._compiler_options("init", INIT_COMPILER_OPTIONS))

    def _compiler_options(self, program: str, cpu_options: dict) -> dict | None:
        """`self.compiler_options[program]` if set; else `cpu_options` on CPU unless
        XLA_FLAGS sets an optimisation level; else None (XLA_FLAGS alone)."""
        if program in self.compiler_options:
            return self.compiler_options[program]
        level_set = "xla_backend_optimization_level" in (env_vars.get("XLA_FLAGS") or "")
        on_cpu = self.devices[0].platform == "cpu"
        return (cpu_options or None) if on_cpu and not level_set else None

    def with_policy_params(self, runner: RunnerState, params) -> RunnerState:
        """`runner` with host `params` (no device axis) as every device's policy parameters:
        a warm start (`terra_rl.run.warm_start`); the optimizer state stays the fresh one."""
        policy = runner.policy.replace(params=self.replicate(params))
        return runner.replace(policy=policy)

    def abstract_runner(self) -> RunnerState:
        """What `init_runner` returns as `jax.ShapeDtypeStruct`s (global shapes), traced
        but neither compiled nor run: all a checkpoint restore or the update's compile
        needs. Read from the lowered init when `start_init_compile` has run."""
        local = self.init_out_info
        if local is None:
            local = jax.eval_shape(self.init_fn, *self._local(*self._init_args()))
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct((self.num_devices, *leaf.shape[1:]), leaf.dtype),
            local,
        )

    def _init_args(self):
        return self.run_key(), self.env_params

    def lower_update(self, runner: RunnerState) -> None:
        """Lower the update once per trainer (`compile_update` compiles it), from `runner`
        or from `abstract_runner()`: the same program."""
        if self.compiled_update is None and self.lowered_update is None:
            start = time.perf_counter()
            args = (runner, self.env_params)
            if self.config.updates_per_dispatch > 1:
                args += (self.update_counts(1),)
            self.lowered_update = self.update_fn.lower(*self._local(*args))
            self.compile_seconds = time.perf_counter() - start

    def compiles_update_beside_init(self) -> bool:
        """`update_beside_init`, or where that is None whether the devices are not CPUs."""
        if self.update_beside_init is not None:
            return self.update_beside_init
        return self.devices[0].platform != "cpu"

    def start_update_compile(self, runner: RunnerState, background: bool = True) -> None:
        """Lower the update (`lower_update`, from `runner` or `abstract_runner()`) on this
        thread and compile it, with `background` on another; `compile_update` takes it."""
        if self.compiled_update is not None or self.update_compile_future is not None:
            return
        self.lower_update(runner)
        lowered, self.lowered_update = self.lowered_update, None
        self.update_compile_future = _compile(
            lambda: lowered, time.perf_counter(), background, "update-compile",
            compiler_options=self._compiler_options("update", {}))

    def compile_update(self, runner: RunnerState):
        """The update compiled ahead of time (once per trainer), timing its lowering and
        compile (waiting for the compile `start_update_compile` began). It takes and returns
        global arrays (`runner`, `env_params`, and with `updates_per_dispatch` > 1 the update
        count, `self.update_counts(n)`)."""
        if self.compiled_update is None:
            self.start_update_compile(runner, background=False)
            self.compiled_update, seconds = self.update_compile_future.result()
            self.update_compile_future = None
            self.compile_seconds += seconds
        return self.compiled_update

    def update_counts(self, count: int):
        """int32 [num_devices] `count` on every device: the update count argument."""
        return self.replicate(np.int32(count))

    def run_updates(self, runner: RunnerState, count: int):
        """`count` updates in one dispatch (at most `updates_per_dispatch`): (runner,
        device metrics). With `updates_per_dispatch` > 1 every metric has a leading update
        axis after the device axis (`metrics_row(fetch_metrics(metrics), row)` reads update
        `row`)."""
        per_dispatch = self.config.updates_per_dispatch
        if not 1 <= count <= per_dispatch:
            raise ValueError(f"count must be in [1, {per_dispatch}], got {count}")
        update = self.compile_update(runner)
        if per_dispatch == 1:
            return update(runner, self.env_params)
        return update(runner, self.env_params, self.update_counts(count))

    def compile_eval(self, runner: RunnerState):
        """The evaluation compiled ahead of time (once per trainer); it takes global arrays
        `(params, run key, eval env_params, sample flags bool [D])`. Waits for a compile
        `start_eval_compile` began."""
        if self.compiled_eval is None:
            if self.eval_compile_future is None:
                self.start_eval_compile(runner, background=False)
            start = time.perf_counter()
            self.compiled_eval, self.eval_compile_seconds = self.eval_compile_future.result()
            self.eval_compile_wait_seconds += time.perf_counter() - start
            self.eval_compile_future = None
        return self.compiled_eval

    def start_eval_compile(self, runner: RunnerState, background: bool = True) -> None:
        """Lower and compile the evaluation (on CPU with `EVAL_COMPILER_OPTIONS`); with
        `background` on another thread while this one goes on (XLA compiles without holding
        the GIL; the lowering's Python shares it with the updates' dispatches, which mostly
        wait on the device). Single-process runs start their first updates this way: a user
        does not wait for the eval's lowering and compile, and on a GPU they cost the updates
        nothing (docs/PERFORMANCE.md). The background lowering reads only the parameters'
        shapes: the updates donate `runner`."""
        if self.compiled_eval is not None or self.eval_compile_future is not None:
            return
        start = time.perf_counter()
        params = runner.policy.params
        if background:  # pmap lowers host-local shapes of one process only
            params = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
        args = self._local(params, self.run_key(), self.eval_env_params,
                           self.replicate(np.bool_(False)))
        self.eval_compile_future = _compile(
            lambda: self.eval_fn.lower(*args), start, background, "eval-compile",
            compiler_options=self._compiler_options("eval", EVAL_COMPILER_OPTIONS))

    def eval_compiled(self) -> bool:
        """Whether `compile_eval` would return without waiting."""
        future = self.eval_compile_future
        return self.compiled_eval is not None or (future is not None and future.done())

    def run_key(self):
        """uint32 [D, 2]: the seed's key on every device, which the init and the eval derive
        their keys from (`terra_rl.algo.run_keys`)."""
        return self.replicate(run_keys.seed_key(self.config.seed))

    def evaluate(self, runner: RunnerState, update: int,
                 params: Any = None) -> dict[str, float]:
        """Eval metrics of the runner's policy (or of `params`, global arrays laid out like
        the runner's) on the held-out pool: greedy (`eval/...`) and, with `eval_sampling`,
        sampled (`eval_sampled/...`); then greedy on the validation pool
        (`validation/...`), the one that chooses the best checkpoint, with the same compiled
        program. A collective: all processes call it."""
        del update  # the same episodes at every eval
        evaluate = self.compile_eval(runner)
        params = runner.policy.params if params is None else params
        metrics = {}
        greedy = self.replicate(np.bool_(False))
        for sample in (False, True) if self.config.eval_sampling else (False,):
            result = host_metrics(evaluate(params, self.run_key(),
                                           self.eval_env_params,
                                           self.replicate(np.bool_(sample))))
            metrics.update(sampled_names(result) if sample else result)
        validation_key = self.replicate(run_keys.validation_key(self.config.seed))
        result = host_metrics(evaluate(params, validation_key, self.validation_env_params,
                                       greedy))
        metrics.update(validation_names(result))
        return metrics

    def _local(self, *trees):
        """Global arrays -> the host-local views a `jax.pmap` call takes on each process."""
        return tuple(distributed.to_local(tree, self.sharding) for tree in trees)


def _compile(lower: Callable[[], Any], start: float, background: bool, thread_name: str,
             **options) -> concurrent.futures.Future:
    """A future of `(lower().compile(**options), seconds since start)`, lowered and
    compiled on a thread of its own with `background` (XLA compiles without holding the
    GIL), else already done."""

    def compile_lowered():
        return lower().compile(**options), time.perf_counter() - start

    if not background:
        future = concurrent.futures.Future()
        future.set_result(compile_lowered())
        return future
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=thread_name)
    future = executor.submit(compile_lowered)
    executor.shutdown(wait=False)
    _BACKGROUND_COMPILES.add(future)
    future.add_done_callback(_BACKGROUND_COMPILES.discard)
    return future


def policy_config(config: TrainConfig) -> PolicyConfig:
    return PolicyConfig(
        map_encoder=config.map_encoder,
        map_feature_dim=config.map_feature_dim,
        hidden_dim=config.hidden_dim,
        separate_actor_critic_trunks=config.separate_actor_critic_trunks,
        precision=config.precision,
        compass=config.use_compass,
        dig_distance=config.use_dig_distance,
        pose_distance=config.use_pose_distance,
        wheeled_agents=config.wheeled_fraction > 0,
        egocentric_radius=config.egocentric_radius,
        map_pool=config.map_pool,
        image_encoder=config.image_encoder,
        gymnax_activation=config.gymnax_activation,
        gymnax_hidden_dim=config.gymnax_hidden_dim,
        conv_as_matmul=config.conv_impl == "patches"
        or (config.conv_impl == "auto" and jax.default_backend() == "cpu"),
    )


def build_trainer(config: TrainConfig, max_traces: int | None = None) -> Trainer:
    """Envs, policy and the pmapped functions for a resolved config (nothing compiled).
    With `max_traces` (the tests' 1), tracing the update or the eval more often fails at
    once with chex's AssertionError. Raises `ConfigError` when a multi-process run does not
    use every device."""
    devices = distributed.pmap_devices(config.num_devices)
    train_env, eval_env = make_train_envs(config)
    example_obs = train_env.observation_spec()
    policy = make_policy(policy_config(config), train_env.num_actions, example_obs)
    optimizer = ppo.make_optimizer(config)
    trace_counts = collections.Counter()
    trainer = Trainer(
        config=config,
        devices=devices,
        train_env=train_env,
        eval_env=eval_env,
        policy=policy,
        init_fn=make_init_fn(config, train_env, policy, optimizer),
        update_fn=make_update_fn(config, train_env, policy, trace_counts, max_traces),
        eval_fn=make_eval_fn(config, eval_env, policy, trace_counts, max_traces),
        env_params=None,
        trace_counts=trace_counts,
    )
    trainer.env_params = trainer.replicate(train_env.params)
    trainer.eval_env_params = trainer.replicate(eval_env.params)
    trainer.validation_env_params = trainer.replicate(eval_env.validation_params)
    return trainer
