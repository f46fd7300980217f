"""Train a PPO excavation policy: `python train_mixed.py --config solo_excavator [--flag ...]`.

`--help` lists every flag with the preset's value. The logic lives in `terra_rl.cli.main`.
The process first restarts itself with huge pages for malloc where that helps
(`terra_rl.run.huge_pages`), before JAX is imported.
"""

from terra_rl.run.huge_pages import reexec_with_huge_pages

if __name__ == "__main__":
    reexec_with_huge_pages()
    from terra_rl.cli.main import cli

    cli()
