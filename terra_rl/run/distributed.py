"""Multi-process training: `jax.distributed` start-up, the devices the pmapped update spans,
and moving runner-state pytrees between host data and arrays spread over several processes.

With `train_mixed.py --distributed`, one process per node (or per GPU) runs the same program.
`jax.pmap` then spans every device of every process, the devices grouped by process (all of
process 0's, then process 1's, ...), and its collectives (`pmean` of the gradients, the
metric `psum`s) run over all of them. Device index `i` of that order is row `i` of every
array with a leading device axis, whichever process holds it.

Three layouts of a pytree with a leading device axis:

- host (numpy) `[num_devices, ...]`: every row, on every process (built from the seed, or
  restored from a checkpoint); `global_arrays` turns it into
- global `jax.Array`s `[num_devices, ...]` sharded over all devices: what the trainer keeps
  and what the ahead-of-time compiled update takes and returns (each process holds its rows);
- host-local `jax.Array`s `[num_local_devices, ...]`: what a `jax.pmap` call takes and returns
  on each process (`to_local` / `to_global` convert without copying).

In a single process the two kinds of `jax.Array` coincide, and every function here does what
the single-process trainer always did.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from terra_rl import env_vars
from terra_rl.algo.device_axis import AXIS
from terra_rl.config import ConfigError

SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                   "SLURM_LOCALID")
"""What `jax.distributed.initialize()` reads when no explicit coordinator is given."""
BARRIER_TIMEOUT_S = 3600
"""How long `barrier` and the set-up exchanges wait for the slowest process (a compile)."""

_sync_ids = itertools.count()


class DistributedError(RuntimeError):
    """`jax.distributed` could not start; the message is one line and says what to pass."""


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """Launch options of a multi-process run (`--distributed`, `--coordinator_address`,
    `--num_processes`, `--process_id`). Not config fields: a resumed run may be launched on
    another number of processes, as long as the global device count is the same."""

    enabled: bool = False
    coordinator_address: str | None = None
    """`HOST:PORT` of process 0's coordinator; None: from Slurm."""
    num_processes: int | None = None
    """None: from Slurm (`SLURM_NTASKS`)."""
    process_id: int | None = None
    """None: from Slurm (`SLURM_PROCID`)."""


def initialize(options: DistributedOptions) -> None:
    """`jax.distributed.initialize` with the explicit options; what is None comes from the
    cluster environment (Slurm: `SLURM_VARIABLES`). Must run before any other JAX work.

    Raises `DistributedError` when JAX refuses (a backend already in use, missing values
    outside Slurm, an unreachable coordinator after JAX's own timeout).
    """
    try:
        jax.distributed.initialize(
            coordinator_address=options.coordinator_address,
            num_processes=options.num_processes,
            process_id=options.process_id,
        )
    except (RuntimeError, ValueError, TypeError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        explicit = (options.coordinator_address, options.num_processes, options.process_id)
        hint = ""
        if None in explicit and not env_vars.all_set(SLURM_VARIABLES):
            hint = (" (no Slurm job step found: pass --coordinator_address HOST:PORT "
                    "--num_processes N --process_id I)")
        raise DistributedError(f"--distributed: jax.distributed.initialize failed: "
                               f"{detail}{hint}") from error


def is_writer() -> bool:
    """Whether this process writes the run directory, metrics, W&B and checkpoints (only
    process 0 does; the others compute, take part in every collective, and read)."""
    return jax.process_index() == 0


def pmap_devices(num_devices: int) -> list:
    """The devices the pmapped functions span, in `jax.pmap`'s order.

    One process: the first `num_devices` local devices. Several: every device of every
    process, grouped by process (pmap maps each process's local axis onto its own devices,
    so a subset of the global devices is not possible); anything else raises `ConfigError`.
    """
    if jax.process_count() == 1:
        return jax.local_devices()[:num_devices]
    if num_devices != jax.device_count():
        raise ConfigError(
            f"--num_devices {num_devices} asked but a --distributed run spans all "
            f"{jax.device_count()} devices of its {jax.process_count()} processes; pass "
            "--num_devices 0 (all) or launch fewer processes or devices"
        )
    return [d for p in range(jax.process_count()) for d in jax.local_devices(process_index=p)]


def device_sharding(devices: list) -> NamedSharding:
    """Leading axis over `devices` (named like the pmap axis), the rest unsharded."""
    return NamedSharding(Mesh(np.array(devices), (AXIS,)), PartitionSpec(AXIS))


def global_arrays(tree: Any, sharding: NamedSharding) -> Any:
    """Host pytree `[num_devices, ...]` (the same on every process) -> global arrays on
    `sharding`; each process transfers only the rows of its own devices."""

    def put(leaf):
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree)


def to_global(tree: Any, sharding: NamedSharding) -> Any:
    """Host-local arrays `[num_local_devices, ...]` (what a pmap call returns on each
    process) -> global arrays `[num_devices, ...]` sharing the same buffers."""
    if jax.process_count() == 1:
        return tree
    return _from_own_shards(tree, sharding)


def to_local(tree: Any, sharding: NamedSharding) -> Any:
    """Global arrays `[num_devices, ...]` -> this process's rows as host-local arrays
    `[num_local_devices, ...]` (what a pmap call takes), sharing the same buffers."""
    if jax.process_count() == 1:
        return tree
    return _from_own_shards(tree, NamedSharding(sharding.mesh.local_mesh, sharding.spec))


def _from_own_shards(tree: Any, sharding: NamedSharding) -> Any:
    """Each leaf's addressable shards, unchanged, as an array laid out by `sharding`, its
    leading axis one row per device of `sharding`'s mesh."""
    rows = sharding.mesh.devices.size

    def convert(leaf):
        shards = [shard.data for shard in leaf.addressable_shards]
        return jax.make_array_from_single_device_arrays((rows, *leaf.shape[1:]), sharding,
                                                       shards)

    return jax.tree.map(convert, tree)


def first_local_row(leaf: Any) -> Any:
    """This process's first shard of a device array (any layout; numpy passes through): all
    a host needs of a value that is identical on every device (a metric), without any
    collective."""
    if isinstance(leaf, jax.Array):
        return leaf.addressable_data(0)
    return leaf


def gather_to_host(tree: Any, sharding: NamedSharding) -> Any:
    """Every row of a pytree of global arrays on `sharding` as host numpy
    `[num_devices, ...]`, on every process.

    With several processes, one jitted all-gather of the whole tree (one compile; per-leaf
    gathers compile once per leaf shape): every device briefly holds the whole state of all
    devices. All processes must call it together.
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    replicated = _replicate(NamedSharding(sharding.mesh, PartitionSpec()))(tree)
    return jax.device_get(jax.tree.map(lambda leaf: leaf.addressable_data(0), replicated))


@functools.cache
def _replicate(replicated: NamedSharding):
    return jax.jit(lambda tree: tree, out_shardings=replicated)


def _coordination_client():
    """The `jax.distributed` coordination-service client. JAX has no public barrier or
    key-value API; its own serialization code (and orbax) use this client the same way."""
    from jax._src import distributed as jax_distributed

    return jax_distributed.global_state.client


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process has reached this point (no-op in one process).

    Through the coordination service, not a device collective: a process may wait here as
    long as another one compiles (on CPU only process 0 gets persistent-cache hits) or writes
    a checkpoint, whereas the first CPU (gloo) collective over a set of devices fails when
    its processes arrive more than 30 s apart (gloo's context set-up times out). Every
    process must pass the same barriers in the same order.
    """
    if jax.process_count() == 1:
        return
    _coordination_client().wait_at_barrier(f"terra_rl/{name}/{next(_sync_ids)}",
                                           int(timeout_s * 1000))


def _gather_text(text: str) -> list[str]:
    """Every process's `text`, by process index (through the coordination service's
    key-value store: no device collective, so nothing is compiled)."""
    client = _coordination_client()
    key = f"terra_rl/text/{next(_sync_ids)}"
    client.key_value_set(f"{key}/{jax.process_index()}", text)
    return [client.blocking_key_value_get(f"{key}/{process}", BARRIER_TIMEOUT_S * 1000)
            for process in range(jax.process_count())]


def broadcast_text(text: str) -> str:
    """Process 0's `text` on every process. Every process must call it (in the same order
    as the other exchanges); identity in one process."""
    if jax.process_count() == 1:
        return text
    return _gather_text(text)[0]


def first_error(message: str) -> str:
    """This process's error `message`, else the first other process's ("process I: ..."),
    else "" when none failed: so that all processes stop together instead of waiting in a
    collective for one that has exited. Every process must call it; identity in one
    process."""
    if jax.process_count() == 1:
        return message
    errors = _gather_text(message)
    if message:
        return message
    return next((f"process {i}: {text}" for i, text in enumerate(errors) if text), "")


def any_process(flag: bool) -> bool:
    """True on every process when `flag` is true on any (a stop request that reached one
    process first). Every process must call it; identity in one process."""
    if jax.process_count() == 1:
        return flag
    return any(text == "1" for text in _gather_text("1" if flag else "0"))
