"""Command-line flags for `TrainConfig`: `--config PRESET`, one `--field value` per field,
booleans as `--enable_x` / `--disable_x` (`use_action_mask` -> `--enable_action_mask`),
tuples as comma lists, and `--resume RUN_DIR`.

Launch options that are not config fields (they never reach `config.json`, so a resumed run may
be launched differently): `--max_updates N`, and `--distributed` with
`--coordinator_address HOST:PORT`, `--num_processes N` and `--process_id I` (see
`terra_rl.run.distributed`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import typing

from terra_rl.cli.parser import OneLineErrorParser
from terra_rl.config import PRESETS, TrainConfig, get_preset
from terra_rl.run.distributed import DistributedOptions

# Fields that may change when a run is resumed; anything else would change shapes,
# semantics or the meaning of the step counters.
RESUMABLE_FIELDS = frozenset(
    {
        "total_timesteps",
        "log_train_interval",
        "log_eval_interval",
        "checkpoint_interval",
        "keep_checkpoints",
        "best_metric",
        "cache_clear_interval",
        "updates_per_dispatch",
        "compilation_cache_dir",
        "wandb_mode",
        "wandb_project",
        "wandb_entity",
        "wandb_tags",
    }
)


@dataclasses.dataclass(frozen=True)
class TrainArgs:
    config: TrainConfig
    """The preset (or resumed config) with the given flags applied; not yet resolved."""
    resume: str | None
    overrides: dict[str, typing.Any]
    distributed: DistributedOptions = DistributedOptions()
    """Multi-process launch options (not part of the config)."""
    max_updates: int | None = None
    """Stop (checkpointed, exit 0) once the run has done this many updates in all."""


@functools.cache
def field_docs() -> dict[str, str]:
    """The docstring under each `TrainConfig` field (shown in `--help`)."""
    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        is_doc = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and is_doc:
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def bool_flag_name(field_name: str) -> str:
    return field_name.removeprefix("use_")


def build_parser(base: TrainConfig, prog: str = "train_mixed.py") -> OneLineErrorParser:
    """Flags for every field; defaults shown are those of `base` (the chosen preset);
    `prog` names the script in help and error lines."""
    parser = OneLineErrorParser(
        prog=prog,
        description="Train a PPO policy. Flags override the preset chosen with --config.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config", default=base.preset or "solo_excavator", choices=sorted(PRESETS),
        help="preset to start from",
    )
    parser.add_argument(
        "--resume", metavar="RUN_DIR", default=None,
        help="continue the run in RUN_DIR from its latest checkpoint (only logging, "
        "checkpoint and total_timesteps flags may change)",
    )
    add_launch_flags(parser)
    docs = field_docs()
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        if field.name == "preset":
            continue
        value = getattr(base, field.name)
        doc = docs.get(field.name, "")
        hint = hints[field.name]
        if hint is bool:
            name = bool_flag_name(field.name)
            group = parser.add_mutually_exclusive_group()
            group.add_argument(
                f"--enable_{name}", dest=field.name, action="store_const", const=True,
                help=f"{doc} (preset: {'on' if value else 'off'}; --disable_{name} turns it "
                "off)".strip(),
            )
            group.add_argument(f"--disable_{name}", dest=field.name, action="store_const",
                               const=False, help=argparse.SUPPRESS)
            if name == field.name:
                group.add_argument(f"--{name}", dest=field.name, action="store_const",
                                   const=True, help=argparse.SUPPRESS)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(
                f"--{field.name}", type=_comma_tuple, metavar="A,B",
                help=f"{doc} (preset: {','.join(value)})".strip(),
            )
        else:
            parser.add_argument(
                f"--{field.name}", type=hint, metavar=hint.__name__.upper(),
                help=f"{doc} (preset: {value})".strip(),
            )
    return parser


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max_updates", metavar="N", type=int, default=None,
        help="stop once the run has done N updates in all, with a checkpoint (a smoke test "
        "or a staged run; --resume continues it); not saved in config.json",
    )
    group = parser.add_argument_group(
        "multi-process launch", "launch options, not config fields (never in config.json)"
    )
    group.add_argument(
        "--distributed", action="store_true", default=False,
        help="call jax.distributed.initialize() first and train on every device of every "
        "process (only process 0 writes logs and checkpoints); without the three flags below, "
        "the processes are found from Slurm's SLURM_* variables",
    )
    group.add_argument("--coordinator_address", metavar="HOST:PORT", default=None,
                       help="process 0's host and a free port (needs --distributed)")
    group.add_argument("--num_processes", metavar="N", type=int, default=None,
                       help="number of processes (needs --distributed)")
    group.add_argument("--process_id", metavar="I", type=int, default=None,
                       help="this process's index, 0..N-1 (needs --distributed)")


def distributed_options(args: dict[str, typing.Any], parser) -> DistributedOptions:
    """Pops the launch flags from parsed `args`; inconsistent ones are a parser error."""
    options = DistributedOptions(
        enabled=args.pop("distributed"),
        coordinator_address=args.pop("coordinator_address"),
        num_processes=args.pop("num_processes"),
        process_id=args.pop("process_id"),
    )
    given = [f"--{name}" for name in ("coordinator_address", "num_processes", "process_id")
             if getattr(options, name) is not None]
    if given and not options.enabled:
        parser.error(f"{', '.join(given)} needs --distributed")
    if options.num_processes is not None and options.num_processes < 1:
        parser.error(f"--num_processes must be >= 1, got {options.num_processes}")
    if options.process_id is not None and options.process_id < 0:
        parser.error(f"--process_id must be >= 0, got {options.process_id}")
    if (options.num_processes is not None and options.process_id is not None
            and options.process_id >= options.num_processes):
        parser.error(f"--process_id {options.process_id} is not below --num_processes "
                     f"{options.num_processes}")
    address = options.coordinator_address
    if address is not None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            parser.error(f"--coordinator_address must be HOST:PORT, got {address!r}")
    return options


def flags_given(argv: list[str], fields: set[str]) -> list[str]:
    """The flags in `argv` that set `fields`, as typed (`--disable_action_mask`, not the
    field's name `--use_action_mask`), sorted."""
    typed = {arg.partition("=")[0] for arg in argv if arg.startswith("--")}
    flags = set()
    for field in fields:
        name = bool_flag_name(field)
        spellings = (f"--{field}", f"--enable_{name}", f"--disable_{name}", f"--{name}")
        flags |= {flag for flag in spellings if flag in typed} or {f"--{field}"}
    return sorted(flags)


def _comma_tuple(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_train_args(argv: list[str], prog: str = "train_mixed.py") -> TrainArgs:
    """Parse `argv` (without the program name). Errors exit with code 2 and one line
    starting with `prog`."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default="solo_excavator")
    known, _ = pre.parse_known_args(argv)
    base = get_preset(known.config) if known.config in PRESETS else get_preset("solo_excavator")
    parser = build_parser(base, prog)
    args = vars(parser.parse_args(argv))
    preset_name = args.pop("config")
    resume = args.pop("resume")
    max_updates = args.pop("max_updates")
    if max_updates is not None and max_updates < 1:
        parser.error(f"--max_updates must be >= 1, got {max_updates}")
    launch = distributed_options(args, parser)
    overrides = args
    if resume is not None:
        if any(arg == "--config" or arg.startswith("--config=") for arg in argv):
            parser.error("--config cannot be combined with --resume (the run keeps its config)")
        fixed = set(overrides) - RESUMABLE_FIELDS
        if fixed:
            parser.error(
                f"--resume keeps the run's config; these flags cannot change: "
                f"{', '.join(flags_given(argv, fixed))}"
            )
        return TrainArgs(config=base, resume=resume, overrides=overrides, distributed=launch,
                         max_updates=max_updates)
    config = dataclasses.replace(get_preset(preset_name), **overrides)
    return TrainArgs(config=config, resume=None, overrides=overrides, distributed=launch,
                     max_updates=max_updates)
