"""Shared fixtures. Compiled functions are session-scoped: on a 2-core CPU, XLA compiles
dominate test time, so every test reuses one of two shape families (16x16 and 32x32)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.xla_flags import environ_with_compile_flags

# Four CPU devices for the multi-device trainer tests; set before jax initialises.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
# The compile flags of tests/xla_flags.py: the suite is compile-bound.
environ_with_compile_flags()

import jax  # noqa: E402
import pytest  # noqa: E402

# A persistent compilation cache outside the repo, one directory per pytest-xdist worker
# (jax writes an entry without a lock or an atomic rename), exported as TERRA_RL_TEST_CACHE
# for the processes the tests start (train_mixed.py, the scripts, the distributed workers).
# The test processes use it too: the trainers that test files build again compile the same
# programs, which then load from it (clean-clone runs with an empty cache: 11 min 51 s and
# 12 min 0 s against 13 min 13 s without it, on 413437b and fb4532d). It crashed workers on
# 2026-11-25, while serializing or deserializing a program, after other test files had run
# in them: the memory maps that the teardown below now keeps under the kernel's limit.
# Programs that compile in 0.1 s or more are kept (docs/PERFORMANCE.md, "The test command").
_CACHE_DIR = os.environ.get(
    "TERRA_RL_TEST_CACHE", str(Path.home() / ".cache" / "terra_rl" / "jax-test-cache")
)
if os.environ.get("PYTEST_XDIST_WORKER") and not _CACHE_DIR.endswith(
        os.environ["PYTEST_XDIST_WORKER"]):
    _CACHE_DIR = os.path.join(_CACHE_DIR, os.environ["PYTEST_XDIST_WORKER"])
os.environ["TERRA_RL_TEST_CACHE"] = _CACHE_DIR
_MIN_COMPILE_SECONDS = 0.1
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_SECONDS)
jax.config.update("jax_enable_compilation_cache", True)

from envs import EnvConfig, ExcavationEnv  # noqa: E402
from terra_rl.validation import small  # noqa: E402
from tests.memory_maps import release_if_crowded  # noqa: E402


# The 16x16 family is the validation gates' (terra_rl/validation/small.py): the same objects,
# so gates and tests share compiled functions and the random rollout.
@pytest.fixture(scope="session")
def env16():
    """Mixed tracked/wheeled env on 16x16 maps, short episodes."""
    return small.small_env()


@pytest.fixture(scope="session")
def params16(env16):
    """32 generated foundations and trenches maps."""
    return small.small_params()


@pytest.fixture(scope="session")
def batch16(env16, params16):
    return small.small_batch()


@pytest.fixture(scope="session")
def env32():
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60))


@pytest.fixture(scope="session")
def step32(env32):
    """Jitted single-env step on 32x32 maps (the hand-built-state family)."""
    return jax.jit(env32.step_no_reset)


# The slow tests: `make test-fast` (`-m "not slow"`) leaves them out, `make test` runs them
# first. A file maps to the test functions that are slow (each with all its parametrizations;
# those sharing a costly module fixture go together, or the next test would pay for it), or to
# EVERY_TEST. Files of ours say `pytestmark = pytest.mark.slow` themselves and are listed only
# for the order. Listed slowest first (their share of `make test`'s time on the 2-core CPU):
# the full run starts each file's tests in this order, after that the files not listed in
# collection order, so the two workers end together on short files rather than one of them
# on a long file that started last (pytest-xdist would order files by their number of tests).
# tests/test_suite.py checks that every name here is still a test.
EVERY_TEST = ("*",)
SLOW_TESTS: dict[str, tuple[str, ...]] = {
    "test_trainer.py": EVERY_TEST,  # pytestmark
    "test_validation.py": ("test_gate", "test_env_action_mask_on_a_dataset"),
    "test_trainer_cli.py": EVERY_TEST,  # pytestmark
    "test_gpu_presets.py": EVERY_TEST,
    "test_precision.py": ("test_short_run_in_half_precision",
                          "test_float16_overflow_skips_on_every_device_and_is_checkpointed",
                          "test_log_probs_entropy_ratio_match_float32"),
    "test_distributed.py": ("test_two_processes_train_resume_and_agree",
                            "test_setup_errors_stop_every_process"),
    "test_evaluate_script.py": EVERY_TEST,
    "test_run_keys.py": ("test_no_two_consumers_of_the_init_updates_and_eval_share_a_key",),
    "test_env_rules.py": ("test_a_final_observation_carries_the_refusals_of_its_own_state",
                          "test_the_batch_env_keeps_what_its_observation_refused",
                          "test_the_digs_the_mask_refuses_are_remembered_until_the_map_changes"),
    "test_pose_distance.py": EVERY_TEST,
    "test_kill_points.py": EVERY_TEST,
    "test_results_pipeline.py": EVERY_TEST,
    "test_resume_flags.py": EVERY_TEST,
    "test_reward_discounting.py": EVERY_TEST,
    "test_preemption.py": EVERY_TEST,
    "test_runtime.py": ("test_train_smoke_runs_one_real_update",),
    "test_models.py": ("test_every_parameter_gets_a_finite_nonzero_gradient",
                       "test_trunks_share_parameters_only_when_shared",  # the same gradients
                       "test_patch_convolutions_match_lax_convolutions",
                       "test_stored_derived_features_give_the_same_outputs"),
    "test_solver.py": ("test_solver_completes_every_sampled_map",
                       "test_task_done_exactly_at_the_last_action",
                       "test_replay_in_a_fresh_env_is_identical",
                       "test_coverage_equals_the_reference_on_every_reachable_pose"),
    "test_learning.py": EVERY_TEST,
    "test_trainer_gymnax.py": EVERY_TEST,  # pytestmark
    "test_rewards.py": ("test_idle_pays_exactly_the_step_cost_every_step",  # `rollouts`
                        "test_no_policy_beats_idle_by_more_than_its_progress",
                        "test_loops_without_net_progress_never_beat_idle",
                        "test_pressing_only_do_on_trenches_cannot_farm_pick_up_and_dump",
                        "test_progress_terms_telescope_to_the_potential",
                        "test_dense_return_is_bounded_on_reachable_states",
                        "test_finishing_the_task_has_the_highest_return",
                        "test_do_nothing_is_priced_like_a_move_and_never_cheaper"),
    "test_benchmark_env.py": EVERY_TEST,
    "test_curriculum_eval.py": (
        "test_observation_mask_is_the_next_states_action_mask_across_resets",
        "test_do_nothing_is_masked_unless_configured_otherwise"),
    "test_env_rollouts.py": EVERY_TEST,
    "test_profiling.py": ("test_profile_reports_every_section_on_one_scale",),
    "test_dig_distance.py": ("test_policy_with_dig_distance_adds_only_its_mlp",),
    "test_reach_cache.py": ("test_the_kept_work_equals_the_work_from_scratch_at_every_step",
                            "test_the_tracked_only_search_is_kept_exactly_too",
                            "test_the_bootstrap_reads_the_rollouts_cache_and_equals_the_plain_one"),
    "test_render.py": ("test_play_episode_writes_one_gif_frame_per_step",),
    "test_failure_diagnosis.py": (
        "test_a_load_whose_every_dump_the_mask_forbids_is_told_apart",),
    "test_cut_off_checks.py": ("test_a_batch_of_one_kind_tests_with_that_kinds_fill_alone",),
    # its fixture compiles a rollout and the census: about 25 s on 2 cores
    "test_reach_repair.py": ("test_the_repair_equals_the_fill_from_scratch_wherever_it_answers",),
}


def is_listed_slow(item: pytest.Item) -> bool:
    names = SLOW_TESTS.get(item.path.name, ())
    return names == EVERY_TEST or getattr(item, "originalname", item.name) in names


# (file name, marked slow) of every test collected, before `-m` deselects any: what
# tests/test_suite.py checks the share of `make test-fast` against.
COLLECTED: list[tuple[str, bool]] = []


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_listed_slow(item):
            item.add_marker(pytest.mark.slow)
    COLLECTED[:] = [(item.path.name, item.get_closest_marker("slow") is not None)
                    for item in items]
    order = {name: rank for rank, name in enumerate(SLOW_TESTS)}
    position = {}
    for index, item in enumerate(items):
        position.setdefault(item.path, index)
    items.sort(key=lambda item: (order.get(item.path.name, len(order)), position[item.path]))


# Between test files, past a third of the kernel's limit on memory maps, jax's caches are
# cleared: a worker whose compiled programs pass the limit segfaults in its next compile
# (tests/memory_maps.py). The largest file adds about 12,000 maps, well within the two
# thirds left. Past 70% within a file (no file comes near), they are cleared at once.
@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    last_of_its_file = nextitem is None or nextitem.path != item.path
    release_if_crowded(1 / 3 if last_of_its_file else 0.7)
    # An in-process main() may have pointed the cache elsewhere: back to this worker's.
    if jax.config.jax_compilation_cache_dir != _CACHE_DIR:
        jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_SECONDS)
