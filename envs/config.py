"""Static configuration of the excavation environment (frozen, hashable dataclasses).

Everything here is known at trace time: changing a field recompiles. Dynamic data (the
map pool) lives in `envs.state.EnvParams`.
"""

from __future__ import annotations

import dataclasses
import math

VALID_MAP_SIZES = (16, 32, 64)


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Every reward weight of the environment. Penalties are negative numbers.

    Dense by default; `RewardConfig.sparse()` keeps only the terminal success bonus and a
    small existence penalty.
    """

    existence: float = -0.1
    move: float = -0.1
    base_turn: float = -0.1
    cabin_turn: float = -0.05
    wheel_turn: float = -0.05
    collision: float = -0.2
    move_while_loaded: float = -0.2
    dig_correct_per_tile: float = 1.0
    dump_correct_per_unit: float = 0.5
    dump_outside_zone_per_unit: float = -0.2
    do_no_effect: float = -0.3
    pickup_from_dump_zone_per_unit: float = -0.6
    terminal_success: float = 100.0
    normalizer: float = 100.0
    """Every term is divided by this, keeping per-step rewards near [-0.01, 1]."""

    @classmethod
    def sparse(cls) -> RewardConfig:
        zero = {f.name: 0.0 for f in dataclasses.fields(cls)}
        zero.update(existence=-0.1, collision=-0.1, terminal_success=100.0, normalizer=100.0)
        return cls(**zero)


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """Per-env curriculum over map types (level index = position in `levels`).

    An env is promoted after `promote_after` consecutive successful episodes (task done) and
    demoted after `demote_after` consecutive timeouts.
    """

    levels: tuple[str, ...] = ("foundations", "trenches")
    promote_after: int = 3
    demote_after: int = 5


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Static environment configuration.

    Geometry scales with `map_size` (16, 32 or 64): footprint 3x1 / 5x3 / 9x5 tiles, move
    step 1 / 1 / 2 tiles, workspace ring radii 1.5..3 / 2.5..5 / 4.5..9.5 tiles (a 60 degree
    ring sector in front of the arm, starting at half the footprint length).
    """

    map_size: int = 64
    max_steps: int = 550
    wheeled_fraction: float = 0.0
    reward: RewardConfig = RewardConfig()
    curriculum: CurriculumConfig | None = None
    num_last_actions: int = 5
    wheel_angle_limit: int = 1
    workspace_half_angle_deg: float = 30.0
    spawn_candidates: int = 8
    compute_action_mask: bool = True

    def __post_init__(self) -> None:
        if self.map_size not in VALID_MAP_SIZES:
            raise ValueError(f"map_size must be one of {VALID_MAP_SIZES}, got {self.map_size}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not 0.0 <= self.wheeled_fraction <= 1.0:
            raise ValueError(f"wheeled_fraction must be in [0, 1], got {self.wheeled_fraction}")
        if self.wheel_angle_limit < 0 or self.spawn_candidates < 1:
            raise ValueError("wheel_angle_limit must be >= 0 and spawn_candidates >= 1")

    @property
    def footprint_length(self) -> int:
        """Tiles along the base heading (odd)."""
        return {16: 3, 32: 5, 64: 9}[self.map_size]

    @property
    def footprint_width(self) -> int:
        """Tiles across the base heading (odd)."""
        return {16: 1, 32: 3, 64: 5}[self.map_size]

    @property
    def move_step(self) -> int:
        return {16: 1, 32: 1, 64: 2}[self.map_size]

    @property
    def workspace_radii(self) -> tuple[float, float]:
        return {16: (1.5, 3.0), 32: (2.5, 5.0), 64: (4.5, 9.5)}[self.map_size]

    @property
    def footprint_radius(self) -> float:
        return math.hypot(self.footprint_length / 2, self.footprint_width / 2)

    @property
    def window_radius(self) -> int:
        """Half-size of the local window every step works in.

        It must hold, around the pre-step position, the workspace and footprint after one
        move plus every candidate move of the next state (for the action mask).
        """
        reach = max(self.workspace_radii[1], self.footprint_radius + self.move_step)
        return math.ceil(self.move_step + reach)

    @property
    def spawn_clearance(self) -> int:
        """Half-size of the obstacle- and target-free square every map guarantees for spawning."""
        return {16: 3, 32: 4, 64: 6}[self.map_size]
