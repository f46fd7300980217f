"""`terra_rl.adapters.deferred_imports`: a deferred module loads on first use and only then,
leaves no stand-in behind, and gymnax comes up without its renderers' plotting libraries."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from terra_rl.adapters.deferred_imports import DeferredModule, deferring


@pytest.fixture
def counted_module(tmp_path, monkeypatch):
    """A module `deferred_probe` that counts its own executions in `deferred_probe_runs`."""
    (tmp_path / "deferred_probe.py").write_text(textwrap.dedent("""
        import builtins
        builtins.deferred_probe_runs = getattr(builtins, "deferred_probe_runs", 0) + 1
        def answer():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deferred_probe", raising=False)
    import builtins
    monkeypatch.setattr(builtins, "deferred_probe_runs", 0, raising=False)
    yield builtins
    sys.modules.pop("deferred_probe", None)


def test_a_deferred_module_runs_on_first_use_only(counted_module):
    with deferring("deferred_probe"):
        import deferred_probe as probe
    assert isinstance(probe, DeferredModule)
    assert counted_module.deferred_probe_runs == 0
    assert "deferred_probe" not in sys.modules  # no stand-in left behind

    assert probe.answer() == 42
    assert counted_module.deferred_probe_runs == 1
    import deferred_probe as real
    assert not isinstance(real, DeferredModule)
    assert probe.answer is real.answer
    assert counted_module.deferred_probe_runs == 1


def test_a_module_already_imported_is_not_deferred(counted_module):
    import deferred_probe as real
    with deferring("deferred_probe"):
        import deferred_probe as again
    assert again is real and counted_module.deferred_probe_runs == 1


def test_gymnax_comes_up_without_its_plotting_libraries():
    """In a fresh interpreter (the suite's own may have loaded them already)."""
    code = textwrap.dedent("""
        import sys
        from terra_rl.adapters.gymnax_env import GymnaxBatchEnv
        plotting = ("seaborn", "pandas", "scipy", "matplotlib", "matplotlib.pyplot")
        def loaded():  # read again at every call: what is imported now
            return [m for m in plotting if m in sys.modules]
        assert not loaded(), loaded()
        env = GymnaxBatchEnv("CartPole-v1", 2)
        from gymnax.environments.misc import pong  # a module that imports all of them
        assert env.num_actions == 2 and not loaded(), loaded()
        palette = pong.sns.color_palette("husl", 3)  # a renderer's first use loads seaborn
        assert "seaborn" in loaded()
        import seaborn
        assert len(palette) == 3 and pong.sns.color_palette is seaborn.color_palette
        import matplotlib.colors
        import matplotlib.pyplot
        # `import matplotlib.pyplot as plt` and `from matplotlib import colors` of the
        # deferred package: each stand-in forwards to its own real module.
        assert pong.colors.to_rgb is matplotlib.colors.to_rgb
        assert pong.plt.figure is matplotlib.pyplot.figure
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
