"""Targets cut off: undug target tiles no pose the base can still drive to reaches with its
arm. Dug tiles block the base for good, so a dig in the wrong order can wall the excavator
off from the targets it has left, or wall it into its own pose (`EnvConfig.mask_cut_off_digs`).

A flood fill over the base poses (base heading, row, col) from the agent's pose, with the
agent type's own moves, into poses whose footprint lies inside the map on traversable tiles:

- tracked: FORWARD/BACKWARD along the heading, base turns in place;
- wheeled: FORWARD/BACKWARD along an arc with wheel angle -1, 0 or +1 (the wheels turn in
  place, so every angle is available before a move; `wheel_angle_limit` 1).

A target is reachable when it lies in the workspace ring of a reachable position (the union
of the 12 arm sectors; at every map size the ring starts beyond the footprint). The test is
exact for the moves and errs on the side of reachable for the arm: it ignores whether the
pose has dump space for the load.

The factories are cached per config and return jitted functions. The env calls the fill
from its reset, its step and its observation, and the trainer traces the init, the update
and the eval in one process: each of those traces would otherwise trace the fill's
thousands of operations again. A jit traces them once per config and argument shapes, and
XLA inlines the call when it compiles: runs log the same values as before.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from envs import excavation
from envs import geometry as geo
from envs.config import EnvConfig

H = geo.NUM_HEADINGS


def _offsets(mask: np.ndarray, radius: int) -> tuple[tuple[int, int], ...]:
    rows, cols = np.nonzero(mask)
    return tuple(zip((rows - radius).tolist(), (cols - radius).tolist(), strict=True))


def footprint_offsets(config: EnvConfig) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per base heading, the (row, col) offsets of the footprint tiles from its centre
    (`geometry.footprint_boxes`)."""
    boxes = geo.footprint_boxes(config)
    return tuple(_offsets(box, boxes.shape[-1] // 2) for box in boxes)


@functools.cache
def ring_offsets(config: EnvConfig) -> tuple[tuple[int, int], ...]:
    """(row, col) offsets of the tiles some arm heading reaches (the 12 sectors' union)."""
    radius = math.ceil(config.workspace_radii[1])
    cells = np.arange(-radius, radius + 1, dtype=np.float32)

    def sectors():
        window = geo.Window(
            jnp.zeros(2, jnp.int32), jnp.asarray(cells[:, None]), jnp.asarray(cells[None, :])
        )
        return geo.sector_masks(config, window, jnp.arange(H))

    return _offsets(geo.host_constant(sectors).any(axis=0), radius)


# Boolean maps are packed 32 columns to a uint32 word, so the flood fill's shifts and ORs
# touch 32 tiles per operation. The words are the second-last axis and the rows the last: a
# map [N, N] becomes [ceil(N / 32), N], so a 64x64 map's operations vectorize over its 64
# rows rather than over two words a row (a sweep of the cut-off fill took 0.75x the time of
# the [N, words] layout on XLA:CPU, 8 envs x 64x64).
WORD = 32


def pack(x: jax.Array) -> jax.Array:
    """bool [..., N, N] -> uint32 [..., ceil(N / 32), N]: tile (r, c) at bit c % 32 of word
    [c // 32, r]."""
    n = x.shape[-1]
    words = -(-n // WORD)
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, words * WORD - n)])
    bits = padded.reshape(*x.shape[:-1], words, WORD).astype(jnp.uint32)
    packed = jnp.sum(bits << jnp.arange(WORD, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)
    return jnp.swapaxes(packed, -1, -2)


def unpack(x: jax.Array, n: int) -> jax.Array:
    """uint32 [..., words, N] -> bool [..., N, N] (the inverse of `pack`)."""
    bits = (jnp.swapaxes(x, -1, -2)[..., None] >> jnp.arange(WORD, dtype=jnp.uint32)) & 1
    return bits.reshape(*x.shape[:-2], x.shape[-1], -1)[..., :n].astype(bool)


def moved(x: jax.Array, dr: int, dc: int, n: int) -> jax.Array:
    """Packed uint32 [..., words, N]: y[r, c] = x[r - dr, c - dc], False where that lies off
    the map (|dc| < 32).

    The columns shift first, the rows after: the row shift's padded copy then has one user,
    and XLA fuses it into the loop that reads it. Rows first, the padded copy fed both
    halves of the column shift's carry and XLA:CPU ran it as a loop of its own: a sweep of
    the cut-off fill ran about 31 XLA ops instead of 15, and the env step under a trained
    policy's actions took about 5% longer at 64x64 (the same bits either way)."""
    y = x
    if dc:
        shift, back = jnp.uint32(abs(dc)), jnp.uint32(WORD - abs(dc))
        if x.shape[-2] == 1:  # one word a row (N <= 32): nothing to carry between words
            y = x << shift if dc > 0 else x >> shift
        elif dc > 0:  # towards higher columns: bits move up, carrying from the word below
            below = jnp.concatenate([jnp.zeros_like(x[..., :1, :]), x[..., :-1, :]], axis=-2)
            y = (x << shift) | (below >> back)
        else:
            above = jnp.concatenate([x[..., 1:, :], jnp.zeros_like(x[..., :1, :])], axis=-2)
            y = (x >> shift) | (above << back)
        if n % WORD:  # clear the bits beyond the last column (a constant per word)
            y = y & _column_bits(n)[:, None]
    if dr:
        rows = [(0, 0)] * (y.ndim - 1) + [(max(dr, 0), max(-dr, 0))]
        y = jnp.pad(y, rows)[..., max(-dr, 0) : max(-dr, 0) + n]
    return y


def make_dilation(offsets, n: int):
    """`dilate(x) -> y`, packed uint32 [..., words, N]: y = the OR over `offsets` ((dr, dc)
    static ints, |dc| < 32) of `moved(x, dr, dc, n)`, bit for bit.

    The offsets of each row shift dr are cut into runs of consecutive column shifts on one
    side of 0, and a run of length L is two shifts of x already ORed over k = 2^floor(log2 L)
    consecutive columns (a table built by doubling, one per direction): the arm ring's 224
    offsets at 64x64 take 84 shifts (66 of columns, 18 of rows). Column shifts are composed
    in one direction only: a bit that one shift pushes off the map is then off it for the
    sum of the two as well."""
    rows: dict[int, set[int]] = {}
    for dr, dc in offsets:
        rows.setdefault(int(dr), set()).add(int(dc))
    runs = []  # (dr, direction, first shift, length): shifts first, first + direction, ...
    for dr, columns in sorted(rows.items()):
        for direction in (1, -1):
            side = sorted((dc for dc in columns if (dc >= 0) == (direction > 0)),
                          key=lambda dc: dc * direction)
            while side:
                length = 1
                while length < len(side) and side[length] == side[0] + length * direction:
                    length += 1
                runs.append((dr, direction, side[0], length))
                side = side[length:]
    longest = max((length for *_, length in runs), default=1)

    def dilate(x):
        tables = {}  # (direction, k): x ORed over k consecutive column shifts 0, direction, ...
        for direction in {direction for _, direction, _, _ in runs}:
            k, table = 1, x
            tables[direction, 1] = table
            while 2 * k <= longest:
                table = table | moved(table, 0, k * direction, n)
                k *= 2
                tables[direction, k] = table
        by_row = {}
        for dr, direction, first, length in runs:
            k = 1 << (length.bit_length() - 1)
            last = first + (length - k) * direction  # the second span ends where the run does
            spans = moved(tables[direction, k], 0, first, n)
            if last != first:
                spans = spans | moved(tables[direction, k], 0, last, n)
            by_row[dr] = spans if dr not in by_row else by_row[dr] | spans
        if not by_row:
            return jnp.zeros_like(x)
        return functools.reduce(jnp.bitwise_or,
                                [moved(spans, dr, 0, n) for dr, spans in by_row.items()])

    return dilate


def start_poses(pos: jax.Array, heading: jax.Array, n: int) -> jax.Array:
    """Packed uint32 [B, 12, words, N]: each env's one pose (heading, row, col), from pos
    int32 [B, 2] and heading int32 [B]; `pack` of the one-hot poses, bit for bit.

    Built as words: packing the one-hot [B, 12, N, N] maps took 3.4 ms of a 64x64 env
    step's 118 ms of op time per 32 steps on XLA:CPU (the fill's loop gave the packed
    result a layout whose reduce over each word's bits did not vectorize)."""
    words = -(-n // WORD)
    hit = ((jnp.arange(H)[None, :, None, None] == heading[:, None, None, None])
           & (jnp.arange(words)[None, None, :, None] == (pos[:, 1] // WORD)[:, None, None, None])
           & (jnp.arange(n)[None, None, None, :] == pos[:, 0][:, None, None, None]))
    bit = jnp.left_shift(jnp.uint32(1), (pos[:, 1] % WORD).astype(jnp.uint32))
    return jnp.where(hit, bit[:, None, None, None], jnp.uint32(0))


def _column_bits(n: int) -> np.ndarray:
    """uint32 [ceil(N / 32)]: the bits of each word that hold a column of an N-wide map."""
    words = np.full(-(-n // WORD), 0xFFFFFFFF, np.uint32)
    words[-1] = (1 << (n % WORD)) - 1
    return words


def make_moves(moves, num_maps: int, n: int):
    """`apply(x) -> y`, packed uint32 [..., C, words, N] -> [..., num_maps, words, N]:
    y[d] = the OR over the moves (source s, destination d, dr, dc) into d of x[s] moved by
    (dr, dc) (`moved`; static ints, |dc| < 32).

    One `moved` per move, each destination's arrivals ORed and the destinations stacked:
    XLA fuses each destination's arrivals into one loop over slices of x, with no gather.
    The moves grouped by offset (a gather to pick the maps, one `moved` per distinct
    offset, a gather to collect each destination's arrivals) compiled faster when the pose
    distance searched 13 wheel angles, but XLA:CPU's gathers and the buffer between them
    made the env's step take twice as long (docs/PERFORMANCE.md)."""
    moves = np.asarray(moves, np.int64).reshape(-1, 4)
    arrivals = [[(int(s), int(dr), int(dc)) for s, d, dr, dc in moves if d == destination]
                for destination in range(num_maps)]

    def apply(x):
        def arrived(moves_in):
            if not moves_in:
                return jnp.zeros_like(x[..., 0, :, :])
            return functools.reduce(jnp.bitwise_or, [moved(x[..., s, :, :], dr, dc, n)
                                                     for s, dr, dc in moves_in])

        return jnp.stack([arrived(moves_in) for moves_in in arrivals], axis=-3)

    return apply


def make_reachable_poses(config: EnvConfig, wheeled: bool | None = None):
    """`reachable(action_map, obstacles, pos, heading, is_wheeled) -> bool [12, N, N]`: the
    base poses (heading, row, col) the agent can drive to from (pos, heading) on these maps.
    Maps int8 [N, N], pos int32 [2], heading int32 [], is_wheeled bool [].

    `wheeled` None drives each call by its `is_wheeled`, computing both kinds' moves and
    selecting (under `vmap` a select runs both); True or False drives that kind's moves alone
    and ignores `is_wheeled`, for a caller that knows every agent's kind (a tracked fill does
    a third of the shifts)."""
    reachable_packed = _make_reachable_packed(config, wheeled)
    return lambda *args: unpack(_one_env(reachable_packed, args), config.map_size)


def _one_env(batched, args):
    """`batched`'s result for one env's arguments (a batch of one)."""
    return batched(*(jnp.asarray(x)[None] for x in args))[0]


@functools.cache
def make_free_poses(config: EnvConfig):
    """`free_poses(action_map, obstacles) -> uint32 [12, words, N]` (packed): the base poses
    (heading, row, col) whose footprint lies inside the map on traversable tiles.

    Each tile some footprint covers is shifted once and each heading ANDs its own tiles: a
    select of all the shifts per heading followed by a reduce took 4-5x as long on XLA:CPU
    (8 envs x 64x64, 73 tiles)."""
    footprints = footprint_offsets(config)
    tiles = sorted(set().union(*footprints))  # every offset some heading's footprint covers
    n = config.map_size

    def free_poses(action_map, obstacles):
        free = pack(excavation.traversable(obstacles, action_map, config.drivable_soil_height))
        # under[(dr, dc)][r, c]: the tile at (r + dr, c + dc) is free (pose centre at (r, c)).
        under = {(dr, dc): moved(free, -dr, -dc, n) for dr, dc in tiles}
        return jnp.stack([functools.reduce(jnp.bitwise_and, [under[tile] for tile in footprint])
                          for footprint in footprints])

    return jax.jit(free_poses)


def _make_reachable_packed(config: EnvConfig, wheeled: bool | None):
    """`reachable(action_map, obstacles, pos, heading, is_wheeled, settled=None)`,
    `make_reachable_poses`' arguments with a leading axis B, -> packed uint32
    [B, 12, words, N].

    With `settled` (`settled(reach) -> bool [B]`, True where the poses reached so far already
    answer the caller's question, and so do any more), it returns (reach, settled [B]): the
    sweeps stop once every env is settled or no fill grows, testing `settled` every
    `SWEEPS_PER_SETTLED_TEST` sweeps. An env settled there may not have converged; the
    others have."""
    free_poses = make_free_poses(config)
    steps = geo.move_displacements(config.move_step)  # [24, 2], per 15-degree angle
    n = config.map_size

    straight = make_moves(
        [(h, h, *(sign * steps[2 * h])) for h in range(H) for sign in (1, -1)], H, n)
    # Wheeled arcs, wheel angle w: heading h moves FORWARD by steps[2h + w] to heading h + w,
    # BACKWARD by -steps[2h - w] to heading h - w.
    arcs = make_moves(
        [(h, (h + w) % H, *steps[(2 * h + w) % (2 * H)]) for h in range(H) for w in (-1, 1)]
        + [(h, (h - w) % H, *-steps[(2 * h - w) % (2 * H)]) for h in range(H) for w in (-1, 1)],
        H, n)

    def turns(reach):  # tracked: one heading either way in place
        return jnp.roll(reach, 1, axis=-3) | jnp.roll(reach, -1, axis=-3)

    def grow(reach, pose_free, is_wheeled):  # packed uint32 [B, 12, words, N], bool [B]
        if wheeled is None:
            wheeled_rows = is_wheeled[:, None, None, None]
            arrived = straight(reach) | jnp.where(wheeled_rows, arcs(reach), turns(reach))
        else:
            arrived = straight(reach) | (arcs(reach) if wheeled else turns(reach))
        return reach | (arrived & pose_free)

    def reachable(action_map, obstacles, pos, heading, is_wheeled, settled=None):
        pose_free = jax.vmap(free_poses)(action_map, obstacles)
        start = start_poses(pos, heading, n)

        def sweep(reach, count):
            for _ in range(count):
                reach = grow(reach, pose_free, is_wheeled)
            return reach

        # The batch sweeps together until none of its fills grows: one test of convergence
        # for the batch, every two sweeps (a fixpoint sweeps to itself, so the fills done
        # first are unchanged). Per env, as `vmap` makes a loop, selecting each env's sweep
        # by its own test, a pass of 8 envs x 64x64 took 1.25-1.4x as long on XLA:CPU.
        if settled is None:
            def body(carry):
                reach, _ = carry
                grown = sweep(reach, 2)
                return grown, jnp.any(grown != reach)

            reach, _ = jax.lax.while_loop(lambda c: c[1], body, (start, jnp.bool_(True)))
            return reach

        def body_until_settled(carry):
            reach, _, _ = carry
            grown = sweep(reach, SWEEPS_PER_SETTLED_TEST)
            return grown, jnp.any(grown != reach), settled(grown)

        reach, _, done = jax.lax.while_loop(
            lambda c: c[1] & ~jnp.all(c[2]), body_until_settled,
            (start, jnp.bool_(True), jnp.zeros(start.shape[:1], bool)))
        return reach, done

    return reachable


SWEEPS_PER_SETTLED_TEST = 4
"""Sweeps between two tests of `settled` (`_make_reachable_packed`; the cut-off test's is a
dilation by 20 of the arm ring's 224 offsets at 64x64). At 64 envs x 64x64 under random
actions, tests every 2, 4, 6 and 8 sweeps gave env steps within noise of each other."""


@functools.cache
def make_targets_cut_off(config: EnvConfig, wheeled: bool | None = None):
    """`cut_off(target_map, action_map, obstacles, pos, heading, is_wheeled) -> bool []`:
    True when an undug target (target -1, action 0) lies in the workspace ring of no position
    the base can reach from (pos, heading) (`make_reachable_poses`; same arguments, and the
    same `wheeled`). One env's `make_batch_cut_off`."""
    batch_cut_off = make_batch_cut_off(config, wheeled)

    def cut_off(*args):
        return _one_env(batch_cut_off, args)

    return jax.jit(cut_off)


def make_batch_cut_off(config: EnvConfig, wheeled: bool | None = None):
    """`make_targets_cut_off`'s test for a batch of envs: the same arguments with a leading
    axis B, -> bool [B]. The batch's fills sweep together until none grows. One jitted
    function per (config, wheeled), however the arguments are passed."""
    return _batch_cut_off(config, wheeled)


@functools.cache
def _batch_cut_off(config: EnvConfig, wheeled: bool | None):
    reachable = _make_reachable_packed(config, wheeled)
    ring = ring_offsets(config)
    ring_cover = make_dilation(ring, config.map_size)
    # The ring's offsets along the row and the column through the centre: a cheap dilation
    # that covers part of what the ring covers.
    cross_cover = make_dilation([(dr, dc) for dr, dc in ring if dr == 0 or dc == 0],
                                config.map_size)

    def batch_cut_off(target_map, action_map, obstacles, pos, heading, is_wheeled):
        undug = pack((target_map == -1) & (action_map == 0))

        def uncovered(reach, cover):  # bool [B]: an undug target outside every ring
            positions = jax.lax.reduce(reach, jnp.uint32(0), jax.lax.bitwise_or, (1,))
            return jnp.any((undug & ~cover(positions)) != 0, axis=(-2, -1))

        # Most tests find every target covered long before the fill converges (at 64x64
        # under random actions, after 20 of 38 sweeps, and no fill cut off): the fill stops
        # there, since more poses can only cover more. The cross covers less than the ring,
        # so a fill it settles is not cut off, and a fill it does not settle has converged
        # and gets the ring's exact answer.
        reach, covered = reachable(action_map, obstacles, pos, heading, is_wheeled,
                                   settled=lambda reach: ~uncovered(reach, cross_cover))
        return jax.lax.cond(jnp.all(covered), lambda: ~covered,
                            lambda: ~covered & uncovered(reach, ring_cover))

    return jax.jit(batch_cut_off)
