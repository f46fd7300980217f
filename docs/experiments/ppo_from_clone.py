"""Experiment (not part of the trainer): PPO that starts from a policy cloned from the planner
(`imitate_planner.py fit`) and, with `--kl-coef` > 0, keeps a penalty on its divergence from
that policy (docs/RESULTS.md, "Imitating the planner").

    python docs/experiments/ppo_from_clone.py --teacher p2.pkl --kl-coef 0.1 -- \
        --config cpu_demo --seed 0

Everything after `--` goes to `train_mixed.py`. The runner's initial parameters are the
teacher's (the optimizer state starts fresh), and each minibatch gradient gets
`kl_coef x grad KL(teacher || policy)` added, the KL of the masked action distributions
averaged over the minibatch's observations; the teacher is fixed. `--kl-coef 0` is PPO from
the cloned parameters alone. Run from the repository root with `.venv/bin/python`.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from terra_rl.algo import update
from terra_rl.cli.main import main  # noqa: E402
from terra_rl.run import distributed, trainer  # noqa: E402


def teacher_kl(policy, use_action_mask: bool, teacher, params, obs) -> jax.Array:
    """float32 []: mean over the batch of KL(teacher || policy) of the masked actions."""
    teacher_logits, _ = update.policy_outputs(policy, teacher, obs, use_action_mask)
    logits, _ = update.policy_outputs(policy, params, obs, use_action_mask)
    teacher_log_probs = jax.lax.stop_gradient(jax.nn.log_softmax(teacher_logits))
    teacher_probs = jnp.exp(teacher_log_probs)
    terms = teacher_probs * (teacher_log_probs - jax.nn.log_softmax(logits))
    return jnp.sum(jnp.where(teacher_probs > 0, terms, 0.0), axis=-1).mean()


def install(teacher, kl_coef: float) -> None:
    """Patch the trainer: start from `teacher`, add the KL gradient to every minibatch's."""
    make_loss_and_grads = update.make_loss_and_grads

    def with_teacher(config, policy):
        loss_and_grads = make_loss_and_grads(config, policy)

        def patched(params, batch, ent_coef, loss_scale):
            metrics, grads = loss_and_grads(params, batch, ent_coef, loss_scale)
            if kl_coef > 0:
                kl_grads = jax.grad(
                    lambda p: teacher_kl(policy, config.use_action_mask, teacher, p,
                                         batch["obs"])
                )(params)
                grads = jax.tree.map(lambda g, k: g + kl_coef * k, grads, kl_grads)
            return metrics, grads

        return patched

    update.make_loss_and_grads = with_teacher
    init_runner = trainer.Trainer.init_runner

    def init_from_teacher(self):
        runner = init_runner(self)
        params = distributed.to_global(
            self.replicate(jax.tree.map(np.asarray, teacher)), self.sharding
        )
        return runner.replace(policy=runner.policy.replace(params=params))

    trainer.Trainer.init_runner = init_from_teacher


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True, help="parameters from imitate_planner fit")
    parser.add_argument("--kl-coef", type=float, default=0.1)
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    install(pickle.loads(Path(args.teacher).read_bytes()), args.kl_coef)
    return main(train_args)


if __name__ == "__main__":
    sys.exit(cli())
