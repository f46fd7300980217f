"""Map generation, dataset IO and the generate_maps.py CLI."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.dataset import DatasetError, load_map_dataset, save_map_dataset, validate_map_set
from envs.maps import (
    MAP_TYPES,
    VALID_MAP_SIZES,
    MapSet,
    default_spawn_clearance,
    generate_maps,
    max_spawn_clearance,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
FOUNDATIONS, TRENCHES = MAP_TYPES.index("foundations"), MAP_TYPES.index("trenches")


def _near(mask: np.ndarray, radius: int) -> np.ndarray:
    """bool [M, N, N]: True within `radius` tiles (8-neighbourhood) of mask [M, N, N]."""
    padded = np.pad(mask, ((0, 0), (radius, radius), (radius, radius)))
    size = mask.shape[-1]
    near = np.zeros_like(mask)
    for dr in range(2 * radius + 1):
        for dc in range(2 * radius + 1):
            near |= padded[:, dr : dr + size, dc : dc + size]
    return near


def _assert_invariants(maps: MapSet, clearance: int) -> None:
    validate_map_set(maps, clearance)
    m, n = maps.count, maps.size
    expected = {
        "target_map": (np.int8, (m, n, n)),
        "obstacles": (np.int8, (m, n, n)),
        "dumpability": (np.int8, (m, n, n)),
        "map_type": (np.int8, (m,)),
        "spawn_pose": (np.int32, (m, 2)),
    }
    for field, (dtype, shape) in expected.items():
        array = getattr(maps, field)
        assert array.dtype == dtype and array.shape == shape, field
    assert set(np.unique(maps.target_map)) <= {-1, 0, 1}
    assert set(np.unique(maps.obstacles)) <= {0, 1}
    assert set(np.unique(maps.dumpability)) <= {0, 1}
    dig, dump, obstacle = maps.target_map == -1, maps.target_map == 1, maps.obstacles == 1
    assert dig.any(axis=(1, 2)).all()
    assert not (obstacle & (maps.target_map != 0)).any()
    assert not (obstacle & (maps.dumpability == 1)).any()

    foundations, trenches = maps.map_type == FOUNDATIONS, maps.map_type == TRENCHES
    dig_area, dump_area = dig.sum(axis=(1, 2)), dump.sum(axis=(1, 2))
    assert (dump_area[foundations] >= dig_area[foundations]).all()
    assert not (dump & _near(dig, 1))[foundations].any(), "dump zone must be 1 tile from dig"
    # A lane as wide as the excavator stays free round foundations: no zone (soil goes on
    # zones only, so no pile can close it), no obstacle, no footprint at the map's edge.
    lane = EnvConfig(map_size=n).footprint_width
    edge = np.ones((n, n), bool)
    edge[lane:-lane, lane:-lane] = False
    assert not (dump & _near(dig, lane))[foundations].any()
    assert not (obstacle & _near(dig, lane))[foundations].any()
    assert not (dig & edge)[foundations].any()
    from envs.maps import _every_target_has_a_zone_in_reach

    for i in np.flatnonzero(foundations):
        assert _every_target_has_a_zone_in_reach(dig[i], dump[i], obstacle[i], n), i
    assert (dump_area[trenches] == 0).all()
    # every trench map has a no-dump patch, and the soil fits on the dumpable free tiles
    no_dump = (maps.dumpability == 0) & ~obstacle
    assert no_dump.any(axis=(1, 2))[trenches].all()
    free_dumpable = ((maps.dumpability == 1) & ~dig).sum(axis=(1, 2))
    assert (free_dumpable[trenches] >= dig_area[trenches]).all()
    # the curriculum's first levels: a few tiles, no obstacles, zones only on tiny foundations
    tiny_trenches = maps.map_type == MAP_TYPES.index("tiny_trenches")
    tiny_foundations = maps.map_type == MAP_TYPES.index("tiny_foundations")
    assert ((dig_area >= 2) & (dig_area <= 4))[tiny_trenches].all()
    assert (dump_area[tiny_trenches] == 0).all()
    assert ((dig_area >= 2) & (dig_area <= 6))[tiny_foundations].all()
    assert (dump_area[tiny_foundations] >= dig_area[tiny_foundations]).all()
    assert not obstacle[tiny_trenches | tiny_foundations].any()

    for (row, col), target, obstacles in zip(
        maps.spawn_pose, maps.target_map, maps.obstacles, strict=True
    ):
        assert clearance <= row < n - clearance and clearance <= col < n - clearance
        square = np.s_[row - clearance : row + clearance + 1, col - clearance : col + clearance + 1]
        assert not target[square].any() and not obstacles[square].any()


# ----------------------------------------------------------------------------- generation


@pytest.mark.parametrize("size", VALID_MAP_SIZES)
@pytest.mark.parametrize("map_type", MAP_TYPES)
def test_generated_maps_satisfy_invariants(map_type, size):
    clearance = default_spawn_clearance(size)
    maps = generate_maps(
        [map_type], size, count=60 if size < 64 else 20, seed=3, spawn_clearance=clearance
    )
    assert maps.size == size and maps.count == (60 if size < 64 else 20)
    assert (maps.map_type == MAP_TYPES.index(map_type)).all()
    _assert_invariants(maps, clearance)


@pytest.mark.parametrize("size", [16, 32])
def test_largest_spawn_clearance_still_leaves_targets(size):
    clearance = max_spawn_clearance(size)
    maps = generate_maps(MAP_TYPES, size, count=20, seed=5, spawn_clearance=clearance)
    _assert_invariants(maps, clearance)


def test_maps_vary_within_a_set():
    maps = generate_maps(MAP_TYPES, 32, count=40, seed=0, spawn_clearance=4)
    dig_areas = (maps.target_map == -1).sum(axis=(1, 2))
    assert len(np.unique(dig_areas)) > 10
    assert len({tuple(pose) for pose in maps.spawn_pose}) > 10
    assert (maps.obstacles[maps.map_type == TRENCHES] == 1).any()


def test_same_seed_same_maps_different_seed_different_maps():
    first = generate_maps(MAP_TYPES, 16, count=12, seed=7, spawn_clearance=3)
    again = generate_maps(MAP_TYPES, 16, count=12, seed=7, spawn_clearance=3)
    other = generate_maps(MAP_TYPES, 16, count=12, seed=8, spawn_clearance=3)
    assert first.equals(again)
    assert not np.array_equal(first.target_map, other.target_map)


def test_shorter_run_is_a_prefix_of_a_longer_one():
    short = generate_maps(MAP_TYPES, 16, count=5, seed=2, spawn_clearance=3)
    long = generate_maps(MAP_TYPES, 16, count=11, seed=2, spawn_clearance=3)
    assert short.equals(long.head(5))


def test_types_are_split_round_robin():
    maps = generate_maps(["trenches", "foundations"], 16, count=7, seed=0, spawn_clearance=3)
    assert maps.map_type.tolist() == [TRENCHES, FOUNDATIONS] * 3 + [TRENCHES]
    assert maps.type_counts() == {"foundations": 3, "trenches": 4, "tiny_trenches": 0,
                                  "tiny_foundations": 0}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"types": ["castles"]}, "valid types: " + ", ".join(MAP_TYPES)),
        ({"types": []}, "valid types: " + ", ".join(MAP_TYPES)),
        ({"size": 20}, "valid sizes: 16, 32, 64"),
        ({"count": 0}, "count"),
        ({"seed": -1}, "seed"),
        ({"spawn_clearance": 5}, "0..4"),
    ],
)
def test_bad_generation_arguments_raise_one_line_value_error(kwargs, expected):
    arguments = {"types": MAP_TYPES, "size": 16, "count": 2, "seed": 0, "spawn_clearance": 3}
    with pytest.raises(ValueError, match=expected) as error:
        generate_maps(**(arguments | kwargs))
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- dataset IO


@pytest.fixture
def dataset_dir(tmp_path) -> Path:
    maps = generate_maps(MAP_TYPES, 16, count=6, seed=1, spawn_clearance=3)
    return save_map_dataset(maps, tmp_path / "maps", seed=1, types=MAP_TYPES)


def test_save_then_load_round_trips(dataset_dir):
    original = generate_maps(MAP_TYPES, 16, count=6, seed=1, spawn_clearance=3)
    assert load_map_dataset(dataset_dir).equals(original)
    assert load_map_dataset(dataset_dir, max_maps=4).equals(original.head(4))
    manifest = json.loads((dataset_dir / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    assert (manifest["map_size"], manifest["count"], manifest["seed"]) == (16, 6, 1)
    assert manifest["spawn_clearance"] == 3
    assert manifest["counts_per_type"] == {"foundations": 2, "trenches": 2, "tiny_trenches": 1,
                                           "tiny_foundations": 1}
    assert manifest["files"]["spawn_pose"]["shape"] == [6, 2]
    assert manifest["files"]["spawn_pose"]["dtype"] == "int32"


def _rewrite_field(dataset_dir: Path, field: str, array: np.ndarray) -> None:
    """Replace one .npy and update its checksum, so only the content check can catch it."""
    path = dataset_dir / f"{field}.npy"
    np.save(path, array, allow_pickle=False)
    manifest_path = dataset_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][field]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))


def _flip_last_byte(dataset_dir: Path) -> None:
    path = dataset_dir / "obstacles.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def _put_obstacle_on_target(dataset_dir: Path) -> None:
    maps = load_map_dataset(dataset_dir)
    obstacles = maps.obstacles.copy()
    row, col = np.argwhere(maps.target_map[0] == -1)[0]
    obstacles[0, row, col] = 1
    _rewrite_field(dataset_dir, "obstacles", obstacles)


def _load_field(dataset_dir: Path, field: str) -> np.ndarray:
    return np.load(dataset_dir / f"{field}.npy")


CORRUPTIONS = {
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json", "not found"),
    "bad manifest json": (
        lambda d: (d / "manifest.json").write_text("{not json"),
        "manifest.json",
        "invalid JSON",
    ),
    "missing file": (lambda d: (d / "dumpability.npy").unlink(), "dumpability.npy", "missing"),
    "checksum mismatch": (_flip_last_byte, "obstacles.npy", "checksum mismatch"),
    "wrong dtype": (
        lambda d: _rewrite_field(d, "target_map", _load_field(d, "target_map").astype(np.int32)),
        "target_map.npy",
        "dtype int32",
    ),
    "wrong shape": (
        lambda d: _rewrite_field(d, "spawn_pose", _load_field(d, "spawn_pose")[:, :1].copy()),
        "spawn_pose.npy",
        "shape",
    ),
    "invalid value": (
        lambda d: _rewrite_field(d, "dumpability", _load_field(d, "dumpability") * 2),
        "dumpability.npy",
        "invalid value 2",
    ),
    "obstacle on target": (_put_obstacle_on_target, "obstacles.npy", "obstacle on a target"),
    "spawn square outside map": (
        lambda d: _rewrite_field(d, "spawn_pose", np.zeros((6, 2), np.int32)),
        "spawn_pose.npy",
        "leaves the map",
    ),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS, ids=list(CORRUPTIONS))
def test_corrupt_dataset_raises_one_line_error_naming_the_file(dataset_dir, corruption):
    corrupt, file_name, problem = CORRUPTIONS[corruption]
    corrupt(dataset_dir)
    with pytest.raises(DatasetError, match=problem) as error:
        load_map_dataset(dataset_dir)
    message = str(error.value)
    assert str(dataset_dir / file_name) in message
    assert "\n" not in message


def test_max_maps_beyond_the_dataset_is_an_error(dataset_dir):
    with pytest.raises(DatasetError, match="max_maps=7 but the dataset holds 6") as error:
        load_map_dataset(dataset_dir, max_maps=7)
    assert "manifest.json" in str(error.value) and "\n" not in str(error.value)


def test_save_refuses_a_map_set_that_breaks_invariants(tmp_path):
    maps = generate_maps(["trenches"], 16, count=2, seed=0, spawn_clearance=3)
    bad = MapSet(
        maps.target_map, maps.obstacles, maps.dumpability, maps.map_type, maps.spawn_pose + 100
    )
    with pytest.raises(DatasetError, match="<in-memory> MapSet.spawn_pose: map 0"):
        save_map_dataset(bad, tmp_path / "bad", seed=0, types=["trenches"])
    assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------- CLI


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "generate_maps.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_writes_a_loadable_dataset(tmp_path):
    out = tmp_path / "cli_maps"
    result = _run_cli(
        "--out", str(out), "--types", "foundations,trenches", "--size", "32", "--count", "5",
        "--seed", "4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "foundations: 3" in result.stdout and "trenches: 2" in result.stdout
    maps = load_map_dataset(out)
    assert maps.equals(generate_maps(("foundations", "trenches"), 32, count=5, seed=4,
                                     spawn_clearance=4))


def test_cli_rejects_unknown_type_with_exit_code_2(tmp_path):
    result = _run_cli(
        "--out", str(tmp_path / "x"), "--types", "foundations,castles", "--size", "16",
        "--count", "2", "--seed", "0",
    )  # fmt: skip
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "castles" in result.stderr and "foundations, trenches" in result.stderr
    assert not (tmp_path / "x").exists()


def test_validate_rejects_a_spawn_square_holding_a_target():
    maps = generate_maps(["foundations"], 32, count=3, seed=0, spawn_clearance=4)
    spawn = maps.spawn_pose.copy()
    dig_rows, dig_cols = np.nonzero(maps.target_map[1] == -1)
    spawn[1] = np.clip([dig_rows[0], dig_cols[0]], 4, 27)
    moved = MapSet(maps.target_map, maps.obstacles, maps.dumpability, maps.map_type, spawn)
    with pytest.raises(DatasetError, match="map 1: spawn square of half-size 4 contains"):
        validate_map_set(moved, spawn_clearance=4)


def test_dataset_error_is_one_line_in_both_forms():
    assert str(DatasetError("/data/x.npy", "bad\nvalue")) == "/data/x.npy: bad value"
    assert str(DatasetError("pool has\nno maps")) == "pool has no maps"
    assert issubclass(DatasetError, ValueError)


@pytest.mark.parametrize("size", VALID_MAP_SIZES)
def test_the_fallback_foundation_keeps_the_free_lane(size):
    from envs.maps import _fallback_layout

    layout = _fallback_layout("foundations", size, default_spawn_clearance(size))
    lane = EnvConfig(map_size=size).footprint_width
    dig, dump = layout.target == -1, layout.target == 1
    assert dig.sum() == 4 and dump.sum() >= 4
    assert not (dump & _near(dig[None], lane)[0]).any()
    assert not dig[:lane].any() and not dig[-lane:].any()
    assert not dig[:, :lane].any() and not dig[:, -lane:].any()


@pytest.mark.parametrize("side, expected", [(15, True), (31, False)])
def test_targets_beyond_any_zones_reach_are_refused(side, expected):
    """A square foundation on a 64x64 map, zones beyond the 5-tile lane: 15 tiles across,
    every target is in the arm's ring of a position with a zone in its ring too; 31 across,
    the middle ones are 9.5 + 9.5 tiles or more from every zone, beyond any position's reach."""
    from envs.maps import _every_target_has_a_zone_in_reach

    size, lane = 64, 5
    dig = np.zeros((size, size), bool)
    start = (size - side) // 2
    dig[start : start + side, start : start + side] = True
    near, far = _near(dig[None], lane)[0], _near(dig[None], lane + 5)[0]
    dump = far & ~near
    obstacles = np.zeros((size, size), bool)
    assert _every_target_has_a_zone_in_reach(dig, dump, obstacles, size) is expected
    # Obstacles on every other tile leave the excavator nowhere to stand: nothing is served.
    obstacles[::2, ::2] = True
    assert not _every_target_has_a_zone_in_reach(dig & ~obstacles, dump & ~obstacles,
                                                 obstacles, size)
