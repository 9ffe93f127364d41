"""Every module attribute the sources name exists in the installed torch, Triton and tritonrnn.

Much of the library runs only on a GPU (capture checks, events, cooperative launches), so a
misspelt `torch.cuda.<name>` there passes every CPU test and fails every GPU call (one did:
`torch.cuda.is_current_streamcapturing`). This reads the sources instead of running them:
each dotted name rooted at an imported module (`torch.cuda.x`, `tl.x`, `pg.x` after
`from tritonrnn.kernels import persistent_grid as pg`) must resolve, attribute by attribute,
for as long as the chain stays on modules and classes (past that the value is a runtime
object), and each name a `from m import name` statement takes must exist in m, wherever the
statement sits (one inside a GPU-only branch runs only there). Each call of a function these
resolve to (a Triton helper's `@triton.jit` function included, and `self.method(...)` in the
file's own classes) must fit its signature: its keywords exist, its arguments bind; a
kernel launch's keywords must be its parameters or the CUDA backend's launch options (a GPU
refuses others, the interpreter does not), and its parameters must all be set; calls
inside a `try` with an `except TypeError:` of its own are the code's version fallbacks and
are left out.
The tests are read too: the GPU-marked ones run only on a GPU. The Triton 3.6 job runs it
against 3.6's names and signatures too; names that one version lacks are looked up with
getattr by the code, not named. An attribute of any other runtime object (a stream, an
event, device properties) is checked only for existing somewhere: on some class or module
loaded, or defined by the sources. What this cannot see: a real name used on the wrong
object, a wrong device or a wrong value."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import pathlib
import re
import sys
import warnings

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
    """Local name -> module for the file's imports of modules rooted in CHECKED, and the
    (line, module, name, local name) of each name a `from module import name` statement
    takes from one that is not itself a module."""
    aliases, names = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in CHECKED:
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
                    names.append((node.lineno, base, a.name, a.asname or a.name))
    return aliases, names


def _attribute_path(expr: ast.expr) -> tuple[str | None, list[str]]:
    """The name an attribute chain starts from (None when it is not a plain name) and the
    attributes after it, in order: `pg.Hoist.FIRST` -> ("pg", ["Hoist", "FIRST"])."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return (expr.id if isinstance(expr, ast.Name) else None), parts[::-1]


def _chains(tree: ast.AST, aliases: dict[str, str]):
    """(dotted name, line) of every outermost attribute chain rooted at an imported module."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        root, parts = _attribute_path(node)
        if root in aliases:
            yield ".".join([aliases[root], *parts]), node.lineno


def _resolve(dotted: str) -> tuple[object, str | None]:
    """(the object `dotted` names, None) where it resolves; (None, the first prefix that does
    not) where a name is missing; (None, None) where it cannot be known statically: an
    optional dependency not installed here, or a chain that passes a runtime value."""
    parts = dotted.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None, None  # an optional dependency (tqdm, flashrnn, ...)
    for i, name in enumerate(parts[1:], 1):
        if not (inspect.ismodule(obj) or inspect.isclass(obj)):
            return None, None  # a runtime value: not checked statically
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        try:  # a submodule not imported yet
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return None, ".".join(parts[:i + 1])
    return obj, None


def _problems(text: str, path: pathlib.Path) -> list[str]:
    """What in `text` (the source of `path`) names something that does not exist."""
    tree = ast.parse(text)
    aliases, names = _module_aliases(tree, _package(path))
    bad = {(line, f"{name} ({miss} is missing)") for name, line in _chains(tree, aliases)
           if (miss := _resolve(name)[1]) is not None}
    bad |= {(line, f"from {base} import {name} ({miss} is missing)")
            for line, base, name, _ in names
            if (miss := _resolve(f"{base}.{name}")[1]) is not None}
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


# --- calls: keywords and argument counts against the callee's signature ---


def _callee(func: ast.expr, aliases: dict[str, str], imported: dict[str, str],
            own: str | None):
    """The object a call's function expression names, where it resolves statically, else
    None."""
    root, parts = _attribute_path(func)
    if root in aliases:
        base = aliases[root]
    elif root in imported:
        base = imported[root]
    elif root is not None and own is not None:
        base = f"{own}.{root}"
    else:
        return None
    return _resolve(".".join([base, *parts]))[0]


def _jit_function(obj):
    """The Python function of a `@triton.jit` one (a JITFunction, or under TRITON_INTERPRET=1
    an InterpretedFunction), else None."""
    if type(obj).__name__ in ("JITFunction", "InterpretedFunction"):
        return obj.fn
    return None


def _signature(obj) -> inspect.Signature | None:
    fn = _jit_function(obj) or obj
    if not callable(fn):
        return None
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one
        return None


def _self_methods(tree: ast.AST, own: str | None) -> dict[int, inspect.Signature]:
    """Signature (bound: without self) of each `self.method(...)` call in a module-level class
    of the file's own module, where the class itself defines or inherits that method."""
    if own is None:
        return {}
    module, found = importlib.import_module(own), {}
    for cls_node in getattr(tree, "body", []):
        cls = getattr(module, getattr(cls_node, "name", ""), None)
        if not isinstance(cls_node, ast.ClassDef) or not inspect.isclass(cls):
            continue
        for node in ast.walk(cls_node):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
                continue
            raw = inspect.getattr_static(cls, node.func.attr, None)
            if isinstance(raw, staticmethod | classmethod):
                found[id(node)] = inspect.signature(getattr(cls, node.func.attr))
            elif inspect.isfunction(raw):
                params = list(inspect.signature(raw).parameters.values())[1:]
                found[id(node)] = inspect.Signature(params)
    return found


def _launch_options() -> set[str]:
    """The launch options the installed Triton's CUDA backend takes (num_warps, ...)."""
    from triton.backends.nvidia.compiler import CUDAOptions

    return {f.name for f in dataclasses.fields(CUDAOptions)}


def _launch_problems(node: ast.Call, kernel) -> set[tuple[int, str]]:
    """A launch's keywords that are neither the kernel's parameters nor launch options (a GPU
    refuses them; the interpreter does not), and its parameters left unset."""
    if _jit_function(kernel) is None:
        return set()
    params = inspect.signature(_jit_function(kernel)).parameters
    name = ast.unparse(node.func.value)
    keywords = [k.arg for k in node.keywords if k.arg is not None]
    unknown = sorted(set(keywords) - set(params) - _launch_options())
    if unknown:
        return {(node.lineno, f"{name}[...]: no parameter or launch option {unknown}")}
    if any(isinstance(a, ast.Starred) for a in node.args) or len(keywords) < len(node.keywords):
        return set()
    unset = [p for i, p in enumerate(params) if i >= len(node.args) and p not in keywords
             and params[p].default is inspect.Parameter.empty]
    many = len(node.args) > len(params)
    if unset or many:
        return {(node.lineno, f"{name}[...]: " + (f"{len(node.args)} arguments for "
                                                   f"{len(params)} parameters" if many else
                                                   f"parameters not set {unset}"))}
    return set()


def _call_problems(text: str, path: pathlib.Path) -> list[str]:
    """Calls whose keywords or argument count the callee's signature refuses."""
    tree = ast.parse(text)
    package = _package(path)
    aliases, names = _module_aliases(tree, package)
    imported = {local: f"{base}.{name}" for _, base, name, local in names}
    own = None  # the file's own module, for calls of its functions by bare name
    if package and path.stem != "__main__" and _is_module(f"{package}.{path.stem}"):
        own = f"{package}.{path.stem}"
    # A version fallback catches TypeError alone (`except TypeError:`); a handler of several
    # errors (a command's `except (ValueError, TypeError)`) guards nothing.
    guarded = {id(c) for t in ast.walk(tree) if isinstance(t, ast.Try) and any(
        isinstance(h.type, ast.Name) and h.type.id == "TypeError" for h in t.handlers)
        for part in (*t.body, *t.handlers) for c in ast.walk(part)}
    methods = _self_methods(tree, own)
    bad = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in guarded:
            continue  # (a call in a try that catches TypeError: the code's version fallback)
        if isinstance(node.func, ast.Subscript):  # kernel[grid](...): a launch
            bad |= _launch_problems(node, _callee(node.func.value, aliases, imported, own))
            continue
        if id(node) in methods:
            sig = methods[id(node)]
        else:
            sig = _signature(_callee(node.func, aliases, imported, own))
        if sig is None:
            continue
        kinds = {p.kind for p in sig.parameters.values()}
        keywords = [k.arg for k in node.keywords if k.arg is not None]
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            unknown = [k for k in keywords if k not in sig.parameters or
                       sig.parameters[k].kind is inspect.Parameter.POSITIONAL_ONLY]
            if unknown:
                bad.add((node.lineno, f"{ast.unparse(node.func)}: no parameter {unknown}"))
                continue
        if any(isinstance(a, ast.Starred) for a in node.args) or len(keywords) < len(
                node.keywords):
            continue  # *args / **kwargs: the count is not known statically
        try:
            sig.bind(*node.args, **dict.fromkeys(keywords))
        except TypeError as e:
            bad.add((node.lineno, f"{ast.unparse(node.func)}: {e}"))
    return [f"line {line}: {what}" for line, what in sorted(bad)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_calls_fit_their_callees_signatures(path):
    bad = _call_problems(path.read_text(), path)
    assert not bad, "calls their callee refuses: " + "; ".join(bad)


@pytest.mark.parametrize("source, want", [
    ("from tritonrnn.kernels import grid_tiles as gt\ngt.grid_programs(1, 2, block_q=3)\n",
     "line 2: gt.grid_programs: no parameter ['block_q']"),
    ("import torch\ntorch.cuda.Event(enable_timin=True)\n",
     "line 2: torch.cuda.Event: no parameter ['enable_timin']"),
    ("from .persistent_grid import check_coresident\ncheck_coresident(1)\n",
     "line 2: check_coresident: missing a required argument: 'sm_count'"),
    ("import triton.language as tl\ndef k(X):\n    tl.load(X, cache_modifer='.cg')\n",
     "line 3: tl.load: no parameter ['cache_modifer']"),
    ("def f():\n    _forward(1)\n",  # the file's own function, called by name
     "line 2: _forward: missing a required argument"),
    ("import torch\ntry:\n    torch.cuda.Event(enable_timin=True)\nexcept TypeError:\n    pass\n",
     None),
    # A handler of several errors is a command's error report, not a version fallback.
    ("import torch\ntry:\n    torch.cuda.Event(enable_timin=True)\n"
     "except (ValueError, TypeError):\n    pass\n",
     "line 3: torch.cuda.Event: no parameter ['enable_timin']"),
    ("class _Outs:\n    def g(self):\n        self.finish(1)\n",  # the module's own class
     "line 3: self.finish: too many positional arguments"),
    ("_bare_barriers_kernel[(2,)](1, 2, 3, num_warp=4)\n",  # a misspelt launch option
     "line 1: _bare_barriers_kernel[...]: no parameter or launch option ['num_warp']"),
    ("_bare_barriers_kernel[(2,)](1, num_warps=4)\n",
     "line 1: _bare_barriers_kernel[...]: parameters not set"),
])
def test_a_call_its_callee_refuses_is_found(source, want):
    path = ROOT / "kernels" / ("grid_barrier.py" if "barriers" in source else
                               "persistent_grid.py")
    bad = _call_problems(source, path)  # as if in that file
    if want is None:
        assert not bad
    else:
        assert len(bad) == 1 and bad[0].startswith(want), bad


# --- attribute names on runtime objects: each must exist somewhere ---

# Attributes that only instances have (set in __init__, or made up on access), which no
# class or module lists: each is named where the sources use it.
INSTANCE_ONLY = {
    "element_ty", "primitive_bitwidth",  # Triton dtype and pointer-type instances
    "asm",  # a Triton CompiledKernel's assembly dict
    "skipif",  # pytest.mark.<name>: made up on access
    "frame_count",  # torch._dynamo.testing.CompileCounter* instances
    "pedantic", "extra_info", "stats",  # the pytest-benchmark fixture
    "__notes__",  # an exception's notes (add_note)
    "measured_files", "contexts_by_lineno",  # coverage's CoverageData (coverage optional)
    "lift_fresh",  # torch.ops.aten.<op>: made up on access
    "get_cudnn_mode",  # torch.backends.cudnn.rnn: its module class hands it out on access
}
# torch.nn.LSTM / GRU / RNN's per-layer parameters (weight_ih_l0, bias_hh_l1_reverse, ...).
NN_PARAMETER = re.compile(r"(weight|bias)_(ih|hh|hr)_l\d+(_reverse)?")


def _imported_modules() -> set[str]:
    """Every module the sources import, or take a name from, that imports here."""
    names = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _base(node, _package(path))
                names |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return {n for n in names if not n.endswith("__main__") and _is_module(n)}


def _attributes_of_loaded_modules(known: set[str]) -> None:
    """Adds the names of every loaded module and of every class one holds (ast nodes' fields
    too) to `known`."""
    for module in list(sys.modules.values()):
        try:
            names = dir(module)
        except Exception:  # a lazy module that fails on inspection
            continue
        known.update(names)
        for name in names:
            try:
                obj = getattr(module, name)
            except Exception:
                continue
            if inspect.isclass(obj):
                with contextlib.suppress(Exception):
                    known.update(dir(obj), getattr(obj, "_fields", ()) or ())


def _known_attributes() -> set[str]:
    """Attribute names that exist somewhere: in any loaded module or any class of one (after
    importing every module the sources import), or that the sources define themselves
    (functions, classes, assignments to attributes, keywords, argparse dests, string names)."""
    known = set()
    with warnings.catch_warnings():  # importing or reading deprecated names warns
        warnings.simplefilter("ignore")
        _imported_modules()
        _attributes_of_loaded_modules(known)
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                known.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                known.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                known.add(node.id)
            elif isinstance(node, ast.keyword | ast.arg) and node.arg:  # keywords, parameters
                known.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("--"):  # an argparse option: its dest
                    known.add(node.value[2:].replace("-", "_"))
                elif node.value.isidentifier():  # getattr / setattr / namedtuple names
                    known.add(node.value)
    return known


def _unknown_attributes(text: str, known: set[str]) -> list[str]:
    return [f"line {node.lineno}: .{node.attr}" for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            and node.attr not in known and node.attr not in INSTANCE_ONLY
            and not NN_PARAMETER.fullmatch(node.attr)]


@pytest.fixture(scope="module")
def known_attributes() -> set[str]:
    return _known_attributes()


def test_every_attribute_name_exists_somewhere(known_attributes):
    """A method or attribute of a runtime object (a stream, an event, device properties, a
    tensor) is beyond the checks above: its name must at least exist on some class or module
    loaded, or be defined by the sources. A misspelling almost never does. A name that only
    instances have goes into INSTANCE_ONLY, with what it belongs to."""
    bad = [f"{path.relative_to(ROOT)} {line}" for path in SOURCES
           for line in _unknown_attributes(path.read_text(), known_attributes)]
    assert not bad, "attribute names that exist nowhere: " + "; ".join(bad)


@pytest.mark.parametrize("source", [
    "def f(stream, event):\n    stream.wait_evnt(event)\n",
    "def f(props):\n    return props.multi_processor_cnt\n",
    "import torch\ndef f(x):\n    return x.untyped_storag()\n",
])
def test_a_misspelt_runtime_attribute_is_found(known_attributes, source):
    assert len(_unknown_attributes(source, known_attributes)) == 1
