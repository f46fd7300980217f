"""Which digs of a trained policy cut targets off, by the planner and by the env's rule.

An experiment behind `EnvConfig.mask_cut_off_digs` (docs/RESULTS.md, "Digs that cut targets
off"), not part of the trainer. It plays a run's checkpoint greedily on its held-out maps and,
at every DO that digs, asks two judges whether targets are out of reach before and after:

- the scripted solver's planner (`Planner.blocked`: undug targets no usable sector of a
  reachable pose holds, the pose graph simulated move by move in numpy);
- the rule's flood fill (`envs.reachability.make_targets_cut_off`, JAX).

A dig "cuts off" for the planner when its count of blocked targets rises. The rule should flag
every such dig, and flag none where the planner sees no target out of reach afterwards.

    .venv/bin/python docs/experiments/cut_off_digs.py --checkpoint runs/<run> [--maps 64]
        [--agent-types 0,1]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from envs import actions as A
from envs.reachability import make_targets_cut_off
from envs.solver import jitted_env_functions
from envs.solver_planner import Planner
from terra_rl.analysis.playback import load_trained_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="run directory")
    parser.add_argument("--maps", type=int, default=64, help="first N held-out maps")
    parser.add_argument("--agent-types", default="0", help="comma list: 0 tracked, 1 wheeled")
    args = parser.parse_args()

    trained = load_trained_policy(args.checkpoint)
    env, params = trained.env, trained.env_params
    reset, step = jitted_env_functions(env)
    cut_off = jax.jit(make_targets_cut_off(env.config))

    def rule(state) -> bool:
        agent = state.agent
        return bool(cut_off(state.target_map, state.action_map, state.obstacles, agent.pos,
                            agent.base_heading, agent.agent_type == A.WHEELED))

    digs = []  # (planner before, planner after, rule before, rule after)
    key = jax.random.PRNGKey(0)
    for agent_type in (int(t) for t in args.agent_types.split(",")):
        for map_index in range(min(args.maps, trained.num_maps)):
            key, reset_key = jax.random.split(key)
            obs, state = reset(reset_key, params, jnp.int32(agent_type), jnp.int32(map_index))
            host = jax.device_get(state)
            planner = Planner(env.config, agent_type, host.target_map, host.obstacles)
            for _ in range(env.config.max_steps):
                key, act_key, step_key = jax.random.split(key, 3)
                action = int(trained.act(act_key, obs, False))
                before = jax.device_get(state)
                obs, state, _, terminated, _, _ = step(step_key, state, jnp.int32(action),
                                                       params)
                after = jax.device_get(state)
                if action == A.DO and int(after.dig_tiles_done) > int(before.dig_tiles_done):
                    counts = [planner.blocked(*_planner_view(planner, s))[0]
                              for s in (before, after)]
                    digs.append((*counts, rule(before), rule(after)))
                if bool(terminated):
                    break
    cutting = [d for d in digs if d[1] > d[0]]
    print(f"{len(digs)} digs; the planner: {len(cutting)} cut targets off")
    print(f"the rule flags {sum(d[3] for d in cutting)} of them "
          f"({sum(d[3] and not d[2] for d in cutting)} on a map it saw whole before)")
    print(f"the rule flags {sum(d[3] and d[1] == 0 for d in digs)} digs after which the planner "
          f"sees no target out of reach, and {sum(d[3] for d in digs)} digs in all")


def _planner_view(planner: Planner, state):
    view = planner.state_of(state)
    return view.action_map, view.dumpability, view.node


if __name__ == "__main__":
    main()
