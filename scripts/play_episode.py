"""Play one episode with a policy and save it as an animated GIF.

Examples:
    python scripts/play_episode.py --policy random --out episode.gif --map-size 32 \\
        --map-type foundations --agent-type tracked --max-steps 200
    python scripts/play_episode.py --checkpoint runs/cpu_demo-A --map-index 3 --out a.gif

With `--checkpoint RUN_DIR` the trained policy of that run plays (greedy, or `--sample`),
from its latest, best or a numbered checkpoint (`--checkpoint-step`), on held-out map
`--map-index` of the run's own evaluation pool (the maps its `eval/completion_rate` counts);
the map flags then do not apply and `--max-steps` defaults to the run's `max_steps`.

Policies (both restricted to the actions `obs["action_mask"]` allows, so the agent does not
bump into things):
  random  uniform over the allowed actions
  eager   DO where the arm points at the right work (undug targets when empty; dump zones
          when loaded, or any dumpable tile on maps without zones); else turn the cabin
          towards the nearest arm heading whose local map shows such work; else random.
          A scripted baseline that shows digging and dumping

One frame per step (the state after that step's action), titled with the step, the return so
far and the task progress; the last frame's title gives the outcome. Colours: see
`envs/render.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

import jax  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from envs import actions as A  # noqa: E402
from envs.config import VALID_MAP_SIZES, CurriculumConfig, EnvConfig  # noqa: E402
from envs.dataset import DatasetError  # noqa: E402
from envs.env import LOCAL_LAYER_NAMES, ExcavationEnv  # noqa: E402
from envs.geometry import NUM_HEADINGS  # noqa: E402
from envs.maps import MAP_TYPES  # noqa: E402
from envs.params import make_env_params  # noqa: E402
from envs.render import render_frame_with_status  # noqa: E402
from terra_rl.analysis.playback import PlaybackError, load_trained_policy  # noqa: E402
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402

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
        "--policy", default=None, help=f"one of {', '.join(POLICIES)} (see the docstring; "
        "default random)"
    )
    parser.add_argument("--checkpoint", type=Path, default=None, metavar="RUN_DIR",
                        help="play the trained policy of this run directory instead")
    parser.add_argument("--checkpoint-step", default="latest",
                        help="with --checkpoint: latest, best or an update number")
    parser.add_argument("--sample", action="store_true",
                        help="with --checkpoint: sample actions instead of the greedy ones")
    parser.add_argument("--map-index", type=int, default=0,
                        help="with --checkpoint: the held-out map to play")
    parser.add_argument("--out", required=True, type=Path, help="output .gif path")
    parser.add_argument("--map-size", type=int, default=32, choices=VALID_MAP_SIZES)
    parser.add_argument("--map-type", default="foundations", choices=MAP_TYPES)
    parser.add_argument("--agent-type", default="tracked", choices=tuple(AGENT_TYPES))
    parser.add_argument("--max-steps", type=int, default=None,
                        help="episode length limit (default 200; the run's with --checkpoint)")
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
    if args.checkpoint is not None and args.policy is not None:
        parser.error("--policy and --checkpoint exclude each other: the checkpoint is the policy")
    args.policy = args.policy or "random"
    if args.policy not in POLICIES:
        parser.error(
            f"unknown --policy {args.policy!r}: choose one of {', '.join(POLICIES)}, or "
            "--checkpoint RUN_DIR for a trained policy"
        )
    for name in ("max_steps", "tile_pixels"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.fps <= 0:
        parser.error("--fps must be > 0")
    if args.map_index < 0:
        parser.error("--map-index must be >= 0")


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


TITLE_LINE_PIXELS = 12
TITLE_WIDTH_PIXELS = 132  # the widest caption line in PIL's default font, and a margin


def titled(frame: np.ndarray, lines: tuple[str, str]) -> np.ndarray:
    """`frame` (uint8 [H, W, 3]) centred under two lines of text (PIL's default font), on a
    canvas at least `TITLE_WIDTH_PIXELS` wide, so every frame of a GIF has one size."""
    height, width = frame.shape[:2]
    canvas_width = max(width, TITLE_WIDTH_PIXELS)
    strip = 2 * TITLE_LINE_PIXELS + 2
    image = Image.new("RGB", (canvas_width, height + strip), (255, 255, 255))
    image.paste(Image.fromarray(frame), ((canvas_width - width) // 2, strip))
    draw = ImageDraw.Draw(image)
    for row, text in enumerate(lines):
        draw.text((2, 1 + row * TITLE_LINE_PIXELS), text, fill=(0, 0, 0))
    return np.asarray(image)


def caption(step: int, episode_return: float, progress: float, outcome: str = ""
            ) -> tuple[str, str]:
    """('step S  return R', 'progress P%[  outcome]')."""
    second = f"progress {progress:.0%}"
    return f"step {step}  return {episode_return:+.3f}", f"{second}  {outcome}" if outcome \
        else second


def setup_scripted(parser, args):
    """(env, params, reset (agent type, key) -> (obs, state), choose (key, obs) -> action)."""
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
    rng = np.random.default_rng(args.seed)
    reset = jax.jit(env.reset)

    def choose(key, obs):
        del key
        if args.policy == "eager":
            return eager_action(rng, obs)
        return random_action(rng, np.asarray(obs["action_mask"]))

    return env, params, lambda key: reset(key, params, AGENT_TYPES[args.agent_type]), choose


def setup_checkpoint(parser, args):
    try:
        trained = load_trained_policy(args.checkpoint, args.checkpoint_step)
    except PlaybackError as error:
        parser.error(str(error))
    if args.map_index >= trained.num_maps:
        parser.error(f"--map-index {args.map_index} is not below the run's "
                     f"{trained.num_maps} held-out maps")
    reset = jax.jit(trained.env.reset)
    print(f"{args.checkpoint}: checkpoint of update {trained.step}, held-out map "
          f"{args.map_index} of {trained.num_maps}, {'sampled' if args.sample else 'greedy'}",
          flush=True)

    def choose(key, obs):
        return int(trained.act(key, obs, args.sample))

    return (trained.env, trained.env_params,
            lambda key: reset(key, trained.env_params, AGENT_TYPES[args.agent_type],
                              args.map_index),
            choose)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.checkpoint is None:
        args.max_steps = args.max_steps or 200
        env, params, reset, choose = setup_scripted(parser, args)
    else:
        env, params, reset, choose = setup_checkpoint(parser, args)
        args.max_steps = min(args.max_steps or env.config.max_steps, env.config.max_steps)
    step = jax.jit(env.step_no_reset)

    key_reset, key_step = jax.random.split(jax.random.key(args.seed))
    obs, state = reset(key_reset)
    frames = []
    episode_return, steps, outcome = 0.0, 0, ""
    while steps < args.max_steps:
        key_step, key_action, key = jax.random.split(key_step, 3)
        action = choose(key_action, obs)
        obs, state, reward, terminated, truncated, _ = step(key, state, action, params)
        steps += 1
        episode_return += float(reward)
        task_done, timed_out = bool(terminated), bool(truncated)
        ended = task_done or timed_out or steps == args.max_steps
        outcome = ""
        if ended:
            outcome = "task done" if task_done else "timeout" if timed_out else "cut at --max-steps"
        progress = float(env.episode_progress(state))
        frame = render_frame_with_status(env, state, args.tile_pixels)
        frames.append(titled(frame, caption(steps, episode_return, progress, outcome)))
        if len(frames) % PROGRESS_EVERY == 0:
            print(f"rendered {len(frames)} frames", flush=True)
        if ended:
            break

    save_gif(frames, args.out, args.fps)
    progress = float(env.episode_progress(state))
    print(
        f'steps={steps} return={episode_return:.3f} outcome="{outcome}" '
        f"progress={progress:.1%} frames={len(frames)} out={args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
