"""The env benchmark's report as text: the compile line and one table per measurement
(`scripts/benchmark_env.py`; `terra_rl.perf.env_benchmark` measures)."""

from __future__ import annotations

from typing import Any


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns, first column left-aligned."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells):
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join(
        [line(headers), line(["-" * width for width in widths]), *(line(row) for row in rows)]
    )


def throughput_cells(result: dict[str, Any]) -> list[str]:
    return [
        f"{result['env_steps_per_s_median']:,.0f}",
        f"{result['env_steps_per_s_best']:,.0f}",
        f"{result['env_done_fraction']:.4f}",
        f"{result['any_done_fraction']:.3f}",
    ]


THROUGHPUT_HEADERS = ["steps/s median", "steps/s best", "done/env-step", "steps w/ done"]


def render_report(results: dict[str, Any]) -> str:
    settings = results["settings"]
    compile_result = results["compile"]
    runtime = results["runtime"]
    sections = [
        f"BatchEnv benchmark on {runtime['backend']} ({runtime['device_kind']}, "
        f"{runtime['cpu_count']} CPUs), jax {runtime['jax_version']}; "
        f"{settings['steps']} steps per call, {settings['repeats']} timed calls, "
        f"random actions",
        f"Compile, one jitted BatchEnv.step at {compile_result['num_envs']} envs x "
        f"{compile_result['map_size']}x{compile_result['map_size']}: "
        f"lower {compile_result['lower_seconds']:.2f} s, "
        f"compile {compile_result['compile_seconds']:.2f} s, "
        f"first call {compile_result['first_call_seconds']:.2f} s, "
        f"steady call {compile_result['steady_call_seconds_median'] * 1e3:.2f} ms",
    ]

    rows = [
        [str(r["num_envs"]), str(r["map_size"]), *throughput_cells(r), f"{r['warmup_seconds']:.1f}"]
        for r in results["throughput"]
    ]
    sections.append(
        f"Throughput, fast path (max_steps {settings['max_steps']}):\n"
        + format_table(["envs", "map", *THROUGHPUT_HEADERS, "warm-up s"], rows)
    )

    reset_paths = results["reset_paths"]
    rows = [
        [case["done_regime"], case["path"], *throughput_cells(case)]
        for case in reset_paths["cases"]
    ]
    speedups = ", ".join(
        f"{regime} {value:.2f}x"
        for regime, value in reset_paths["speedup_step_vs_reference"].items()
    )
    sections.append(
        f"Reset paths at {reset_paths['num_envs']} envs x {reset_paths['map_size']}x"
        f"{reset_paths['map_size']} ('steps w/ done' = batch steps where the fast path's "
        f"reset branch ran):\n"
        + format_table(["done regime", "path", *THROUGHPUT_HEADERS], rows)
        + f"\nstep speed-up over step_reference: {speedups}"
    )

    mask = results["action_mask"]
    rows = [[label, *throughput_cells(mask[label])] for label in ("with_mask", "without_mask")]
    sections.append(
        f"Action mask at {mask['num_envs']} envs x {mask['map_size']}x{mask['map_size']}:\n"
        + format_table(["compute_action_mask", *THROUGHPUT_HEADERS], rows)
        + f"\naction mask share of step time: {mask['share_percent']:.1f}%"
    )
    return "\n\n".join(sections)
