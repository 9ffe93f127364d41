"""Every module attribute the sources name exists in the installed torch and Triton.

Much of the library runs only on a GPU (capture checks, events, cooperative launches), so a
misspelt `torch.cuda.<name>` there passes every CPU test and fails every GPU call (one did:
`torch.cuda.is_current_streamcapturing`). This reads the sources instead of running them:
each dotted name rooted at an imported module (`torch.cuda.x`, `tl.x`, `triton.x`) must
resolve, attribute by attribute, for as long as the chain stays on modules and classes (past
that the value is a runtime object). The Triton 3.6 job runs it against 3.6's names too;
names that one version lacks are looked up with getattr by the code, not named."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import pytest

import tritonrnn.rnn.library  # noqa: F401 (registers torch.ops.tritonrnn.*)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("kernels", "rnn", "tensorarray", "bench", "scripts", "examples")
                 for p in (ROOT / d).rglob("*.py"))


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> module for the file's `import a.b [as c]` statements."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
    return aliases


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


def test_sources_found():
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {"kernels/grid_barrier.py", "rnn/library.py", "bench/cli.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_module_attributes_exist(path):
    tree = ast.parse(path.read_text())
    aliases = {k: v for k, v in _module_aliases(tree).items()
               if v.split(".")[0] in ("torch", "triton", "numpy")}
    bad = sorted({(line, name, miss) for name, line in _chains(tree, aliases)
                  if (miss := _unresolved(name)) is not None})
    assert not bad, "names that do not exist in the installed versions: " + "; ".join(
        f"line {line}: {name} ({miss} is missing)" for line, name, miss in bad)
