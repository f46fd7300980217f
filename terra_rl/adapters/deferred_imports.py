"""Importing a library without the modules it imports at module level for code a run never
calls: `deferring(names)` stands a `DeferredModule` in for each named module while the
import runs, and the stand-in imports the real module on its first attribute access.

gymnax imports `matplotlib.pyplot`, `matplotlib.colors` and `seaborn` (which pulls in pandas
and scipy) in five environment modules, for their renderers only. The package `matplotlib`
is deferred with them, since `import matplotlib.pyplot` binds the package first. Deferred,
they no longer cost every gymnax run 1.2 s of start-up and 0.3 s of exit on the 2-core CPU,
the package 0.1 s more (docs/PERFORMANCE.md), and a renderer still works: its first `plt.`
or `sns.` loads the real module.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator


class DeferredModule(types.ModuleType):
    """Stands in for the module `name` until an attribute is read, then forwards every read
    to the real module (imported then, once)."""

    def __getattr__(self, attribute: str):
        if attribute == "__path__":
            # `from package import name` asks; as a plain module the stand-in is not imported
            # for it, and the name is then read as an attribute (below).
            raise AttributeError(attribute)
        submodule = sys.modules.get(f"{self.__name__}.{attribute}")
        if isinstance(submodule, DeferredModule):  # `import package.sub` of two stand-ins
            return submodule
        if sys.modules.get(self.__name__) is self:  # still standing in: make way for the real one
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


@contextlib.contextmanager
def deferring(*names: str) -> Iterator[None]:
    """Within the block, `import name` of each not yet imported module binds a
    `DeferredModule`. After it, `sys.modules` holds no stand-in: a later import anywhere
    loads the real module."""
    stand_ins = {name: DeferredModule(name) for name in names if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
