"""Every module attribute the sources name exists in the installed torch, Triton and tritonrnn.

Much of the library runs only on a GPU (capture checks, events, cooperative launches), so a
misspelt `torch.cuda.<name>` there passes every CPU test and fails every GPU call (one did:
`torch.cuda.is_current_streamcapturing`). This reads the sources instead of running them:
each dotted name rooted at an imported module (`torch.cuda.x`, `tl.x`, `pg.x` after
`from tritonrnn.kernels import persistent_grid as pg`) must resolve, attribute by attribute,
for as long as the chain stays on modules and classes (past that the value is a runtime
object), and each name a `from m import name` statement takes must exist in m, wherever the
statement sits (one inside a GPU-only branch runs only there). The tests are read too: the
GPU-marked ones run only on a GPU. The Triton 3.6 job runs it against 3.6's names too;
names that one version lacks are looked up with getattr by the code, not named."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import pytest

import tritonrnn.rnn.library  # noqa: F401 (registers torch.ops.tritonrnn.*)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "rnn", "tensorarray", "bench")  # installed as tritonrnn.<name>
SOURCES = sorted(p for d in (*PACKAGES, "scripts", "examples", "tests")
                 for p in (ROOT / d).rglob("*.py"))
CHECKED = ("torch", "triton", "numpy", "tritonrnn")  # roots whose names are resolved


def _package(path: pathlib.Path) -> str | None:
    """The package a source file's relative imports start from (None outside the library)."""
    top = path.relative_to(ROOT).parts[0]
    return f"tritonrnn.{top}" if top in PACKAGES else None


def _base(node: ast.ImportFrom, package: str | None) -> str:
    """The absolute module a `from ... import` statement imports from."""
    if not node.level:
        return node.module or ""
    assert package is not None, "a relative import outside the library's packages"
    parts = package.split(".")
    parts = parts[: len(parts) - node.level + 1]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _module_aliases(tree: ast.AST, package: str | None) -> tuple[dict[str, str], list]:
    """Local name -> module for the file's imports of modules, and the (line, module, name)
    of each name a `from module import name` statement takes that is not itself a module."""
    aliases, names = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            if base.split(".")[0] not in CHECKED:
                continue
            for a in node.names:
                if a.name == "*":
                    continue
                if _is_module(f"{base}.{a.name}"):
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                else:
                    names.append((node.lineno, base, a.name))
    return aliases, names


def _chains(tree: ast.AST, aliases: dict[str, str]):
    """(dotted name, line) of every outermost attribute chain rooted at an imported module."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts, n = [], node
        while isinstance(n, ast.Attribute):
            parts.append(n.attr)
            n = n.value
        if isinstance(n, ast.Name) and n.id in aliases:
            yield ".".join([aliases[n.id], *reversed(parts)]), node.lineno


def _unresolved(dotted: str) -> str | None:
    """The first prefix of `dotted` that does not resolve, or None."""
    parts = dotted.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None  # an optional dependency (tqdm, flashrnn, ...) not installed here
    for i, name in enumerate(parts[1:], 1):
        if not (inspect.ismodule(obj) or inspect.isclass(obj)):
            return None  # a runtime value: not checked statically
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        try:  # a submodule not imported yet
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return ".".join(parts[:i + 1])
    return None


def _problems(text: str, path: pathlib.Path) -> list[str]:
    """What in `text` (the source of `path`) names something that does not exist."""
    tree = ast.parse(text)
    aliases, names = _module_aliases(tree, _package(path))
    aliases = {k: v for k, v in aliases.items() if v.split(".")[0] in CHECKED}
    bad = {(line, f"{name} ({miss} is missing)") for name, line in _chains(tree, aliases)
           if (miss := _unresolved(name)) is not None}
    bad |= {(line, f"from {base} import {name} ({miss} is missing)") for line, base, name in names
            if (miss := _unresolved(f"{base}.{name}")) is not None}
    return [f"line {line}: {what}" for line, what in sorted(bad)]


def test_sources_found():
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {"kernels/grid_barrier.py", "rnn/library.py", "bench/cli.py",
            "tests/test_kernels_grid.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_module_attributes_exist(path):
    bad = _problems(path.read_text(), path)
    assert not bad, "names that do not exist in the installed versions: " + "; ".join(bad)


@pytest.mark.parametrize("source, want", [
    ("import torch\ntorch.cuda.is_current_streamcapturing()\n",
     "line 2: torch.cuda.is_current_streamcapturing"),
    ("from tritonrnn.kernels import persistent_grid as pg\npg.grid_programz(1)\n",
     "line 2: tritonrnn.kernels.persistent_grid.grid_programz"),
    ("def f():\n    from ..kernels.persistent_grid import grid_programz\n",
     "line 2: from tritonrnn.kernels.persistent_grid import grid_programz"),
    ("from .. import kernelz\n", "line 1: from tritonrnn import kernelz"),
])
def test_a_misspelt_name_is_found(source, want):
    bad = _problems(source, ROOT / "rnn" / "probe.py")  # as if in rnn/ (never written)
    assert len(bad) == 1 and bad[0].startswith(want), bad
