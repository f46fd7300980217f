"""Generate a procedural map dataset for the excavation env.

Example:
    python scripts/generate_maps.py --out data/maps64 --types foundations,trenches \\
        --size 64 --count 1000 --seed 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

from envs.dataset import save_map_dataset  # noqa: E402
from envs.maps import (  # noqa: E402
    MAP_TYPES,
    VALID_MAP_SIZES,
    check_generation_args,
    default_spawn_clearance,
    generate_maps,
)
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="generate_maps.py", description="Generate a procedural map dataset."
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory (created)")
    parser.add_argument(
        "--types",
        required=True,
        help=f"comma-separated map types, assigned round robin; valid: {','.join(MAP_TYPES)}",
    )
    parser.add_argument(
        "--size", required=True, type=int, help=f"map side in tiles, one of {VALID_MAP_SIZES}"
    )
    parser.add_argument("--count", required=True, type=int, help="number of maps (>= 1)")
    parser.add_argument("--seed", required=True, type=int, help="random seed (>= 0)")
    parser.add_argument(
        "--spawn-clearance",
        type=int,
        default=None,
        help="half-size of the obstacle- and target-free square around each spawn pose "
        "(default: 6 for size 64, 4 for 32, 3 for 16)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    types = tuple(name.strip() for name in args.types.split(",") if name.strip())
    try:
        clearance = (
            default_spawn_clearance(args.size)
            if args.spawn_clearance is None
            else args.spawn_clearance
        )
        check_generation_args(types, args.size, args.count, args.seed, clearance)
    except ValueError as error:
        parser.error(str(error))

    start = time.perf_counter()
    maps = generate_maps(types, args.size, args.count, args.seed, clearance)
    try:
        out = save_map_dataset(
            maps, args.out, seed=args.seed, types=types, spawn_clearance=clearance
        )
    except OSError as error:
        print(f"{parser.prog}: error: cannot write {args.out}: {error}", file=sys.stderr)
        return 1
    per_type = ", ".join(f"{name}: {n}" for name, n in maps.type_counts().items() if n)
    print(
        f"wrote {maps.count} maps of {args.size}x{args.size} ({per_type}; "
        f"spawn clearance {clearance}) to {out} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
