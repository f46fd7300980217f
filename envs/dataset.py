"""Map dataset on disk: one .npy per MapSet field plus manifest.json, validated on load.

Layout of a dataset directory:
  manifest.json    format_version, map_size, count, spawn_clearance, seed, map_types,
                   requested_types, counts_per_type, files: {field: {file, shape, dtype, sha256}}
  target_map.npy   int8  [M, N, N]
  obstacles.npy    int8  [M, N, N]
  dumpability.npy  int8  [M, N, N]
  map_type.npy     int8  [M]
  spawn_pose.npy   int32 [M, 2]
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from envs.maps import HAS_DUMP_ZONES, MAP_TYPES, VALID_MAP_SIZES, MapSet, default_spawn_clearance

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
REGENERATE_HINT = "regenerate with scripts/generate_maps.py"
IN_MEMORY = "<in-memory>"

FIELD_DTYPES: dict[str, np.dtype] = {
    "target_map": np.dtype(np.int8),
    "obstacles": np.dtype(np.int8),
    "dumpability": np.dtype(np.int8),
    "map_type": np.dtype(np.int8),
    "spawn_pose": np.dtype(np.int32),
}
ALLOWED_VALUES: dict[str, tuple[int, ...]] = {
    "target_map": (-1, 0, 1),
    "obstacles": (0, 1),
    "dumpability": (0, 1),
    "map_type": tuple(range(len(MAP_TYPES))),
}


class DatasetError(ValueError):
    """A dataset (or in-memory MapSet) is missing, corrupt or breaks a map invariant.

    The message is always one line: DatasetError(where, problem) reads '<where>: <problem>';
    DatasetError(message) keeps the message as is (newlines folded).
    """

    def __init__(self, where: str | Path, problem: str | None = None):
        message = str(where) if problem is None else f"{where}: {problem}"
        super().__init__(" ".join(message.split()))


def expected_shapes(count: int, size: int) -> dict[str, tuple[int, ...]]:
    """Shape of every MapSet field for `count` maps of side `size`."""
    grid = (count, size, size)
    return {
        "target_map": grid,
        "obstacles": grid,
        "dumpability": grid,
        "map_type": (count,),
        "spawn_pose": (count, 2),
    }


def save_map_dataset(
    maps: MapSet,
    out_dir: str | Path,
    *,
    seed: int,
    types: Sequence[str],
    spawn_clearance: int | None = None,
) -> Path:
    """Validate `maps` and write them to `out_dir` (created if needed). Returns the directory.

    spawn_clearance defaults to default_spawn_clearance(maps.size); it is stored in the manifest
    so the loader can re-check every spawn square.
    """
    clearance = default_spawn_clearance(maps.size) if spawn_clearance is None else spawn_clearance
    validate_map_set(maps, clearance)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST_NAME
    # The manifest is written last, so a half-written dataset never looks complete.
    manifest_path.unlink(missing_ok=True)
    files = {}
    for field, array in maps.fields().items():
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        data = buffer.getvalue()
        (out / f"{field}.npy").write_bytes(data)
        files[field] = {
            "file": f"{field}.npy",
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "map_size": maps.size,
        "count": maps.count,
        "spawn_clearance": clearance,
        "seed": seed,
        "map_types": list(MAP_TYPES),
        "requested_types": list(types),
        "counts_per_type": maps.type_counts(),
        "files": files,
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def load_map_dataset(path: str | Path, max_maps: int | None = None) -> MapSet:
    """Read, check and return the dataset in directory `path`; keep the first max_maps maps.

    Raises DatasetError (one line naming the file) on any missing, corrupt or invalid content.
    """
    root = Path(path)
    manifest_path = root / MANIFEST_NAME
    manifest = _read_manifest(manifest_path)
    count, size = manifest["count"], manifest["map_size"]
    if max_maps is not None and not (isinstance(max_maps, int) and 1 <= max_maps <= count):
        raise DatasetError(
            manifest_path, f"max_maps={max_maps!r} but the dataset holds {count} maps"
        )
    shapes = expected_shapes(count, size)
    arrays = {}
    for field, dtype in FIELD_DTYPES.items():
        arrays[field] = _read_field(root / f"{field}.npy", manifest["files"][field], dtype)
        if arrays[field].shape != shapes[field]:
            raise DatasetError(
                root / f"{field}.npy",
                f"shape {arrays[field].shape} does not fit count={count}, map_size={size} "
                f"(expected {shapes[field]})",
            )
    maps = MapSet(**arrays)
    validate_map_set(maps, manifest["spawn_clearance"], source=root)
    stated_counts = manifest.get("counts_per_type")
    if stated_counts is not None and stated_counts != maps.type_counts():
        raise DatasetError(
            root / "map_type.npy",
            f"type counts {maps.type_counts()} differ from manifest counts {stated_counts}",
        )
    return maps if max_maps is None else maps.head(max_maps)


def validate_map_set(maps: MapSet, spawn_clearance: int, source: str | Path = IN_MEMORY) -> None:
    """Check dtypes, shapes, value sets and map invariants; raise DatasetError on the first fault.

    Invariants: every map has a dig tile; no obstacle on a target tile; obstacles are not
    dumpable; foundations have a dump zone at least as large as the dig area, trenches have none;
    the spawn square (half-size spawn_clearance) lies inside the map and is free of obstacles
    and targets. `source` names the dataset directory in error messages; a name in angle
    brackets such as "<generated>" marks maps that never came from disk.
    """

    def where(file_name: str) -> str:
        if str(source).startswith("<"):
            return f"{source} MapSet.{file_name.removesuffix('.npy')}"
        return str(Path(source) / file_name)

    for field, dtype in FIELD_DTYPES.items():
        array = getattr(maps, field)
        if not isinstance(array, np.ndarray) or array.dtype != dtype:
            found = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
            raise DatasetError(where(f"{field}.npy"), f"dtype {found}, expected {dtype}")
    target = maps.target_map
    if target.ndim != 3 or target.shape[1] != target.shape[2] or target.shape[0] < 1:
        raise DatasetError(where("target_map.npy"), f"shape {target.shape} is not [M>=1, N, N]")
    if maps.size not in VALID_MAP_SIZES:
        raise DatasetError(
            where("target_map.npy"), f"map size {maps.size} not in {VALID_MAP_SIZES}"
        )
    for field, shape in expected_shapes(maps.count, maps.size).items():
        if getattr(maps, field).shape != shape:
            raise DatasetError(
                where(f"{field}.npy"),
                f"shape {getattr(maps, field).shape} does not match target_map (expected {shape})",
            )
    for field, allowed in ALLOWED_VALUES.items():
        invalid = ~np.isin(getattr(maps, field), allowed)
        if invalid.any():
            index = tuple(int(i) for i in np.argwhere(invalid)[0])
            value = getattr(maps, field)[index]
            raise DatasetError(
                where(f"{field}.npy"), f"invalid value {value} at index {index}, allowed {allowed}"
            )

    obstacles = maps.obstacles == 1
    _raise_at_first(obstacles & (target != 0), where("obstacles.npy"), "obstacle on a target tile")
    _raise_at_first(
        obstacles & (maps.dumpability == 1), where("dumpability.npy"), "obstacle tile is dumpable"
    )
    dig_area = (target == -1).sum(axis=(1, 2))
    dump_area = (target == 1).sum(axis=(1, 2))
    _raise_at_first(dig_area == 0, where("target_map.npy"), "map has no dig tile")
    zoned_types = [i for i, name in enumerate(MAP_TYPES) if HAS_DUMP_ZONES[name]]
    has_zones = np.isin(maps.map_type, zoned_types)
    _raise_at_first(
        has_zones & (dump_area < dig_area),
        where("target_map.npy"),
        "map with dump zones (foundations) has less dump-zone area than dig area",
    )
    _raise_at_first(
        ~has_zones & (dump_area > 0),
        where("target_map.npy"),
        "map without dump zones (trenches) has dump-zone tiles",
    )
    _check_spawn_squares(maps, spawn_clearance, where("spawn_pose.npy"))


def _check_spawn_squares(maps: MapSet, clearance: int, where: str) -> None:
    if not isinstance(clearance, int) or clearance < 0:
        raise DatasetError(where, f"spawn_clearance must be an integer >= 0, got {clearance!r}")
    rows, cols = maps.spawn_pose[:, 0].astype(np.int64), maps.spawn_pose[:, 1].astype(np.int64)
    low, high = clearance, maps.size - 1 - clearance
    outside = (rows < low) | (rows > high) | (cols < low) | (cols > high)
    _raise_at_first(
        outside,
        where,
        f"spawn square of half-size {clearance} leaves the map (centre rows "
        f"and cols must be in {low}..{high})",
    )
    blocked = ((maps.obstacles == 1) | (maps.target_map != 0)).astype(np.int32)
    integral = np.zeros((maps.count, maps.size + 1, maps.size + 1), np.int32)
    integral[:, 1:, 1:] = blocked.cumsum(axis=1).cumsum(axis=2)
    top, bottom, left, right = (
        rows - clearance,
        rows + clearance + 1,
        cols - clearance,
        cols + clearance + 1,
    )
    index = np.arange(maps.count)
    blocked_in_square = (
        integral[index, bottom, right]
        - integral[index, top, right]
        - integral[index, bottom, left]
        + integral[index, top, left]
    )
    _raise_at_first(
        blocked_in_square > 0,
        where,
        f"spawn square of half-size {clearance} contains obstacle or target tiles",
    )


def _raise_at_first(bad: np.ndarray, where: str, problem: str) -> None:
    """Raise DatasetError naming the first True entry of `bad` ([M] or [M, N, N])."""
    if bad.any():
        first = np.argwhere(bad)[0]
        location = f"map {first[0]}" + (
            f" (row {first[1]}, col {first[2]})" if bad.ndim == 3 else ""
        )
        raise DatasetError(where, f"{location}: {problem}")


def _read_manifest(manifest_path: Path) -> dict:
    if not manifest_path.is_file():
        raise DatasetError(manifest_path, f"manifest not found; {REGENERATE_HINT}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetError(manifest_path, f"cannot read manifest ({error})") from error
    except json.JSONDecodeError as error:
        raise DatasetError(
            manifest_path, f"invalid JSON ({error.msg} at line {error.lineno}); {REGENERATE_HINT}"
        ) from error
    if not isinstance(manifest, dict):
        raise DatasetError(manifest_path, "manifest is not a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DatasetError(
            manifest_path,
            f"format_version {manifest.get('format_version')!r} is not supported "
            f"(expected {FORMAT_VERSION}); {REGENERATE_HINT}",
        )
    for key in ("map_size", "count", "spawn_clearance"):
        if not isinstance(manifest.get(key), int) or isinstance(manifest.get(key), bool):
            raise DatasetError(manifest_path, f"missing or non-integer key {key!r}")
    if manifest["map_size"] not in VALID_MAP_SIZES:
        raise DatasetError(
            manifest_path, f"map_size {manifest['map_size']} not in {VALID_MAP_SIZES}"
        )
    if manifest["count"] < 1:
        raise DatasetError(manifest_path, f"count {manifest['count']} must be >= 1")
    files = manifest.get("files")
    for field in FIELD_DTYPES:
        entry = files.get(field) if isinstance(files, dict) else None
        if not isinstance(entry, dict) or not {"shape", "dtype", "sha256"} <= entry.keys():
            raise DatasetError(manifest_path, f"files.{field} must give shape, dtype and sha256")
    return manifest


def _read_field(path: Path, entry: dict, dtype: np.dtype) -> np.ndarray:
    """Load one .npy, checking it against its manifest entry and the expected dtype."""
    if not path.is_file():
        raise DatasetError(path, f"file missing; {REGENERATE_HINT}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise DatasetError(
            path,
            f"checksum mismatch (manifest says {str(entry['sha256'])[:12]}..., "
            f"file has {digest[:12]}...); {REGENERATE_HINT}",
        )
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise DatasetError(path, f"not a readable .npy array ({error})") from error
    if array.dtype != dtype or entry["dtype"] != str(dtype):
        raise DatasetError(
            path, f"dtype {array.dtype} (manifest says {entry['dtype']}), expected {dtype}"
        )
    if list(array.shape) != list(entry["shape"]):
        raise DatasetError(
            path, f"shape {array.shape} differs from manifest shape {tuple(entry['shape'])}"
        )
    return array
