"""`BatchEnv`: `num_envs` excavation environments with auto-reset.

Fast path (`step`): every env runs `step_without_observation`; only when some env finished
does the reset branch run, under a `lax.cond` whose predicate is one unbatched
`jnp.any(done)`. (A `cond` on a batched predicate under `vmap` lowers to a `select` that
runs both branches every step.) Inside it, the finished envs are gathered, reset and
scattered back `max_partial_resets` at a time in a `lax.while_loop`: one pass in the usual
case (with staggered ages about num_envs / max_steps envs finish per step), and a single
compiled copy of the reset whatever the count. The observation, with its action mask, is
taken once, of the states after the resets; the pre-reset states
(`info["final_observation"]`) are observed only where an episode ended, as many at a time.
With a cut-off rule (`EnvConfig.mask_cut_off_digs` / `mask_cut_off_dumps`), the mask's flood
fill over the whole map runs only for the envs whose observation it changes (DO is possible
and one the rule checks; about one env in six under random actions at 64x64): each env's
observation is taken both ways the test can answer, and those envs are gathered, tested and
scattered back `max_cut_off_checks` at a time (`observe`, `default_cut_off_checks`). A batch
of one kind of excavator fills by that kind's moves alone (`cut_off_test`). The result is
the per-env observation's, bit for bit.
`step_reference` resets every env unconditionally and selects. Each env's reset key is the
same on every path, so all paths give identical results, which the parity tests check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs import actions as A
from envs import reachability
from envs.env import ExcavationEnv
from envs.state import EnvParams, EnvState

MASK_DEPENDENT_KEYS = ("action_mask", "refused_digs")
"""The observation's keys the cut-off test's answer can change."""


class BatchEnv:
    """`num_envs` environments; the first `round((1 - wheeled_fraction) * num_envs)` are
    tracked, the rest wheeled. Each env keeps its agent type across episodes.

    `params` defaults to the pool given at construction. Inside `jit`, pass `params`
    explicitly as a traced argument, or the whole map pool is baked into the program.
    """

    def __init__(
        self,
        env: ExcavationEnv,
        params: EnvParams,
        num_envs: int,
        max_partial_resets: int | None = None,
        max_cut_off_checks: int | None = None,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env = env
        self.params = params
        self.num_envs = num_envs
        if max_partial_resets is None:
            max_partial_resets = max(1, -(-num_envs // 32))
        self.max_partial_resets = min(max_partial_resets, num_envs)
        if max_cut_off_checks is None:
            max_cut_off_checks = default_cut_off_checks(num_envs, jax.default_backend())
        if max_cut_off_checks < 1:
            raise ValueError(f"max_cut_off_checks must be >= 1, got {max_cut_off_checks}")
        self.max_cut_off_checks = min(max_cut_off_checks, num_envs)
        num_wheeled = int(round(env.config.wheeled_fraction * num_envs))
        types = np.full((num_envs,), A.TRACKED, np.int32)
        types[num_envs - num_wheeled :] = A.WHEELED
        self.agent_types = types
        self._cut_off_test = cut_off_test(env, types)

    def reset(
        self,
        key: jax.Array,
        params: EnvParams | None = None,
        first_maps: jax.Array | None = None,
    ) -> tuple[dict, EnvState]:
        """Fresh episodes with staggered ages: each env's age starts uniform in
        `[0, max_steps)`, so timeouts do not all land on the same rollout step.

        `first_maps` (int32 [num_envs]) picks each env's first map instead of sampling.
        obs: dict of [num_envs, ...]; state: EnvState with a leading [num_envs] axis.
        `key` is consumed (split into the episodes' keys and the ages' key): a caller derives
        no other key from it.
        """
        params = self.params if params is None else params
        key_reset, key_age = jax.random.split(key)
        keys = jax.random.split(key_reset, self.num_envs)
        agent_types = jnp.asarray(self.agent_types)
        if first_maps is None:
            obs, state = jax.vmap(self.env.reset, in_axes=(0, None, 0))(keys, params, agent_types)
        else:
            obs, state = jax.vmap(self.env.reset, in_axes=(0, None, 0, 0))(
                keys, params, agent_types, first_maps
            )
        ages = jax.random.randint(key_age, (self.num_envs,), 0, self.env.config.max_steps)
        return obs, state.replace(age=ages.astype(jnp.int32))

    def step(
        self,
        key: jax.Array,
        state: EnvState,
        actions: jax.Array,
        params: EnvParams | None = None,
    ):
        """actions int32 [num_envs] -> (obs, state, reward, terminated, truncated, info).

        reward float32 [num_envs]; terminated/truncated bool [num_envs]; obs is the first
        observation of the new episode where an env finished, and
        `info["final_observation"]` is the pre-reset observation of every env, with an
        all-True action mask where the episode finished (no action follows it) and, with
        `remember_refused_digs`, the refusals of that state's own mask, as a training
        observation of it would carry (`ExcavationEnv.final_refusals`);
        `info["action_mask"]` is that observation's mask.
        """
        return self._step(key, state, actions, params, reset_always=False)

    def step_reference(self, key, state, actions, params=None):
        """Same contract as `step`, resetting every env unconditionally (parity reference)."""
        return self._step(key, state, actions, params, reset_always=True)

    def _step(self, key, state, actions, params, reset_always: bool):
        params = self.params if params is None else params
        key_step, key_reset = jax.random.split(key)
        step_keys = jax.random.split(key_step, self.num_envs)
        # The mask is computed once, on the states after the resets: a finished episode's
        # last observation has no action to mask, and a second copy of the mask's searches
        # (one in the step, one in the reset) would double their share of the compile. The
        # pre-reset states are observed only where an episode ended (below).
        next_state, reward, terminated, truncated, info = jax.vmap(
            self.env.step_without_observation, in_axes=(0, 0, 0, None)
        )(step_keys, state, actions, params)
        done = terminated | truncated

        # Split inside the reset branches, so steps where nothing finished skip it. Only
        # the states are kept: the observation is taken once, after the resets.
        reset_keys = lambda: jax.random.split(key_reset, self.num_envs)  # noqa: E731
        reset_states = jax.vmap(self.env.reset_state, in_axes=(0, None, 0, 0))

        remembers = self.env.config.remember_refused_digs

        def final_refusals(finished):
            # `ExcavationEnv.final_refusals` of each, through the batch's own test, bit for
            # bit: the vmapped test of one env drives both kinds' moves, for every env of
            # the chunk (a trace of a 64x64 update under a trained policy charged it 16.9 of
            # 520 ms of op time; timed alternating on one core, the update took 0.474
            # against 0.476 s, within noise).
            return self.observe(finished)["refused_digs"]

        def reset_all(carry):
            next_state, refused = carry
            reset_state = reset_states(
                reset_keys(), params, next_state.agent.agent_type, next_state.curriculum
            )
            if remembers:
                refused = jnp.where(done[:, None, None], final_refusals(next_state), refused)
            return select_where(done, reset_state, next_state), refused

        def reset_chunks(carry):
            # The done envs, `max_partial_resets` at a time (gathered, reset, scattered back):
            # one copy of the reset in the program, however many finished.
            keys = reset_keys()

            def reset_one_chunk(gather, part, carry):
                next_state, refused = carry
                reset_state = reset_states(
                    keys[gather],
                    params,
                    next_state.agent.agent_type[gather],
                    jax.tree.map(lambda x: x[gather], next_state.curriculum),
                )
                if remembers:  # of the finished states, not yet reset
                    finished = jax.tree.map(lambda x: x[gather], next_state)
                    refused = scatter_rows(refused, part, final_refusals(finished))
                return scatter_rows(next_state, part, reset_state), refused

            return over_chunks(done, self.max_partial_resets, reset_one_chunk, carry)

        carry = (next_state, next_state.refused_digs)
        if reset_always:
            new_state, refused = reset_all(carry)
        else:
            new_state, refused = jax.lax.cond(jnp.any(done), reset_chunks, lambda x: x, carry)
        new_obs = self.observe(new_state)
        new_state = jax.vmap(self.env.remember_refusals)(new_state, new_obs)

        def observe_finished(gather, part, final_obs):
            # A finished episode's last observation: its mask all True (no action follows),
            # and the refusals a training observation of that state would carry.
            finished = jax.tree.map(lambda x: x[gather], next_state)
            last = jax.vmap(self.env.observation_without_mask)(finished)
            if remembers:
                last = dict(last, refused_digs=refused[gather])
            return scatter_rows(final_obs, part, last)

        # Where the episode goes on, the pre-reset observation is the new one, mask included;
        # the finished envs' are taken `max_partial_resets` at a time (none in most steps:
        # observing every env's pre-reset state took a twentieth of a 64x64 update on a CPU).
        final_obs = over_chunks(done, self.max_partial_resets, observe_finished, new_obs)
        info = dict(info, final_observation=final_obs, action_mask=final_obs["action_mask"])
        return new_obs, new_state, reward, terminated, truncated, info

    def observe(self, state: EnvState) -> dict:
        """The observation of every env (obs dict of [num_envs, ...]), equal to
        `jax.vmap(env.observation)(state)` for states of this batch (each env's excavator of
        its kind in `agent_types`; any leading size, such as a chunk of its envs). With a
        cut-off rule, the flood fill runs only where its answer changes the observation,
        `max_cut_off_checks` envs at a time in a `lax.while_loop` (one compiled copy of the
        test, one pass in the usual case)."""
        if not self.env.checks_cut_off:
            return jax.vmap(self.env.observation)(state)
        if_kept, if_cut, _ = jax.vmap(self.env.observation_either_way)(state)
        # The test's answer reaches the observation through the mask alone (the refused
        # digs follow the mask's DO), and only its keys differ between the two ways.
        differing = [key for key in MASK_DEPENDENT_KEYS if key in if_kept]
        needed = jnp.any(if_kept["action_mask"] != if_cut["action_mask"], axis=1)

        # The test's arguments are built for the chunk's envs alone: pasting each env's DO
        # into its map (a scatter under `vmap`) for all 64 envs at 64x64 took a third of the
        # test's time on XLA:CPU.
        def check_one_chunk(gather, part, cut):
            chunk = jax.tree.map(lambda x: x[gather], state)
            answers = self._cut_off_test(*jax.vmap(self.env.cut_off_arguments)(chunk))
            return scatter_rows(cut, part, answers)

        cut = over_chunks(needed, min(self.max_cut_off_checks, needed.shape[0]),
                          check_one_chunk, jnp.zeros(needed.shape, bool))
        chosen = select_where(cut, {k: if_cut[k] for k in differing},
                              {k: if_kept[k] for k in differing})
        return dict(if_kept, **chosen)


def over_chunks(selected: jax.Array, chunk: int, body, carry):
    """`carry` after `body(gather, part, carry) -> carry` ran over the envs where `selected`
    (bool [num_envs]) holds, `chunk` at a time, in a `lax.while_loop` (one compiled copy of
    `body`, as many passes as the count needs). `part` int32 [chunk]: the envs' indices,
    padded with num_envs (out of range: a scatter with mode="drop" skips it); `gather`: the
    same clipped to a valid row to read."""
    num_envs = selected.shape[0]
    (index,) = jnp.nonzero(selected, size=num_envs + chunk, fill_value=num_envs)

    def one_chunk(state):
        start, carry = state
        part = jax.lax.dynamic_slice(index, (start,), (chunk,))
        return start + chunk, body(jnp.minimum(part, num_envs - 1), part, carry)

    count = jnp.sum(selected)
    return jax.lax.while_loop(lambda state: state[0] < count, one_chunk,
                              (jnp.int32(0), carry))[1]


def scatter_rows(full, part: jax.Array, new):
    """The pytree `full` ([num_envs, ...] leaves) with rows `part` (int32 [chunk], an
    `over_chunks` body's) set to `new` ([chunk, ...] leaves); padded indices are dropped."""
    return jax.tree.map(lambda whole, rows: whole.at[part].set(rows, mode="drop"), full, new)


def default_cut_off_checks(num_envs: int, backend: str) -> int:
    """`BatchEnv`'s default `max_cut_off_checks`. On a CPU a sixteenth of the batch: the work
    is the sweeps times the envs in a pass, and a pass sweeps as long as its slowest env,
    so small passes waste least (at 64 envs x 64x64, chunks of 3 and 4 envs took 0.052 s per
    32 steps, 2 and 6 envs 0.054, 8 envs 0.055-0.056, 16 envs 0.074). Elsewhere half the batch,
    so that one pass covers the usual count (about a sixth of the envs under random
    actions): an accelerator's sweep takes about as long for few envs as for many, and a
    second pass would double it."""
    return max(1, -(-num_envs // (16 if backend == "cpu" else 2)))


def cut_off_test(env: ExcavationEnv, agent_types: np.ndarray):
    """The cut-off test `BatchEnv.observe` runs on a chunk of envs
    (`envs.reachability.make_batch_cut_off`), None where `env` has none. A test that drives
    one kind's moves alone does a third of the shifts of one that drives both and selects,
    so a batch of one kind gets that kind's test. A mixed batch keeps the test for both: one
    loop per kind took 15% longer at 64 envs x 64x64 on a CPU, a pass each where one does."""
    if not env.checks_cut_off:
        return None
    kinds = {bool(t == A.WHEELED) for t in agent_types}
    wheeled = kinds.pop() if len(kinds) == 1 else None
    return reachability.make_batch_cut_off(env.config, wheeled=wheeled)


def select_where(mask: jax.Array, on_true, on_false):
    """Per-env select over matching pytrees; mask bool [num_envs] broadcasts over each leaf."""

    def select(a, b):
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(select, on_true, on_false)
