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
    """Every reward weight of the environment (`envs.rewards`). Costs are numbers <= 0.

    Dense by default: `progress_weight` times the discounted change of the task potential
    Phi = (dig tiles done - misplaced soil) / dig tiles total, `discount * Phi(s') - Phi(s)`,
    whose discounted sum over an episode is at most `progress_weight`; one `step` cost paid by
    every action, DO_NOTHING included; extra costs for wasted actions; `terminal_success` on
    the step that completes the task. `RewardConfig.sparse()` keeps only the step cost and the
    terminal bonus.
    """

    step: float = -0.002
    """Paid by every action, DO_NOTHING included: no loop is cheaper than idling."""
    collision: float = -0.002
    """Extra, for a move or base turn rejected by the map edge or a blocked tile."""
    move_while_loaded: float = -0.002
    """Extra, for a move or base turn tried with soil in the bucket."""
    do_no_effect: float = -0.002
    """Extra, for a DO that changes nothing."""
    progress_weight: float = 1.0
    """Scale of the potential-based progress term (the most an episode's progress can pay)."""
    terminal_success: float = 1.0
    """Paid on the step that completes the task; never on a timeout."""
    discount: float = 1.0
    """The discount the progress shaping is paid under: `discount * Phi(s') - Phi(s)`. The
    trainer sets it to the run's gamma (`TrainConfig.discounted_shaping`), the one form of
    potential-based shaping that leaves the optimal policy unchanged at that gamma: under a
    lower discount than the shaping's, a pick-up then dump of the same soil pays its gain
    first and its loss later, and a loop of them earns more than idling (`envs.rewards`)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {self.discount}")
        costs = ("step", "collision", "move_while_loaded", "do_no_effect")
        positive = [name for name in costs if getattr(self, name) > 0]
        if positive:
            raise ValueError(
                f"reward costs {positive} must be <= 0: a positive cost pays for wasting actions"
            )
        if self.progress_weight < 0 or self.terminal_success < 0:
            raise ValueError("progress_weight and terminal_success must be >= 0")

    @classmethod
    def sparse(cls, discount: float = 1.0) -> RewardConfig:
        return cls(collision=0.0, move_while_loaded=0.0, do_no_effect=0.0, progress_weight=0.0,
                   discount=discount)


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """Per-env curriculum over map types (level index = position in `levels`).

    An env is promoted after `promote_after` consecutive successful episodes (task done) and
    demoted after `demote_after` consecutive timeouts (0: never demoted).
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
    stall_steps: int = 0
    """With > 0, truncate an episode (a timeout, bootstrapped, never a failure of the task)
    after this many steps without a new best of the task potential. For training: a policy
    caught in a loop restarts on a fresh map instead of filling the batch with the loop.
    Evaluation keeps the full `max_steps`."""
    drivable_soil_height: int = 1
    """Dumped soil up to this height can be driven over; higher piles and dug tiles block the
    base. 1 follows Terra, where loose soil one unit high is traversable; 0 makes every soil
    tile block (the rule until 2026-11-24, under which a policy walled itself in with its own
    dumps: docs/RESULTS.md)."""
    dig_before_pickup: bool = True
    """DO with an empty bucket digs the undug targets in reach and picks up soil only where
    there are none. False picks soil up first (the rule until 2026-11-24), so soil dumped
    beside a target hides it until moved."""
    pickup_misplaced_only: bool = True
    """DO picks up only misplaced soil: soil outside the dump zones of a map that has them.
    Soil on a zone, or anywhere on a map without zones, stays where it was dumped, as no
    progress comes from moving it (False: any soil in reach, the rule until 2026-11-24)."""
    mask_dead_end_digs: bool = True
    """Mask a DO that would dig where, afterwards, no arm heading of the pose reaches a tile
    to dump on: a loaded excavator cannot move, so the episode could never be finished."""
    mask_dead_end_pickups: bool = True
    """The same for a DO that would pick soil up: a pick-up frees a tile for dumping only where
    it takes a pile's last unit, so lifting one unit off a higher pile where no other tile
    takes soil leaves the load stuck as a dead-end dig does (held-out 32x32 foundations ended
    that way: docs/RESULTS.md)."""
    mask_cut_off_digs: bool = False
    """Mask a DO that would dig where, afterwards, an undug target lies in reach of no pose
    the base can still drive to (`envs.reachability`): dug tiles block the base for good, so
    the task could never be finished. Off by default for its cost: a flood fill over the map
    every step, which at 256 envs takes the step from 34k to 4.7k env steps/s at 64x64 and
    to 18k at 32x32 on the 2-core CPU (docs/PERFORMANCE.md); `cpu_demo` (16x16) turns it on."""
    mask_cut_off_dumps: bool = False
    """Mask a loaded DO that would dump where, afterwards, an undug target lies in reach of
    no pose the base can still drive to: soil piled higher than `drivable_soil_height` blocks
    the base as a dug tile does. The same flood fill as `mask_cut_off_digs` (one per step for
    both: DO either digs or dumps), so it costs nothing more where that rule is on. Where every
    dump of the load would cut targets off, the loaded excavator is left the cabin turns until
    they have come full circle (`dump_after_full_turn`)."""
    remember_refused_digs: bool = False
    """The observation carries `refused_digs`, bool [N, N]: the targets the action mask has
    refused to dig (DO valid at a pose with an empty bucket, but masked) since the map last
    changed; the state keeps them until a DO changes the map. A policy's way to the next dig
    (`terra_rl.features.dig_distance.work_in_reach`) then leaves them out: without it,
    held-out 32x32 policies stalled for hundreds of steps at poses whose every dig the cut-off
    rule forbade, where their inputs read "work in reach" (docs/RESULTS.md). Needs the action
    mask."""
    dump_after_full_turn: bool = True
    """Once a loaded excavator's cabin has turned through all 12 headings since its last dig
    or dump (the revisit memory holds each; needs `revisit_memory` >= 12), the dump rules
    (`mask_cut_off_dumps`, `mask_dump_outside_zones`) no longer mask its DO. Where every dump
    of the pose cuts targets off, the load would otherwise stay in the bucket for good (the
    base cannot move while loaded); soil dumped outside a zone can be picked up again."""
    mask_dump_outside_zones: bool = False
    """On a map with dump zones, mask a DO that would dump the load outside them while a
    cabin turn from the same pose reaches a free zone tile: soil dumped outside must later be
    picked up and dumped again, and a greedy policy fell into doing just that for ever (pick
    up misplaced soil, dump it outside again; docs/RESULTS.md). A cabin turn stays allowed."""
    revisit_memory: int = 128
    """With > 0, the action mask forbids a move, base, wheel or cabin turn that returns to
    one of the last `revisit_memory` poses since the last dig or dump, and a DO that would
    pick soil up right after a dump. Between two DOs the map does not change, so such an
    action repeats a state, which no shortest plan does; masking it breaks the loops a greedy
    policy otherwise falls into (FORWARD-BACKWARD, a cabin spinning round). Where it would
    leave no action, the mask falls back to its other rules. 0 turns it off."""
    mask_do_nothing: bool = True
    """Mask DO_NOTHING in the action mask. Nothing else in the world moves, so waiting never
    helps; a policy unsure of its next move otherwise learns to wait out the episode (56% of
    a greedy cpu_demo policy's actions). A cabin turn is always allowed, so no state has every
    action masked. DO_NOTHING still costs the step cost when taken unmasked."""

    def __post_init__(self) -> None:
        if self.map_size not in VALID_MAP_SIZES:
            raise ValueError(f"map_size must be one of {VALID_MAP_SIZES}, got {self.map_size}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not 0.0 <= self.wheeled_fraction <= 1.0:
            raise ValueError(f"wheeled_fraction must be in [0, 1], got {self.wheeled_fraction}")
        if self.drivable_soil_height < 0:
            raise ValueError(
                f"drivable_soil_height must be >= 0, got {self.drivable_soil_height}"
            )
        if self.revisit_memory < 0:
            raise ValueError(f"revisit_memory must be >= 0, got {self.revisit_memory}")
        if self.stall_steps < 0:
            raise ValueError(f"stall_steps must be >= 0, got {self.stall_steps}")
        if self.wheel_angle_limit < 0 or self.spawn_candidates < 1:
            raise ValueError("wheel_angle_limit must be >= 0 and spawn_candidates >= 1")
        if self.remember_refused_digs and not self.compute_action_mask:
            raise ValueError("remember_refused_digs needs compute_action_mask: the refusals "
                             "are the action mask's")

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
