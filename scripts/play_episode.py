"""Play one episode with a policy and save it as an animated GIF.

Example:
    python scripts/play_episode.py --policy random --out episode.gif --map-size 32 \\
        --map-type foundations --agent-type tracked --max-steps 200

Policies (both restricted to the actions `obs["action_mask"]` allows, so the agent does not
bump into things):
  random  uniform over the allowed actions
  eager   DO where the arm points at the right work (undug targets when empty; dump zones
          when loaded, or any dumpable tile on maps without zones); else turn the cabin
          towards the nearest arm heading whose local map shows such work; else random.
          A scripted baseline that shows digging and dumping
Rendering a trained checkpoint's policy is not supported yet. Colours: see `envs/render.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

import jax  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from envs import actions as A  # noqa: E402
from envs.config import VALID_MAP_SIZES, CurriculumConfig, EnvConfig  # noqa: E402
from envs.dataset import DatasetError  # noqa: E402
from envs.env import LOCAL_LAYER_NAMES, ExcavationEnv  # noqa: E402
from envs.geometry import NUM_HEADINGS  # noqa: E402
from envs.maps import MAP_TYPES  # noqa: E402
from envs.params import make_env_params  # noqa: E402
from envs.render import render_frame_with_status  # noqa: E402
from terra_rl.cli import OneLineErrorParser  # noqa: E402

POLICIES = ("random", "eager")
AGENT_TYPES = {"tracked": A.TRACKED, "wheeled": A.WHEELED}
GENERATED_MAPS = 8
PROGRESS_EVERY = 50
LOADED_INDEX = 5  # agent_state = (row, col, base_heading, cabin_heading, wheel_angle, loaded)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="play_episode.py", description="Play one episode and save it as a GIF."
    )
    parser.add_argument(
        "--policy", default="random", help=f"one of {', '.join(POLICIES)} (see the docstring)"
    )
    parser.add_argument("--out", required=True, type=Path, help="output .gif path")
    parser.add_argument("--map-size", type=int, default=32, choices=VALID_MAP_SIZES)
    parser.add_argument("--map-type", default="foundations", choices=MAP_TYPES)
    parser.add_argument("--agent-type", default="tracked", choices=tuple(AGENT_TYPES))
    parser.add_argument("--max-steps", type=int, default=200, help="episode length limit")
    parser.add_argument("--seed", type=int, default=0, help="map, spawn and policy seed")
    parser.add_argument("--tile-pixels", type=int, default=8, help="pixels per map tile")
    parser.add_argument("--fps", type=float, default=10.0, help="GIF frames per second")
    parser.add_argument(
        "--dataset-path",
        default=None,
        help="map dataset directory (default: $DATASET_PATH, else generated maps)",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.policy not in POLICIES:
        parser.error(
            f"unknown --policy {args.policy!r}: choose one of {', '.join(POLICIES)}; "
            "rendering a trained checkpoint is not supported yet"
        )
    for name in ("max_steps", "tile_pixels"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.fps <= 0:
        parser.error("--fps must be > 0")


def random_action(rng: np.random.Generator, action_mask: np.ndarray) -> int:
    """Uniform over the allowed actions of a bool [NUM_ACTIONS] mask."""
    return int(rng.choice(np.flatnonzero(action_mask)))


def eager_action(rng: np.random.Generator, obs: dict) -> int:
    """DO where the arm points at the right work, else turn the cabin towards it (seen in
    `local_maps`), else random. Loaded, the right work is a dump zone (or any dumpable tile
    on maps without zones); empty, it is an undug target."""
    action_mask = np.asarray(obs["action_mask"])
    local_maps = np.asarray(obs["local_maps"]).astype(np.int64)  # [arm headings, layers]
    layer = {name: i for i, name in enumerate(LOCAL_LAYER_NAMES)}
    if int(obs["agent_state"][LOADED_INDEX]) > 0:
        work = local_maps[:, layer["dump_zone"]] - local_maps[:, layer["dumped"]]
        if not np.any(np.asarray(obs["target_map"]) == 1):
            work = local_maps[:, layer["dumpable"]]
    else:
        work = local_maps[:, layer["dig_target"]] - local_maps[:, layer["dug"]]
    if work[0] > 0 and action_mask[A.DO]:
        return A.DO
    headings = np.flatnonzero(work[1:] > 0) + 1
    if len(headings) == 0:
        return random_action(rng, action_mask)
    nearest = headings[np.argmin(np.minimum(headings, NUM_HEADINGS - headings))]
    return A.CABIN_ANTICLOCK if nearest <= NUM_HEADINGS // 2 else A.CABIN_CLOCK


def save_gif(frames: list[np.ndarray], path: Path, fps: float) -> None:
    images = [Image.fromarray(frame) for frame in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(
        path,
        save_all=True,
        append_images=images[1:],
        duration=max(1, round(1000 / fps)),
        loop=0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    # A one-level curriculum makes reset draw only maps of --map-type, from a mixed dataset too.
    config = EnvConfig(
        map_size=args.map_size,
        max_steps=args.max_steps,
        curriculum=CurriculumConfig(levels=(args.map_type,)),
    )
    try:
        params = make_env_params(
            config,
            map_types=(args.map_type,),
            num_maps=GENERATED_MAPS,
            seed=args.seed,
            dataset_path=args.dataset_path,
        )
    except DatasetError as error:
        parser.error(str(error))
    env = ExcavationEnv(config)
    reset = jax.jit(env.reset)
    step = jax.jit(env.step_no_reset)

    key_reset, key_step = jax.random.split(jax.random.key(args.seed))
    rng = np.random.default_rng(args.seed)
    obs, state = reset(key_reset, params, AGENT_TYPES[args.agent_type])
    frames = [render_frame_with_status(env, state, args.tile_pixels)]
    episode_return, steps, task_done = 0.0, 0, False
    while steps < args.max_steps:
        if args.policy == "eager":
            action = eager_action(rng, obs)
        else:
            action = random_action(rng, np.asarray(obs["action_mask"]))
        key_step, key = jax.random.split(key_step)
        obs, state, reward, terminated, truncated, _ = step(key, state, action, params)
        steps += 1
        episode_return += float(reward)
        frames.append(render_frame_with_status(env, state, args.tile_pixels))
        if len(frames) % PROGRESS_EVERY == 0:
            print(f"rendered {len(frames)} frames", flush=True)
        task_done = bool(terminated)
        if task_done or bool(truncated):
            break

    save_gif(frames, args.out, args.fps)
    progress = float(env.episode_progress(state))
    print(
        f"steps={steps} return={episode_return:.3f} "
        f"outcome={'task done' if task_done else 'timeout'} progress={progress:.1%} "
        f"frames={len(frames)} out={args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
