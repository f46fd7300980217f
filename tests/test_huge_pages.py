"""`terra_rl.run.huge_pages`: when a process restarts itself with huge pages for malloc, and
that the restart keeps its PID, arguments and output and sets the tunable once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from terra_rl.run import huge_pages as hp

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("environ", "glibc", "mode", "wanted"), [
    ({}, (2, 36), "madvise", True),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, (2, 35), "madvise", True),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, (2, 36), "madvise", False),  # the user's
    ({hp.OPT_OUT: "0"}, (2, 36), "madvise", False),
    ({hp.OPT_OUT: "1"}, (2, 36), "madvise", True),
    ({}, (2, 34), "madvise", False),  # glibc without the tunable
    ({}, None, "madvise", False),  # not glibc
    ({}, (2, 36), "always", False),  # the kernel maps huge pages already
    ({}, (2, 36), "never", False),
    ({}, (2, 36), None, False),
])
def test_the_restart_is_wanted_only_where_it_helps(environ, glibc, mode, wanted):
    assert hp.wants_reexec(environ, glibc, mode) is wanted


def test_the_tunable_is_appended_to_the_others():
    env = hp.with_tunable({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
                   "HOME": "/h"}
    assert hp.with_tunable({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert not hp.wants_reexec(hp.with_tunable({}), (2, 36), "madvise")


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert hp.thp_mode(path) == "madvise"
    path.write_text("[always] madvise never\n")
    assert hp.thp_mode(path) == "always"
    path.write_text("garbage\n")
    assert hp.thp_mode(path) is None
    assert hp.thp_mode(tmp_path / "missing") is None


def test_a_restarted_process_keeps_its_pid_arguments_and_output(tmp_path):
    """A script that prints, restarts and prints again: both lines reach the pipe in order,
    with the same PID and arguments; the tunable is set once where the machine wants it and
    never with the opt-out."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from terra_rl.run.huge_pages import reexec_with_huge_pages
        print(os.getpid(), sys.argv[1:], os.environ.get("GLIBC_TUNABLES", ""))
        reexec_with_huge_pages()
        print("after", os.getpid(), sys.argv[1:], os.environ.get("GLIBC_TUNABLES", ""))
    """))
    env = {key: value for key, value in os.environ.items()
           if key not in ("GLIBC_TUNABLES", hp.OPT_OUT)}
    wanted = sys.platform == "linux" and hp.wants_reexec(env, hp.glibc_version(), hp.thp_mode())

    def run(extra):
        out = subprocess.run([sys.executable, str(script), "a b", "--c"], env=env | extra,
                             capture_output=True, text=True, check=True, timeout=60)
        return out.stdout.splitlines()

    lines = run({})
    first_pid = lines[0].split()[0]
    after = lines[-1].split(" ", 1)
    assert after[0] == "after" and lines[-1].startswith(f"after {first_pid} ['a b', '--c']")
    if wanted:  # started, restarted with the tunable, which does not restart it again
        assert len(lines) == 3
        assert lines[1].startswith(f"{first_pid} ['a b', '--c'] glibc.malloc.hugetlb=1")
        assert lines[2].endswith("glibc.malloc.hugetlb=1")
    else:
        assert len(lines) == 2
    opted_out = run({hp.OPT_OUT: "0"})
    assert len(opted_out) == 2 and not opted_out[1].endswith("hugetlb=1")
