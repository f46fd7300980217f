"""Builds `EnvParams` (the map pool) from generated maps or a dataset on disk."""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from envs.config import EnvConfig
from envs.dataset import DatasetError, load_map_dataset, validate_map_set
from envs.maps import MAP_TYPES, MapSet, generate_maps
from envs.state import EnvParams

DEFAULT_NUM_MAPS = 256


def params_from_maps(maps: MapSet) -> EnvParams:
    """Device arrays of a map pool, plus per-type index tables for the curriculum."""
    map_type = np.asarray(maps.map_type, np.int32)
    count = len(map_type)
    maps_of_type = np.zeros((len(MAP_TYPES), count), np.int32)
    num_maps_of_type = np.zeros((len(MAP_TYPES),), np.int32)
    for type_id in range(len(MAP_TYPES)):
        indices = np.flatnonzero(map_type == type_id)
        num_maps_of_type[type_id] = len(indices)
        if len(indices):
            maps_of_type[type_id] = np.resize(indices, count)
    return EnvParams(
        target_map=jnp.asarray(maps.target_map, jnp.int8),
        obstacles=jnp.asarray(maps.obstacles, jnp.int8),
        dumpability=jnp.asarray(maps.dumpability, jnp.int8),
        map_type=jnp.asarray(maps.map_type, jnp.int8),
        spawn_pose=jnp.asarray(maps.spawn_pose, jnp.int32),
        maps_of_type=jnp.asarray(maps_of_type),
        num_maps_of_type=jnp.asarray(num_maps_of_type),
    )


def dataset_from_environment() -> tuple[str | None, int | None]:
    """(`DATASET_PATH`, `DATASET_SIZE`) from the environment, None where unset."""
    path = os.environ.get("DATASET_PATH") or None
    size = os.environ.get("DATASET_SIZE")
    if not size:
        return path, None
    try:
        return path, int(size)
    except ValueError as error:
        raise DatasetError(f"DATASET_SIZE must be an integer, got {size!r}") from error


def make_env_params(
    config: EnvConfig,
    *,
    map_types: Sequence[str] = ("foundations",),
    num_maps: int = DEFAULT_NUM_MAPS,
    seed: int = 0,
    dataset_path: str | os.PathLike | None = None,
    dataset_size: int | None = None,
) -> EnvParams:
    """The map pool: a dataset when `dataset_path` is given, else maps generated in-process.

    `dataset_path` / `dataset_size` default to the `DATASET_PATH` / `DATASET_SIZE`
    environment variables; `dataset_size` keeps the first K maps of the dataset.
    """
    if dataset_size is None:
        _, dataset_size = dataset_from_environment()
    dataset_path = dataset_path or os.environ.get("DATASET_PATH") or None
    if dataset_path:
        maps = load_map_dataset(dataset_path, max_maps=dataset_size)
        if maps.size != config.map_size:
            raise DatasetError(
                f"{dataset_path}: maps are {maps.size}x{maps.size} but the env expects "
                f"{config.map_size}x{config.map_size}; set map_size or pick another dataset"
            )
    else:
        maps = generate_maps(map_types, config.map_size, num_maps, seed, config.spawn_clearance)
    validate_map_set(maps, config.spawn_clearance, source=dataset_path or "<generated>")
    if config.curriculum is not None:
        present = {MAP_TYPES[t] for t in np.unique(maps.map_type)}
        missing = [level for level in config.curriculum.levels if level not in present]
        if missing:
            raise DatasetError(f"curriculum levels {missing} have no maps in the pool")
    return params_from_maps(maps)
