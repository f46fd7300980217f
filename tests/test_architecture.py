"""The package layout's rules (docs/ARCHITECTURE.md), read from the source with `ast`:
imports point one way, `envs/` imports nothing from `terra_rl`, the config imports no network
code, and one module per package reads environment variables."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Lowest first: a module imports from its own layer and the layers before it, never after.
LAYERS = ("base", "features", "nets", "adapters", "algo", "run", "perf", "analysis", "cli",
          "validation", "ops")
BASE_MODULES = ("__init__", "choices", "env_vars", "config", "config_checks")
ENVIRONMENT_READERS = {"terra_rl": "terra_rl/env_vars.py", "envs": "envs/params.py"}


def modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def layer_of(module_name: str) -> str:
    """'terra_rl.algo.update' -> 'algo'; 'terra_rl.config' -> 'base'."""
    parts = module_name.split(".")
    if len(parts) == 1 or parts[1] in BASE_MODULES:
        return "base"
    return parts[1]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import outside `if TYPE_CHECKING:` blocks; `from a
    import b` yields `a.b`, which names a submodule or, harmlessly, an attribute of `a`."""
    found = []

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def test_every_terra_rl_module_belongs_to_a_layer():
    unknown = {module_name(path) for path in modules("terra_rl")
               if layer_of(module_name(path)) not in LAYERS}
    assert not unknown, f"add these to a layer in LAYERS (and docs/ARCHITECTURE.md): {unknown}"


def test_imports_point_down_the_layers():
    upward = []
    for path in modules("terra_rl"):
        here = LAYERS.index(layer_of(module_name(path)))
        for line, name in imported_modules(path):
            if name.startswith("terra_rl.") and LAYERS.index(layer_of(name)) > here:
                upward.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not upward, "\n".join(upward)


def test_the_algorithm_imports_no_run_ops_or_command_line():
    for path in modules("terra_rl/algo"):
        for line, name in imported_modules(path):
            if name.startswith("terra_rl."):
                assert layer_of(name) not in {"run", "ops", "cli"}, f"{path.name}:{line} {name}"


@pytest.mark.parametrize("path", ["terra_rl/config.py", "terra_rl/config_checks.py"])
def test_the_config_imports_no_network_code_or_jax(path):
    names = [name for _, name in imported_modules(REPO / path)]
    assert not [n for n in names if n.startswith(("terra_rl.nets", "terra_rl.features",
                                                    "jax", "flax"))], names


def test_envs_import_nothing_from_terra_rl():
    offending = [f"{path.relative_to(REPO)}:{line} {name}" for path in modules("envs")
                 for line, name in imported_modules(path) if name.split(".")[0] == "terra_rl"]
    assert not offending, offending


def _reads_the_environment(path: Path) -> list[int]:
    """Lines that touch `os.environ`, `os.getenv`, `os.putenv` or `os.unsetenv`, or import them."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "os" and node.attr in {"environ", "getenv", "putenv",
                                                             "unsetenv"}:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {
                a.name for a in node.names} & {"environ", "getenv", "putenv", "unsetenv"}:
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("package", sorted(ENVIRONMENT_READERS))
def test_one_module_reads_environment_variables(package):
    readers = {str(path.relative_to(REPO)) for path in modules(package)
               if _reads_the_environment(path)}
    assert readers == {ENVIRONMENT_READERS[package]}


def test_the_checks_see_a_violation(tmp_path):
    """The rules' readers find what they look for (a test that cannot fail proves nothing)."""
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom typing import TYPE_CHECKING\n"
                      "from terra_rl.run import trainer\n"
                      "if TYPE_CHECKING:\n    from terra_rl.ops import runtime\n"
                      "x = os.environ.get('A')\n")
    assert imported_modules(sample) == [(1, "os"), (2, "typing.TYPE_CHECKING"),
                                        (3, "terra_rl.run.trainer")]
    assert _reads_the_environment(sample) == [6]
    assert layer_of("terra_rl.run.trainer") == "run"
    assert LAYERS.index("algo") < LAYERS.index(layer_of("terra_rl.run.trainer"))
