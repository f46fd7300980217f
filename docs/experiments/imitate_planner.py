"""Experiment (not part of the trainer): imitate the scripted solver's planner on 16x16 trench
maps of the `cpu_demo` preset, with behaviour cloning and DAgger-style relabelling, and judge
the cloned policy on the preset's held-out maps (docs/RESULTS.md, "Imitating the planner").

    python docs/experiments/imitate_planner.py demos  --maps 600 --seed 5151 --out d0.npz
    python docs/experiments/imitate_planner.py fit    --data d0.npz --out p0.pkl
    python docs/experiments/imitate_planner.py dagger --params p0.pkl --maps 300 --seed 6161 \
        --out d1.npz
    python docs/experiments/imitate_planner.py fit    --data d0.npz,d1.npz --out p1.pkl

`demos`: the planner's full solutions from the env's reset. `dagger`: the cloned policy plays
each map greedily for a random 10-199 steps, then the planner finishes the map from there and
its steps are the labels (states the planner cannot finish from are skipped). `fit`:
cross-entropy on the masked logits plus 0.5 x the squared error of the value against the
discounted return (gamma 0.99), Adam 1e-3 cosine-annealed, 512 per batch, 15 epochs (the
first 5% of the episodes kept out to measure accuracy on demonstrations not trained on), then
greedy and sampled completion on the 64 held-out maps with the planner's judgement of each
failure (`terra_rl.analysis.failure_diagnosis`). Maps come from seeds of their own and any
map of the held-out pool is skipped. Run from the repository root with `.venv/bin/python`.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.env import ExcavationEnv  # noqa: E402
from envs.maps import generate_maps  # noqa: E402
from envs.params import params_from_maps  # noqa: E402
from envs.solver import jitted_env_functions  # noqa: E402
from envs.solver_planner import Planner  # noqa: E402
from terra_rl.adapters.train_env import excavation_env_config, make_train_envs  # noqa: E402
from terra_rl.algo.update import policy_outputs  # noqa: E402
from terra_rl.analysis.failure_diagnosis import diagnose_episode, summarize  # noqa: E402
from terra_rl.analysis.playback import TrainedPolicy  # noqa: E402
from terra_rl.config import get_preset, resolve  # noqa: E402
from terra_rl.nets.models import make_policy  # noqa: E402
from terra_rl.run.trainer import policy_config  # noqa: E402

GAMMA = 0.99
TRACKED = 0


def setup():
    config = resolve(get_preset("cpu_demo"), 1)
    env = ExcavationEnv(excavation_env_config(config, training=False))
    _, eval_env = make_train_envs(config)
    obs, _ = jax.jit(env.reset)(jax.random.PRNGKey(0), eval_env.params)
    policy = make_policy(policy_config(config), eval_env.num_actions,
                         jax.tree.map(lambda x: x[None], obs))
    return config, env, eval_env, policy


def fresh_maps(env, eval_env, count: int, seed: int):
    """(params of `count` 16x16 trench maps from `seed`, indices not in the held-out pool)."""
    held_out = {t.tobytes() + o.tobytes() for t, o in zip(
        np.asarray(eval_env.params.target_map), np.asarray(eval_env.params.obstacles),
        strict=True)}
    maps = generate_maps(("trenches",), 16, count, seed, env.config.spawn_clearance)
    keep = [i for i in range(count)
            if maps.target_map[i].tobytes() + maps.obstacles[i].tobytes() not in held_out]
    return params_from_maps(maps), keep


def plan_from(env, state, max_steps: int = 1000) -> list[int] | None:
    """The planner's actions from `state` to the end of the task, or None if it gives up."""
    host = jax.device_get(state)
    planner = Planner(env.config, TRACKED, host.target_map, host.obstacles)
    plan = planner.plan(planner.state_of(host), max_steps, 0)
    return None if plan.reason else [a for actions in plan.actions for a in actions]


def label(env, params, obs, state, key, actions):
    """Steps `actions` from (obs, state): (observations, discounted returns) or None when the
    task is not done at the end."""
    _, step = jitted_env_functions(env)
    observations, rewards, done = [], [], False
    for action in actions:
        observations.append(jax.device_get(obs))
        obs, state, reward, terminated, _, _ = step(key, state, jnp.int32(action), params)
        rewards.append(float(reward))
        done = done or bool(terminated)
    if not done:
        return None
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + GAMMA * running
        returns.append(running)
    return observations, returns[::-1]


def save(path, rows):
    observations = [o for r in rows for o in r[0]]
    np.savez_compressed(
        path,
        actions=np.array([a for r in rows for a in r[1]], np.int32),
        returns=np.array([g for r in rows for g in r[2]], np.float32),
        episodes=np.array([r[3] for r in rows for _ in r[1]]),
        **{"obs_" + k: np.stack([o[k] for o in observations]) for k in observations[0]},
    )
    print(f"wrote {path}: {len(rows)} episodes, {sum(len(r[1]) for r in rows)} steps")


def demos(args):
    _, env, eval_env, _ = setup()
    params, keep = fresh_maps(env, eval_env, args.maps, args.seed)
    reset, _ = jitted_env_functions(env)
    rows, start = [], time.time()
    for n, i in enumerate(keep):
        key = jax.random.PRNGKey(args.seed * 100003 + i)
        obs, state = reset(key, params, jnp.int32(TRACKED), jnp.int32(i))
        actions = plan_from(env, state)
        labelled = None if actions is None else label(env, params, obs, state, key, actions)
        if labelled:
            rows.append((labelled[0], actions, labelled[1], args.seed * 100003 + i))
        if n % 50 == 0:
            print(f"{n + 1}/{len(keep)} maps, {time.time() - start:.0f} s", flush=True)
    save(args.out, rows)


def dagger(args):
    _, env, eval_env, policy = setup()
    variables = pickle.loads(Path(args.params).read_bytes())
    params, keep = fresh_maps(env, eval_env, args.maps, args.seed)
    reset, step = jitted_env_functions(env)

    @jax.jit
    def act(obs):
        logits, _ = policy_outputs(policy, variables, jax.tree.map(lambda x: x[None], obs), True)
        return jnp.argmax(logits[0]).astype(jnp.int32)

    rng = np.random.default_rng(args.seed)
    rows, outcomes = [], {"policy done": 0, "planner finished": 0, "planner gave up": 0}
    for i in keep:
        key = jax.random.PRNGKey(args.seed * 100003 + i)
        obs, state = reset(key, params, jnp.int32(TRACKED), jnp.int32(i))
        done = False
        for _ in range(int(rng.integers(10, 200))):
            obs, state, _, terminated, _, _ = step(key, state, act(obs), params)
            if bool(terminated):
                done = True
                break
        if done:
            outcomes["policy done"] += 1
            continue
        actions = plan_from(env, state)
        labelled = None if actions is None else label(env, params, obs, state, key, actions)
        if labelled is None:
            outcomes["planner gave up"] += 1
            continue
        outcomes["planner finished"] += 1
        rows.append((labelled[0], actions, labelled[1], args.seed * 100003 + i))
    print(outcomes)
    save(args.out, rows)


def fit(args):
    config, _, eval_env, policy = setup()
    files = [np.load(path) for path in args.data.split(",")]
    data = {k: np.concatenate([f[k] for f in files]) for k in files[0].files}
    obs = {k[4:]: v for k, v in data.items() if k.startswith("obs_")}
    actions, returns = data["actions"], data["returns"]
    allowed = obs["action_mask"][np.arange(len(actions)), actions]
    print(f"{len(actions)} steps, {int((~allowed).sum())} labels the mask forbids (dropped)")
    obs = {k: v[allowed] for k, v in obs.items()}
    actions, returns, episodes = actions[allowed], returns[allowed], data["episodes"][allowed]
    # The first 5% of the episodes (by id) are kept out of training: held-out accuracy.
    ids = np.unique(episodes)
    held = np.isin(episodes, ids[: max(1, len(ids) // 20)])
    train, held = np.flatnonzero(~held), np.flatnonzero(held)
    batch, epochs = 512, args.epochs
    variables = policy.init(jax.random.PRNGKey(args.seed), jax.tree.map(lambda x: x[:1], obs))
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(
        optax.cosine_decay_schedule(1e-3, epochs * (len(train) // batch)), eps=1e-5))
    opt_state = optimizer.init(variables)

    def loss(variables, obs, actions, returns):
        logits, value = policy_outputs(policy, variables, obs, True)
        log_probs = jax.nn.log_softmax(logits)
        cross_entropy = -jnp.take_along_axis(log_probs, actions[:, None], 1).mean()
        accuracy = (jnp.argmax(logits, -1) == actions).mean()
        return cross_entropy + 0.5 * ((value - returns) ** 2).mean(), accuracy

    @jax.jit
    def train_step(variables, opt_state, obs, actions, returns):
        (_, accuracy), grads = jax.value_and_grad(loss, has_aux=True)(
            variables, obs, actions, returns)
        updates, opt_state = optimizer.update(grads, opt_state, variables)
        return optax.apply_updates(variables, updates), opt_state, accuracy

    rng = np.random.default_rng(args.seed)
    for epoch in range(epochs):
        order = rng.permutation(train)
        accuracy = []
        for b in range(len(order) // batch):
            idx = order[b * batch:(b + 1) * batch]
            variables, opt_state, acc = train_step(
                variables, opt_state, {k: v[idx] for k, v in obs.items()}, actions[idx],
                returns[idx])
            accuracy.append(acc)
        _, held_accuracy = jax.jit(loss)(variables, {k: v[held] for k, v in obs.items()},
                                         actions[held], returns[held])
        print(f"epoch {epoch}: accuracy {float(np.mean(accuracy)):.3f}, on held-out demos "
              f"{float(held_accuracy):.3f}", flush=True)
    Path(args.out).write_bytes(pickle.dumps(jax.device_get(variables)))

    @jax.jit
    def act(key, obs, sample):
        logits, _ = policy_outputs(policy, variables, jax.tree.map(lambda x: x[None], obs), True)
        return jnp.where(sample, jax.random.categorical(key, logits[0]),
                         jnp.argmax(logits[0])).astype(jnp.int32)

    trained = TrainedPolicy(config, 0, eval_env.batch_env.env, eval_env.params, act)
    for sample in (False, True):
        diagnoses = [diagnose_episode(trained, i, TRACKED, sample, jax.random.PRNGKey(i))
                     for i in range(trained.num_maps)]
        print("sampled" if sample else "greedy", summarize(diagnoses), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("demos", "dagger"):
        command = commands.add_parser(name)
        command.add_argument("--maps", type=int, required=True)
        command.add_argument("--seed", type=int, required=True)
        command.add_argument("--out", required=True)
    commands.choices["dagger"].add_argument("--params", required=True)
    command = commands.add_parser("fit")
    command.add_argument("--data", required=True, help="comma list of .npz files")
    command.add_argument("--out", required=True)
    command.add_argument("--epochs", type=int, default=15)
    command.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    {"demos": demos, "dagger": dagger, "fit": fit}[args.command](args)


if __name__ == "__main__":
    main()
