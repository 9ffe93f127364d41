"""The planner: (configuration, device properties, tuning cache) -> a frozen Plan.

It decides, per layer and direction, which recurrent kernel family runs and with which tiles,
records whether the stack runs as a layer pipeline (rnn/pipeline.py's `decide`, at T =
max_time), and lays out every buffer of a training step with its byte size (the pipelined
run's buffers when it is pipelined). Pure Python: the device is described by a
`DeviceProperties` value that tests fake (`PRESETS`), read once per device by
`device_properties()` and never probed at import time.

Family rule (documented in `recurrence_choice`):
  1. float64 -> "reference" (the pure-PyTorch recurrence; Triton's fp64 dot is not a fast path).
  2. "persistent_cta" when one program (16 batch rows, 8 warps) can keep all of R (and P_w)
     in shared memory and its states in registers without spilling (`_cta_fits`; on an H100
     padded H <= 128 for half LSTM/GRU, 256 for half tanh/relu, half that for fp32).
  3. "persistent_grid" when R split in hidden slices over at most one program per SM fits on
     chip per program, and the grid is co-resident (programs <= SMs). At batch 1 (GPU presets)
     first with vector tiles (`_vector_fit`: one batch tile of the batch's width,
     the weight slice in registers, FMA products) where the slice fits 256 B per thread;
     else MMA tiles (batch tiles of 16..64, and 128 for streamed weights on 64-unit slices,
     `_grid_batch_tiles`; weights in shared memory), resident where the
     slice fits and its chunks' dot operands stay small (`resident_operands_fit`), else
     streamed from L2 in chunks of 64 columns (float32 on a GPU always streamed: its FMA
     dots spill a resident chunk, `_weight_layouts`).
  4. "stepwise" otherwise (one launch per step, on the tiles that read the fewest L2 bytes
     per step, `_stepwise_fit`). Never fails.
A grid family's backward without a projection may run the split-K kernel instead
(kernels/split_k.py; LayerPlan.split_k_bwd): where a choice names it (constraint or tuning
entry), else where the opt-in switches TRITONRNN_BWD_SPLIT_K / _K1 give it (`_with_split_k`),
else in the heuristic's plan at the shapes where an H200 timed it faster in the layer
(`_split_k_rule`: LSTM H=1024 at batch buckets 16 and 64, GRU H=1536 at 16; 16-bit, one
direction per launch, sm_90).
A tuning-cache entry for the plan's key replaces the heuristic choice; `plan_constraints`
replaces both, and raises when a forced choice cannot apply on the device.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import json
import math
import operator
import os
import stat
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

try:
    import fcntl
except ImportError:  # not POSIX: the tuning cache's writes go unlocked
    fcntl = None

import torch
import triton

from .config import GATES, check_int, make_config
from .reference import backward_preacts

if TYPE_CHECKING:  # rnn/pipeline.py imports this module
    from .pipeline import Decision

FAMILIES = ("persistent_cta", "persistent_grid", "stepwise", "reference")
_CONSTRAINT_KEYS = ("family", "block_b", "block_h", "block_k", "num_warps", "num_warps_bwd",
                    "block_h_bwd", "block_b_bwd", "num_stages", "num_stages_bwd",
                    "split_k_bwd")
# Stack-level constraints (not per recurrence, not in the tuning cache): pipeline_chunks = k
# forces the layer pipeline of rnn/pipeline.py to k time chunks (1: layers run one after
# another).
_STACK_KEYS = ("pipeline_chunks",)


@dataclass(frozen=True)
class DeviceProperties:
    """What the planner needs to know about a device."""

    name: str
    sm_count: int
    smem_per_program: int  # bytes of shared memory one program may use
    regs_per_sm: int  # 32-bit registers per SM
    l2_bytes: int
    interpreter: bool = False
    # The CUDA compute capability (major * 10 + minor) its kernels compile for: `tritonrnn
    # aot`'s default target for a preset. The planner's rules were calibrated on sm_90.
    arch: int = 90


PRESETS: dict[str, DeviceProperties] = {
    "h100": DeviceProperties("NVIDIA H100 80GB HBM3", 132, 227 * 1024, 65536, 50 * 2**20),
    "h200": DeviceProperties("NVIDIA H200", 132, 227 * 1024, 65536, 50 * 2**20),
    # 163 KiB: the A100's opt-in shared memory per block. Its plans compile for sm_80 within
    # it and without spills (`tritonrnn aot --device-preset a100`, Triton 3.6: the grid,
    # targets, fp16 and stack presets); none has run on an A100.
    "a100": DeviceProperties("NVIDIA A100-SXM4-80GB", 108, 163 * 1024, 65536, 40 * 2**20,
                             arch=80),
    # The interpreter has no on-chip limit; it plans as an H100 would so CI exercises the
    # same choices, and the launchers run grid barriers one step per launch there.
    "interpreter": DeviceProperties(
        "Triton interpreter (CPU)", 132, 227 * 1024, 65536, 50 * 2**20, interpreter=True
    ),
}


@functools.cache
def _cuda_properties(index: int) -> DeviceProperties:
    p = torch.cuda.get_device_properties(index)
    smem = getattr(p, "shared_memory_per_block_optin", 0) or 227 * 1024
    return DeviceProperties(
        name=p.name,
        sm_count=p.multi_processor_count,
        smem_per_program=int(smem),
        regs_per_sm=int(getattr(p, "regs_per_multiprocessor", 65536)),
        l2_bytes=int(getattr(p, "L2_cache_size", 50 * 2**20)),
        arch=p.major * 10 + p.minor,
    )


def device_properties(device: torch.device | str | int | None = None) -> DeviceProperties:
    """Properties of `device`: a torch.device, a device string or index ("cuda:1", 0,
    "cpu": the interpreter's), or a preset's name (PRESETS: "h100", ...); default: the
    current CUDA device, else the interpreter."""
    if isinstance(device, str) and device in PRESETS:
        return PRESETS[device]
    expected = f"a torch.device, a device string or index, or one of {sorted(PRESETS)}"
    if device is not None and (isinstance(device, bool)
                               or not isinstance(device, (torch.device, str, int))):
        raise TypeError(f"device: expected {expected}, got {type(device).__name__} {device!r}")
    try:
        dev = torch.device(device) if device is not None else None
    except RuntimeError as e:
        raise ValueError(f"device: expected {expected}, got {device!r}") from e
    if dev is None:
        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device: expected a device this machine has, got {dev} (torch "
                             f"sees no CUDA device)")
        if dev.index is not None and not 0 <= dev.index < count:
            raise ValueError(f"device: expected one of the {count} CUDA devices here "
                             f"(cuda:0..cuda:{count - 1}), got {dev}")
        return _cuda_properties(dev.index if dev.index is not None else torch.cuda.current_device())
    return PRESETS["interpreter"]


_current_device_properties = device_properties  # plan_for's keyword shadows the name


# ----------------------------------------------------------------------------- constraints

# Sorted (key, value) pairs: immutable, hashable (part of the plan cache key).
_constraints: contextvars.ContextVar[tuple] = contextvars.ContextVar("tritonrnn_plan", default=())


def _constraint_problem(key: str, value: object) -> str | None:
    """What is wrong with one planner choice (a `plan_constraints` keyword or a tuning-cache
    entry's field, key in _CONSTRAINT_KEYS + _STACK_KEYS), as "KEY expected X, got Y"; None
    when it is valid. Checks the value alone; whether it applies to a shape is `_apply`'s."""
    if key == "family":
        return None if value in FAMILIES else (
            f"family expected one of {list(FAMILIES)}, got {value!r}")
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key == "split_k_bwd":
        return None if is_int and value in (0, 1, 2) else (
            f"split_k_bwd expected 0 (the family's own backward), 1 (the split-K backward, one "
            f"grid barrier a step) or 2 (the split-K backward, two), got {value!r}")
    if key == "block_k":
        if is_int and (value == 0 or (value >= 16 and not value & (value - 1))):
            return None
        return (f"block_k expected 0 (resident weights) or a power of two >= 16 (streamed "
                f"in chunks of block_k), got {value!r}")
    if not is_int:
        return f"{key} expected a positive int, got {value!r}"
    if value < 1:
        return f"{key} expected a positive int, got {value!r}"
    if key == "block_b" and (value & (value - 1) or 4 < value < 16):
        return f"block_b expected 1, 2, 4 (vector tiles) or a power of two >= 16, got {value}"
    if key in ("block_h_bwd", "block_b_bwd") and (value < 16 or value & (value - 1)):
        return f"{key} expected a power of two >= 16 (the backward's MMA tiles), got {value}"
    if key == "block_h" and (value < 8 or value & (value - 1)):
        return f"block_h expected a power of two >= 8, got {value}"
    if key in ("num_warps", "num_warps_bwd") and (value > 32 or value & (value - 1)):
        return f"{key} expected a power of two <= 32, got {value}"
    return None


def _as_int(value: object) -> object:
    """`value` as a Python int where it is an integer scalar of another type (NumPy's, a
    0-d torch integer tensor), else unchanged (bools, floats, strings, tensors of another
    dtype or shape: refused by name)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not (value.dtype.is_floating_point or value.dtype.is_complex
                                     or value.dtype == torch.bool):
            return int(value)
        return value
    if isinstance(value, int | str | float | bool) or value is None:
        return value
    try:
        return operator.index(value)  # NumPy integers (np.bool_ has no __index__)
    except TypeError:
        return value


@contextlib.contextmanager
def plan_constraints(**overrides):
    """Forces planner choices inside the block, e.g. `plan_constraints(family="stepwise")`.

    Keys: family (one of FAMILIES), block_b (1, 2, 4: the grid families' vector tiles;
    powers of two >= 16: MMA tiles), block_h (>= 8 with vector tiles, >= 16 with MMA tiles),
    block_k (0: the weight slice resident on chip; a power of two: streamed in chunks of
    block_k every step), num_warps (both passes), num_warps_bwd (the backward's, where it
    should differ), block_h_bwd / block_b_bwd (the backward's own MMA tiles, powers of two
    >= 16, where they should differ from block_h / block_b: grid families, resident
    weights), num_stages (the streamed loops' software-pipeline depth, both passes; grid
    families, streamed weights: block_k > 0), num_stages_bwd (the backward's, where it should
    differ), split_k_bwd (0: the family's own backward; 1 / 2: the split-K backward,
    kernels/split_k.py, in its one- / two-barrier form on its rule's tiles, for a grid
    family without a projection: `_with_split_k`), pipeline_chunks. A forced choice that
    cannot apply to a shape raises
    ValueError when that shape is planned: the tiles of a family that has none (block_h or a
    streamed block_k on the persistent CTA, any tile or warps on the reference family), or a
    plan that does not fit the device (shared memory, co-resident programs). Integer values
    may be any integer type (NumPy's too, as plan_for's sizes), not bool."""
    overrides = {k: _as_int(v) for k, v in overrides.items()}
    for k, v in overrides.items():
        if k not in _CONSTRAINT_KEYS + _STACK_KEYS:
            raise ValueError(
                f"plan_constraints: expected keys {list(_CONSTRAINT_KEYS + _STACK_KEYS)}, "
                f"got {k!r}"
            )
        problem = _constraint_problem(k, v)
        if problem:
            raise ValueError(f"plan_constraints: {problem}")
    token = _constraints.set(tuple(sorted({**dict(_constraints.get()), **overrides}.items())))
    try:
        yield
    finally:
        _constraints.reset(token)


def current_constraints() -> dict:
    return dict(_constraints.get())


# ----------------------------------------------------------------------------- tuning cache


def tuning_cache_path() -> Path:
    """$TRITONRNN_CACHE_DIR/tuning.json (default ~/.cache/tritonrnn/tuning.json)."""
    return Path(_cache_file(os.environ.get("TRITONRNN_CACHE_DIR", "")))


@functools.lru_cache(maxsize=8)
def _cache_file(root: str) -> str:
    root = root or os.path.join(os.path.expanduser("~"), ".cache", "tritonrnn")
    return os.path.join(root, "tuning.json")


def _tuning_cache_stamp() -> tuple[str, tuple[int, int, int] | None]:
    """The tuning cache's path and (mtime_ns, inode, size), None without a file: what its
    contents and the plans made from them are cached by. `store_tuning_entry` replaces the
    file whole and empties this process's caches; but a file system may hand the freed
    inode to the next replacement, and file times move in ticks of the kernel's coarse clock
    (milliseconds), so two stores of another process within one tick that leave the size as
    it was can go unseen here until the file changes again."""
    path = _cache_file(os.environ.get("TRITONRNN_CACHE_DIR", ""))
    try:
        st = os.stat(path)
    except OSError:
        return path, None
    return path, (st.st_mtime_ns, st.st_ino, st.st_size)


def load_tuning_cache() -> dict:
    """{key: entry}; a missing or unreadable cache is empty (the planner's heuristic runs).
    Re-read only when the file changes (one stat per call, `_tuning_cache_stamp`)."""
    path, stamp = _tuning_cache_stamp()
    return {} if stamp is None else _load_cache(path, stamp)


@functools.lru_cache(maxsize=4)
def _load_cache(path: str, _stamp: tuple[int, int, int]) -> dict:
    try:
        return stored_entries(Path(path))
    except (OSError, ValueError):  # unreadable: planned as if empty (a store refuses it)
        return {}


def sources_fingerprint(folder: Path) -> str:
    """16 hex digits of a sha256 over the names and bytes of a folder's *.py files."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(folder.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def kernels_fingerprint() -> str:
    """`sources_fingerprint` of kernels/ (tritonrnn.kernels): the Triton code a timing ran
    and the launchers that pick its constexprs."""
    return sources_fingerprint(Path(__file__).resolve().parent.parent / "kernels")


# The kernel switches that change what a launch runs (kernels/NOTES.md, "Switches"): module
# globals read at import (tests and ablations set them in-process) and their defaults.
_VARIANT_GLOBALS = (
    ("grid_tiles", "_FWD_JOINED_SUMS", True), ("grid_tiles", "_FWD_MASK_IN_LOOP", True),
    ("grid_tiles", "_FWD_PAIRED_CHUNKS", True),
    ("grid_tiles", "_BWD_PAIRED_GATES", True),
    ("grid_tiles", "_BWD_PAIRED_GATES_WIDE", False),
    ("split_k", "_BWD_SPLIT_K", False), ("split_k", "_BWD_SPLIT_K1", False),
)


def kernel_variants() -> dict[str, object]:
    """The kernel switches set away from their defaults ({} by default): the variant a timing
    ran, which a tuning entry and tune's partial record carry, so that the planner uses a
    choice only under the variant that timed it."""
    from tritonrnn.kernels import grid_tiles

    out = {name.lstrip("_"): value
           for (_, name, default), value in zip(_VARIANT_GLOBALS, _switch_state(), strict=True)
           if value != default}
    hoist = grid_tiles._env_passes("TRITONRNN_HOIST_WEIGHTS")
    if hoist != "auto":
        out["HOIST_WEIGHTS"] = hoist if isinstance(hoist, str) else ",".join(sorted(hoist))
    return out


def tuning_entry(key: str) -> dict | None:
    """The tuning cache's entry for a plan key when the running Triton timed the running
    kernels, else None.

    A timing belongs to the compiler that built the kernels (another release compiles the
    same choice to other code: Triton 3.4's persistent-CTA backward takes 23 to 35% more
    shared memory than 3.6's at LSTM H=128 / 64 bf16) and to the kernels' code (a choice that
    won on one version of the kernels can spill or lose on the next), so the planner ignores
    an entry from another release or other kernel sources (`kernels_fingerprint`; or one
    that names neither), or timed under other kernel switches (`kernel_variants`; an entry
    without "variants" ran the defaults), and `tritonrnn tune` times its key again.
    An entry that is not a valid choice (not a dict, a field `plan_constraints` would refuse,
    such as block_b "16" or num_warps 3, or a malformed measured / candidates pair: an edited
    or damaged file) is ignored as well, with a warning naming the key and the problem."""
    entry = load_tuning_cache().get(key)
    if entry is None or (isinstance(entry, dict) and (
            entry.get("triton") != triton.__version__
            or entry.get("kernels") != kernels_fingerprint()
            or entry.get("variants", {}) != kernel_variants())):
        return None  # none, or another release's, other kernels' or variant's timing
    problem = _entry_problem(entry)
    if problem is not None:
        warnings.warn(f"tritonrnn: tuning cache entry {key!r}: {problem} (ignored: the "
                      f"planner's heuristic runs; cache {tuning_cache_path()})", RuntimeWarning,
                      stacklevel=2)
        return None
    return entry


# A tuning entry's fields besides its choice (_CONSTRAINT_KEYS): the timing and what took it.
_ENTRY_METADATA = ("ms", "device", "triton", "kernels", "variants", "measured", "candidates")


def _entry_problem(entry: object) -> str | None:
    """What makes a tuning-cache entry unusable, or None (`tuning_entry`)."""
    if not isinstance(entry, dict):
        return f"expected a dict of choices, got {type(entry).__name__}"
    unknown = sorted(str(k) for k in entry if k not in (*_CONSTRAINT_KEYS, *_ENTRY_METADATA))
    if unknown:
        return (f"fields expected among {list(_CONSTRAINT_KEYS)} and the timing's "
                f"{list(_ENTRY_METADATA)}, got {unknown}")
    for k in _CONSTRAINT_KEYS:
        if k in entry and (problem := _constraint_problem(k, entry[k])):
            return problem
    counts = {k: entry[k] for k in ("measured", "candidates") if k in entry}
    if counts and (len(counts) != 2 or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in counts.values())):
        return (f"measured and candidates expected two ints >= 0, got measured="
                f"{entry.get('measured')!r}, candidates={entry.get('candidates')!r}")
    return None


def tuning_complete(entry: dict) -> bool:
    """Whether a tuning entry is the best of all its key's candidates (`tritonrnn tune
    --max-candidates` stores the best of the first `measured` of `candidates`, which the
    planner uses and a later tune run carries on from)."""
    return entry.get("measured", 0) >= entry.get("candidates", 0)


def store_tuning_entry(key: str, choice: dict, ms: float, device: str,
                       measured: int | None = None, candidates: int | None = None) -> bool:
    """Records the best choice for a plan key with the Triton release, the kernels' sources
    and the kernel switches (`kernel_variants`, where any is set) that timed it (atomic
    replace of the JSON file; an entry for the key from another release, other kernels or
    other switches is replaced).
    measured < candidates: the best of only the first `measured` candidates (`tuning_complete`).
    Returns False, storing nothing, where the key's entry (of this release, kernels and
    switches) covers more of the candidates: a complete one against a partial one, a partial
    one of more measured candidates (two `tritonrnn tune` runs of one key, one with
    --max-candidates or cut short: the later store would replace the fuller timing)."""
    entry = {**{k: choice[k] for k in _CONSTRAINT_KEYS if k in choice},
             "ms": float(ms), "device": device, "triton": triton.__version__,
             "kernels": kernels_fingerprint()}
    if variants := kernel_variants():
        entry["variants"] = variants
    if measured is not None and candidates is not None and measured < candidates:
        entry.update(measured=measured, candidates=candidates)
    path = tuning_cache_path()
    with tuning_cache_lock():
        entries = stored_entries(path)
        old = entries.get(key)
        if _coverage(old, entry) > _coverage(entry, entry):
            return False
        write_json_atomic(path, {"version": 1, "entries": {**entries, key: entry}})
    # (this process's caches: the file's stamp may repeat, `_tuning_cache_stamp`)
    _load_cache.cache_clear()
    _plan_cached.cache_clear()
    return True


def _coverage(entry: object, like: dict) -> float:
    """How much of its key's candidates a tuning entry timed (all: inf; partial: how many),
    -1 for one that is unusable or of another release, kernels or switches than `like`."""
    if (not isinstance(entry, dict) or _entry_problem(entry) is not None
            or any(entry.get(k) != like.get(k) for k in ("triton", "kernels"))
            or entry.get("variants", {}) != like.get("variants", {})):
        return -1
    return math.inf if tuning_complete(entry) else entry["measured"]


def read_json_object(path: Path, what: str, fix: str) -> dict | None:
    """The JSON object in the file at `path`, None without the file; a file that is not one
    (unreadable JSON, not UTF-8, another JSON type) raises ValueError "`what`, got ...;
    `fix`" (the tuning cache, tune's partial file: files written back whole, which a damaged
    one must not be)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)  # (bytes: not UTF-8 is a ValueError too)
    except ValueError as e:
        raise ValueError(f"{what}, got unreadable JSON ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}, got a JSON {type(data).__name__}; {fix}")
    return data


def stored_entries(path: Path) -> dict:
    """The entries of the tuning cache file at `path` ({} without one); a file that is not
    the format (damaged JSON, another format version, a hand edit) raises ValueError naming
    it. The planner reads such a file as empty (`_load_cache`); a store, which replaces the
    file whole, lets the error through instead of overwriting it with one entry (`tritonrnn
    tune` keeps its measurements in its partial file, so a rerun after moving the file loses
    nothing)."""
    what = f"tuning cache {path}: expected a JSON object with version 1 and its entries"
    fix = "move it aside (or delete it) to start a new cache; it is left as it is"
    data = read_json_object(path, what, fix)
    if data is None:
        return {}
    if type(data.get("version")) is not int or data["version"] != 1:
        raise ValueError(f"{what}, got version {data.get('version')!r}; {fix}")
    entries = data.get("entries", {})
    if not isinstance(entries, dict):
        raise ValueError(f"{what}, got entries of type {type(entries).__name__}; {fix}")
    return entries


def _umask() -> int:
    """The process's umask (read without changing it where /proc has it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, data: dict, *, sort_keys: bool = True) -> None:
    """`data` as `path`'s whole new content: written beside it, then renamed over it (a
    reader sees the old file or the new one, never part of either). The new file keeps the
    old one's permissions, or gets those a plain open() would give (0o666 less the umask):
    a cache directory shared between users stays readable by them. The data reach the disk
    before the rename (fsync), so a crash leaves the old content or the new, never an empty or
    partial file (the rename itself may be lost: the directory is not synced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=sort_keys)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def tuning_cache_lock():
    """Holds an exclusive lock (flock on tuning.lock beside the cache) around a
    read-modify-write of the tuning cache's files, so that concurrent `tritonrnn tune` runs
    (one per GPU of a machine) keep each other's entries. Without fcntl (not POSIX) the
    writes are unlocked: atomic replaces, where the last of two simultaneous ones wins."""
    path = tuning_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(path.with_name("tuning.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- choices


@dataclass(frozen=True)
class LayerPlan:
    """Kernel choice for the recurrence of one layer and direction."""

    family: str
    block_b: int = 16
    block_h: int = 0  # persistent_grid / stepwise: hidden units per program
    num_warps: int = 4
    num_programs: int = 0  # per launch: batch tiles x hidden slices (x 2 for a pair launch)
    onchip_bytes: int = 0  # per program
    block_k: int = 0  # persistent_grid / stepwise: 0 = weights resident, else streamed chunk
    num_dirs: int = 1  # 2: both directions of a bidirectional layer share each launch
    num_warps_bwd: int = 0  # the backward kernel's warps; 0: num_warps
    # persistent_grid / stepwise: the backward loads two gates' operands at once (PAIRG,
    # `kernels.grid_tiles.grid_pairs_gates`), decided within the device's budget
    pair_gates: bool = False
    # persistent_grid / stepwise with resident weights: the backward's own tiles where they
    # differ from the forward's (0: the forward's; `_taller_backward`, constraints
    # block_h_bwd / block_b_bwd). num_programs and onchip_bytes then count the larger pass.
    block_h_bwd: int = 0
    block_b_bwd: int = 0
    # persistent_grid / stepwise with streamed weights: the software-pipeline depth of the
    # forward's streamed loops and, where it differs, the backward's (the launches'
    # num_stages; 0: Triton's default, `kernels.grid_tiles.DEFAULT_STAGES`;
    # `_stream_stages`, constraints num_stages / num_stages_bwd). onchip_bytes counts them.
    num_stages: int = 0
    num_stages_bwd: int = 0
    # persistent_grid / stepwise without a projection: the split-K backward (kernels/split_k.py)
    # in its one-barrier (1) or two-barrier (2) form instead of the family's own (0), on the
    # tiles its rule picks (`split_k_launch`) and num_warps_bwd; the backward's own tiles,
    # stages and pair_gates are then unused (0, False). num_programs and onchip_bytes count
    # its launch where it is the larger (`_with_split_k`; constraint split_k_bwd).
    split_k_bwd: int = 0
    # The forward launch's programs where the backward's launch has more (the split-K
    # kernel's, the backward's own tiles; 0: num_programs, which counts the larger pass): the
    # layer pipeline bounds each pass's layers in flight by that pass's programs
    # (`pass_programs`, `pipeline.concurrent_layers`).
    forward_programs: int = 0

    @property
    def backward_warps(self) -> int:
        return self.num_warps_bwd or self.num_warps

    @property
    def backward_stages(self) -> int:
        """The backward launch's num_stages (0: Triton's default)."""
        return self.num_stages_bwd or self.num_stages

    @property
    def backward_block_h(self) -> int:
        return self.block_h_bwd or self.block_h

    @property
    def backward_block_b(self) -> int:
        return self.block_b_bwd or self.block_b

    def pass_programs(self, backward: bool) -> int:
        """Programs of one pass's launch: the backward's counted as the larger of the two
        (num_programs), the forward's as its own (forward_programs where set)."""
        return self.num_programs if backward else (self.forward_programs or self.num_programs)

    @property
    def own_backward_tiles(self) -> bool:
        """Whether the backward runs tiles of its own (block_h_bwd / block_b_bwd)."""
        return bool(self.block_h_bwd or self.block_b_bwd)

    def choice(self) -> dict:
        """This plan as `candidates` and plan_constraints spell a choice: family, block_b and
        warps; for the grid families also block_h, block_k, the backward's warps and whether
        it runs the split-K backward (split_k_bwd, 0 included: a choice that names it is not
        overridden by the switches, `_with_split_k`), the backward's tiles where it has its
        own, and with streamed weights the stages of both passes, the forward's alone under
        a split-K backward (Triton's default named as such), so that a tuned entry keeps what
        was timed."""
        from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES

        own = {"family": self.family, "block_b": self.block_b, "num_warps": self.num_warps}
        if self.family != "persistent_cta":
            own.update(block_h=self.block_h, block_k=self.block_k,
                       num_warps_bwd=self.backward_warps, split_k_bwd=self.split_k_bwd)
            if self.own_backward_tiles:
                own.update(block_h_bwd=self.backward_block_h,
                           block_b_bwd=self.backward_block_b)
            if self.block_k:
                own.update(num_stages=self.num_stages or DEFAULT_STAGES)
                if not self.split_k_bwd:
                    own.update(num_stages_bwd=self.backward_stages or DEFAULT_STAGES)
        return own

    def with_backward_warps(self, warps: int) -> LayerPlan:
        """This plan with the backward's warps set (stored as 0 when equal to num_warps)."""
        return replace(self, num_warps_bwd=0 if warps == self.num_warps else warps)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _bucket(n: int) -> int:
    """Power-of-two bucket: plan keys never depend on the exact T or B."""
    return _pow2(max(n, 1))


# The persistent CTA's warps: its on-chip budgets (below) are those of 8-warp compiles.
_CTA_WARPS = 8


def _cta(cell, H, Hout, P, dtype, block_b, batch, num_warps, num_dirs=1) -> LayerPlan:
    """A persistent-CTA plan: one program per batch tile and direction (a pair launch,
    num_dirs = 2, runs both directions' programs, `kernels.persistent_cta.cta_forward_pair`)."""
    from tritonrnn.kernels.persistent_cta import cta_onchip_bytes

    return LayerPlan(
        "persistent_cta", block_b, 0, num_warps, -(-batch // block_b) * num_dirs,
        cta_onchip_bytes(cell, H, Hout, P, dtype, block_b), num_dirs=num_dirs,
    )


# Persistent-CTA budgets per program at 8 warps, measured from sm_90 compiles of the kernels
# (shared memory for the resident weights; registers for biases, states and one step's gate
# tiles, whose real use is about 3x the bytes counted): beyond them the kernel spills.
_CTA_SMEM = {2: 200 * 1024, 4: 128 * 1024}
_CTA_REGS = {2: 84 * 1024, 4: 42 * 1024}


def _cta_fits(cell, H, Hout, P, dtype, props) -> bool:
    from tritonrnn.kernels.persistent_cta import cta_onchip_parts

    parts = cta_onchip_parts(cell, H, Hout, P, dtype, 16)
    item = dtype.itemsize
    return parts.smem <= min(_CTA_SMEM[item], props.smem_per_program) and (
        parts.regs <= _CTA_REGS[item]
    )


def _grid(family, cell, H, Hout, P, dtype, block_b, block_h, batch, num_warps, block_k=0,
          num_dirs=1, smem_limit=None) -> LayerPlan:
    """A grid-family plan (the streamed loops at Triton's default stages); smem_limit: the
    budget within which its backward may pair its gates (`grid_pairs_gates`; None: no
    limit), counted in onchip_bytes where it does."""
    from tritonrnn.kernels.grid_tiles import grid_onchip_bytes, grid_pairs_gates, grid_programs

    return LayerPlan(
        family, block_b, block_h, num_warps,
        grid_programs(H, Hout, P, batch, block_h, block_b, num_dirs),
        grid_onchip_bytes(cell, H, Hout, P, dtype, block_h, block_b, block_k,
                          fwd_warps=num_warps, smem_limit=smem_limit),
        block_k, num_dirs,
        pair_gates=grid_pairs_gates(cell, H, Hout, P, dtype, block_h, block_b, block_k,
                                    smem_limit),
    )


_GRID_TILES = (16, 32, 64, 128)

# The largest tile (block_h * block_b) whose persistent grid keeps its weights resident;
# past it `_grid_fit` streams them (block_k = _STREAM_K) on the tiles the streamed pass
# picks. Resident 32 x 64, 64 x 64 and 128 x 64 tiles (B >= 256 at H <= 512, 80 of the H100
# / H200 plans over the four cells, B 1-1024) hold a live [block_h, block_b] tile per gate
# and pass, more than the registers: their sm_90 compiles (Triton 3.6, bf16, 8 warps) spill
# in the step loop although each chunk's operand passes `resident_operands_fit` (local
# loads per step, forward / backward: LSTM H=256 B=1024 7 / 22, LSTM H=512 B=512 0 / 22,
# rnn_tanh H=512 B=1024 0 / 35); streamed, none. An H200 timed LSTM H=512 B=512
# (2026-11-27, the third session, `scripts/step_ablation.py` variant `bk64`, layer fwd +
# bwd at T = 1024, bf16): resident 12.48 + 27.31 ms, streamed 9.19 + 22.58 (0.80x).
_RESIDENT_TILE = 1024


def _grid_batch_tiles(block_h: int, block_k: int, fma_dots: bool) -> tuple[int, ...]:
    """The persistent grid's batch tiles on hidden slices of block_h, narrowest first: 16 to
    64 columns, and, for streamed weights on MMA dots, 128 on 64-unit slices, which
    `_grid_fit` so tries before the 128 x 64 tiles of the same program count. Against those
    (where the grid needs that many: B >= 512 at large H, or a pair launch) the weights are
    read by half the batch tiles and h (dph) by twice the hidden slices: for LSTM a third
    less L2 traffic in the forward, as much in the backward (whose dph holds all 4 gates),
    a seventh less over both (`_stepwise_traffic`: 0.164 -> 0.141 bytes per element pair;
    GRU an eighth, one-gate cells the same), with two thirds of the forward's shared
    memory. The sm_90 compiles (Triton 3.6, bf16, 8 warps; local loads per
    step, forward / backward, 128 x 64 -> 64 x 128): LSTM H=1024 B=1024 77 / 73 -> 41 / 70
    (with `_late_loads`), H=768 B=1024 83 / 70 -> 53 / 69, H=1536 B=512 82 / 70 -> 40 / 69,
    GRU H=1536 B=512 64 / 19 -> 31 / 17; rnn_tanh H=1024 B=1024 spills neither way, forward
    1528 -> 1194 instructions, backward 1226 -> 1288; shared memory 221184 -> 147456 B in
    the LSTM forward, the backwards' 73728 B either way. Triton 3.9 spills both forwards
    more, about alike (LSTM H=1024 B=1024 132 -> 113 local loads + stores per step, GRU
    116 -> 113). Resident weights (their wide batch tiles' chunks spill,
    `resident_operands_fit`) and float32's FMA dots (both tiles spill thousands of values
    per step) keep the tiles they had. Not yet timed on a GPU (step_ablation's `bh128`
    restores 128 x 64 tiles)."""
    wide = block_h == 64 and block_k and not fma_dots
    return _GRID_TILES if wide else tuple(t for t in _GRID_TILES if t <= 64)


# Reduction chunk of streamed weights: 64 columns keep a chunk's weight and operand tiles a
# few KiB (with the compiler's multi-buffering) while each dot still has K = 64.
_STREAM_K = 64


def _smem_budget(props: DeviceProperties) -> int:
    """Shared memory a grid-family plan may count on per program on the device (the
    interpreter preset's is an H100's): `kernels.grid_tiles.grid_smem_budget`."""
    from tritonrnn.kernels.grid_tiles import grid_smem_budget

    return grid_smem_budget(props.smem_per_program)


def _weight_layouts(dtype: torch.dtype, props: DeviceProperties) -> tuple[int, ...]:
    """The block_k values the MMA-tile plans (persistent grid, stepwise) try, in order:
    resident weights (0), then streamed in chunks of _STREAM_K.

    float32 on a GPU only streamed. Its exact dots run on the FMA units, and Triton's FMA
    lowering of a dot loads each thread's rows of the whole reduction into registers before
    the first product: a resident chunk is up to 512 columns wide, a streamed one 64. The sm_90
    compiles (Triton 3.6, 16 x 16 tiles, 4 warps; resident -> streamed/64, spill bytes per
    thread and local loads per step of forward / backward): LSTM H=512 B=16 12008 / 11456 B,
    5765 / 5090 -> none; GRU H=768 9936 / 9304 B -> none; LSTM H=256 0 / 608 B (226 local
    loads per backward step) -> none; rnn_tanh H=512 0 / 3408 B -> none. (8 warps still
    spill resident: LSTM H=512 backward 560 B.) The vector tiles (B = 1) and the
    persistent CTA keep their resident weights; `plan_constraints(block_k=0)` and the
    tuner's candidates still reach the resident fp32 tiles.

    Not on the interpreter preset: its fp32 dots are the half-precision dots' (NumPy, no FMA
    lowering), so CI's fp32 tests keep running the plans a GPU runs in bf16 / fp16, checked
    to fp32 accuracy."""
    return (_STREAM_K,) if _fma_dots(dtype, props) else (0, _STREAM_K)


def _fma_dots(dtype: torch.dtype, props: DeviceProperties) -> bool:
    """Whether the MMA-tile kernels' dots run on the FMA units (exact float32 on a GPU)."""
    return dtype == torch.float32 and not props.interpreter


def _weights_label(cell: str, lp: LayerPlan, dtype: torch.dtype, H: int, P: int) -> str:
    """How a plan holds its recurrent weights, for Plan.explain(): resident (with the passes
    that keep them in registers, `kernels.grid_tiles.hoist_pass`: "fwd first chunk"
    where only the first resident chunk stays there, `Hoist.FIRST`), or streamed in chunks
    of block_k with the loops' shape (joint gate tile, transposed products) and their stages
    where the plan names them (`_stream_stages`). The forward's alone under a split-K
    backward (its R blocks: `Plan._backward_exchange`)."""
    from tritonrnn.kernels.grid_tiles import (
        Hoist,
        _joint_gates,
        _swap_dots,
        hoist_pass,
        vector_tiles,
    )

    grid = lp.family in ("persistent_grid", "stepwise")
    if grid and vector_tiles(lp.block_b):
        return "resident in registers (vector tiles, FMA)"
    if not lp.block_k:
        passes = (("fwd", lp.num_warps, lp.block_h, lp.block_b),
                  ("bwd", lp.backward_warps, lp.backward_block_h, lp.backward_block_b)
                  )[:1 if lp.split_k_bwd else 2]
        held = {p: hoist_pass(p, cell, H, P or H, P, dtype, bh, bb, 0, w,
                              lp.family == "persistent_grid") if grid else Hoist.NONE
                for p, w, bh, bb in passes}
        hoisted = [p + (" first chunk" if h == Hoist.FIRST else "") for p, h in held.items()
                   if h]
        return "resident" + (f" (in registers: {', '.join(hoisted)})" if hoisted else "")

    shape = [name for name, on in (("joint gates", _joint_gates(cell, lp.block_k, lp.block_b)),
                                   ("transposed", _swap_dots(lp.block_k, lp.block_b))) if on]
    if lp.num_stages:
        shape.append(f"{lp.num_stages} stages" + (
            f", backward {lp.backward_stages}" if lp.backward_stages != lp.num_stages
            and not lp.split_k_bwd else ""))
    return f"streamed/{lp.block_k}" + (f" ({', '.join(shape)})" if shape else "")


def _grid_warps(onchip: int, block_h: int, block_b: int) -> int:
    """8 warps once a program holds a large slice or tile (keeps registers per thread low)."""
    return 8 if onchip > 64 * 1024 or block_h * block_b >= 512 else 4


def _grid_fit(cell, H, Hout, P, dtype, batch, props, block_k=0,
              num_dirs=1) -> LayerPlan | None:
    """The persistent-grid tiles: the smallest hidden slice, then the smallest batch tile,
    whose grid (both directions' programs for a pair launch, num_dirs = 2) is co-resident
    (<= SMs) and whose per-program footprint (the resident weight slice, or a streamed
    chunk's tiles with block_k > 0) fits on chip. Resident weights only where those tiles'
    chunks keep their dot operands small (`kernels.grid_tiles.resident_operands_fit`);
    where not, None: the weights are streamed on the streamed pass's tiles rather than kept
    resident on larger hidden slices or narrower batch tiles (which spilled more: LSTM H=1024
    P=512 B=128 at 32 x 32 tiles 244 local loads per step against 31 at 16 x 64)."""
    from tritonrnn.kernels.grid_tiles import resident_operands_fit

    for block_h in _GRID_TILES:
        if block_h > max(16, _pow2(H)):
            break
        for block_b in _grid_batch_tiles(block_h, block_k, _fma_dots(dtype, props)):
            if block_b > max(16, _pow2(batch)):
                break
            fwd = _persistent_grid_warps(block_h, block_b, cell, block_k, dtype, H, Hout, P)
            lp = _grid("persistent_grid", cell, H, Hout, P, dtype, block_b, block_h, batch, fwd,
                       block_k, num_dirs, _smem_budget(props))
            if lp.num_programs <= props.sm_count and (
                lp.onchip_bytes <= _smem_budget(props)
            ):
                if not block_k and (not resident_operands_fit(H, Hout, block_b)
                                    or block_h * block_b > _RESIDENT_TILE):
                    return None  # streamed on these tiles rather than resident on others
                lp = lp.with_backward_warps(_persistent_grid_bwd_warps(
                    block_h, block_b, cell, block_k, dtype, H, Hout, P))
                lp = _taller_backward(lp, cell, H, Hout, P, dtype, batch, props)
                return _stream_stages(lp, cell, H, Hout, P, dtype, props)
    return None


# `_stream_stages`: the bytes a streamed loop should have in flight per program, the most
# stages it gives one, and the largest tiles (block_h * block_b) of a gated cell whose
# forward / backward it pipelines deeper than Triton's default.
_IN_FLIGHT = 96 * 1024
_MAX_STAGES = 8
_STAGED_TILE = {"fwd": 4096, "bwd": 2048}


def _stream_stages(lp: LayerPlan, cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                   props: DeviceProperties) -> LayerPlan:
    """A persistent grid with streamed weights on MMA dots: each pass's streamed loop
    pipelined deep enough to have _IN_FLIGHT bytes in flight (num_stages - 1 chunks), as far
    as the shared-memory budget allows and at most _MAX_STAGES stages (`_with_stages`); a
    gated cell's pass on tiles larger than _STAGED_TILE, other plans, and passes where no
    more than Triton's default 3 stages fit, as they are.

    Why: a streamed step is a loop over K in chunks of block_k whose loads Triton pipelines
    through shared memory, num_stages - 1 chunks in flight while the MMAs read one, and
    every program reads its whole weight slice and the exchange's operand each step. At the
    default depth LSTM H=1024 B=256 (32 x 64 tiles, 128 programs; an H200 on 2026-11-26:
    layer backward 35.46 ms, forward 12.96, T = 1024) keeps 24 KiB in flight per program in
    the backward, whose loop reads 64 chunks of 12 KiB per step. Were the loop latency-bound,
    a step would take 32 L2 round trips: the backward's 34.6 us per step (the layer's GEMMs
    outside the recurrence included) leaves at most about 1 us for each, and the grid's 100
    MB per step at that pace is 2.9 TB/s, below the 4.2-4.6 TB/s the B = 64 backward reached
    (kernels/NOTES.md). By that model more stages pay until L2 bandwidth binds: 4.6 TB/s
    from 128 programs at 1 us a round trip takes 36 KB in flight per program; _IN_FLIGHT
    leaves room above that (32 x 64 LSTM tiles: 5 forward stages of 24 KiB, 8 backward ones
    of 12 KiB; 16 x 16 tiles 8 of 10 / 4 KiB). Not yet timed on a GPU: step_ablation's `st3`
    restores Triton's default.

    The sm_90 compiles (bf16) at 3 -> the planner's stages: shared memory at most as
    `grid_onchip_bytes` counts it; LSTM H=1024 B=256 (Triton 3.6) forward 73728 -> 122880 B,
    205 -> 221 registers, 1540 -> 1653 step-loop instructions, backward 36864 -> 98304 B,
    178 -> 188, 1478 -> 1523. One plan for each cell, tile and launch kind of the H200's
    streamed bf16 plans (56): on Triton 3.6 no step loop has more local memory than at 3
    stages. Filling the budget up to 8 stages spilled gated cells' backwards on 64 x 64 /
    64 x 128 tiles, already at 255 registers (local operations per step, 3 -> 8 stages:
    LSTM H=384 B=1024 7 -> 36, GRU 0 -> 19), and moved their 64 x 128 forwards, which spilled
    at 3, both ways: those passes keep the default (_STAGED_TILE). Triton 3.9 spills five
    plans more (kernels/NOTES.md, "Where the weights live")."""
    from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES, stream_stage_bytes

    if (lp.family != "persistent_grid" or not lp.block_k or lp.num_stages
            or _fma_dots(dtype, props)):
        return lp
    budget = _smem_budget(props)
    tile = lp.block_h * lp.block_b

    def stages(pass_name: str) -> int:
        if GATES[cell] > 1 and tile > _STAGED_TILE[pass_name]:
            return DEFAULT_STAGES
        chunk = stream_stage_bytes(cell, H, P, dtype, lp.block_h, lp.block_b, lp.block_k,
                                   pass_name)
        return max(DEFAULT_STAGES, min(_MAX_STAGES, budget // chunk,
                                       1 + -(-_IN_FLIGHT // chunk)))

    fwd, bwd = stages("fwd"), stages("bwd")
    if max(fwd, bwd) == DEFAULT_STAGES:
        return lp
    return _with_stages(lp, cell, H, Hout, P, dtype, fwd, bwd)


def _with_stages(lp: LayerPlan, cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                 fwd: int, bwd: int) -> LayerPlan:
    """`lp` (a grid-family plan with streamed weights) with its forward's streamed loops on
    `fwd` stages and its backward's on `bwd`, onchip_bytes counting them: num_stages = fwd,
    num_stages_bwd = bwd where it differs; both 0 where both are Triton's default (the plan
    then names none, as the planner's own plans on the default)."""
    from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES, grid_onchip_bytes

    if fwd == bwd == DEFAULT_STAGES:
        fwd = bwd = 0
    return replace(
        lp, num_stages=fwd, num_stages_bwd=0 if bwd == fwd else bwd,
        onchip_bytes=grid_onchip_bytes(cell, H, Hout, P, dtype, lp.block_h, lp.block_b,
                                       lp.block_k, fwd_warps=lp.num_warps,
                                       stages=fwd or DEFAULT_STAGES,
                                       stages_bwd=bwd or DEFAULT_STAGES))


def _with_backward_tiles(lp: LayerPlan, cell: str, H: int, Hout: int, P: int,
                         dtype: torch.dtype, block_h: int, block_b: int, batch: int,
                         num_warps_bwd: int, smem_limit: int | None) -> LayerPlan:
    """`lp` (a grid-family plan, resident weights, MMA tiles) with its backward on block_h x
    block_b tiles on num_warps_bwd warps: that backward's gate pairing (`grid_pairs_gates`)
    within smem_limit, num_programs and onchip_bytes the larger of the forward's (as planned,
    which counts a backward on its tiles too) and the new backward's (`_grid_bwd_bytes`)."""
    from tritonrnn.kernels.grid_tiles import _grid_bwd_bytes, grid_pairs_gates, grid_programs

    if (block_h, block_b) == (lp.block_h, lp.block_b):
        return lp.with_backward_warps(num_warps_bwd)
    paired = grid_pairs_gates(cell, H, Hout, P, dtype, block_h, block_b, 0, smem_limit)
    programs = grid_programs(H, Hout, P, batch, block_h, block_b, lp.num_dirs)
    return replace(
        lp, block_h_bwd=block_h, block_b_bwd=block_b, pair_gates=paired,
        num_programs=max(lp.num_programs, programs),
        forward_programs=lp.num_programs if programs > lp.num_programs else 0,
        onchip_bytes=max(lp.onchip_bytes, _grid_bwd_bytes(
            cell, H, Hout, P, dtype, block_h, block_b, num_warps_bwd, paired)),
    ).with_backward_warps(num_warps_bwd)


def _taller_backward(lp: LayerPlan, cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                     batch: int, props: DeviceProperties) -> LayerPlan:
    """The persistent grid's backward on 32 x 16 tiles under a 16 x 32 forward: gated cells,
    resident weights, no projection, batch bucket 64, where the 32 x 16 backward has no more
    programs than the forward and fits the budget; else `lp`. On an H100 / H200 that is LSTM
    / GRU H = 544 to 768, GRU H = 1024 (212992 B), and the pair launches of H = 384 / 512
    (56 of the 7920 plans over four cells, H 64-4096, B 1-1024, three dtypes, one and two
    directions). Half the hidden slices, so each program reads half the exchange's dph
    (G * H rows of 16 columns instead of 32) for twice the weights it reads from shared
    memory per step.

    An H200 timed both tiles in both passes (2026-11-27, the third session,
    `scripts/step_ablation.py` variant `bb16`, layer ms at T = 1024, bf16, B = 64): the
    backward 32 x 16 against 16 x 32, LSTM H=768 9.16 against 9.88 (confirmed 9.16 / 9.96 in a
    second call), GRU 7.06 against 8.12 (7.09 / 8.18); the forward the other way (32 x 16 on 4
    warps 5.70, 4.91; 16 x 32 on 8 warps 5.12, 4.63, `_split_k_on_8`; 32 x 16 on 8 warps does
    not fit). So each pass gets its own tiles (fwd + bwd from those rows about 14.2 and 11.6
    ms against 15.1 and 12.8 on 16 x 32 alone). The sm_90 compiles (Triton 3.6, bf16, 8
    warps): LSTM H=768 backward 1019 -> 840 step-loop instructions, GRU 809 -> 679, no spills,
    212992 / 196608 B of shared memory (GRU's with its gates paired, `grid_pairs_gates`);
    GRU H=1024 867 -> 737 (212992 B); the LSTM H=512 B=64 pair launch's spills stay outside
    the step loop. Not timed as one plan yet, nor at GRU H=1024 or the pairs, nor at other
    batches (B = 128 at H = 256 to 512 has the same tiles; step_ablation `samebwd` restores
    the forward's tiles)."""
    if (lp.family != "persistent_grid" or lp.block_k or P or GATES[cell] == 1
            or (lp.block_h, lp.block_b) != (16, 32) or _bucket(batch) != 64
            or _pow2(H) < 32):
        return lp
    warps = _persistent_grid_bwd_warps(32, 16, cell, 0, dtype, H, Hout, P)
    taller = _with_backward_tiles(lp, cell, H, Hout, P, dtype, 32, 16, batch, warps,
                                  _smem_budget(props))
    fits = (taller.num_programs <= lp.num_programs
            and taller.onchip_bytes <= _smem_budget(props))
    return taller if fits else lp


# Vector tiles (kernels.grid_tiles.vector_tiles): batch buckets up to this size run the
# persistent grid with one batch tile of the bucket's width and the resident products on the
# FMA units, the weights held in registers. A 16-wide MMA tile for one row computes 15/16
# padding, stages h (dph) in shared memory and reads the weight slice from shared memory
# every step (LSTM H=768 B=1, 4 warps, the forward then gate-batched: 96 ldmatrix and 96
# mma.sync per warp and step); the vector tiles' step loop reads no shared memory but the
# compiler's small layout conversions (sm_90 compiles, Triton 3.6, LSTM H=768 block_h=8
# B=1, 8 warps: forward 559 instructions, 85 FFMA, 15 bar.sync, no spills; backward 698;
# the MMA tile: 736 / 1151 at 4 warps, 1093 in the forward before it was gate-batched).
# Bucket 2 stays on MMA tiles: its vector loop (1422 / 1645 instructions at 8 warps) issues
# more than the MMA tile's; bucket 4 more again (2106 / 2414).
# Not yet timed on a GPU: `scripts/step_ablation.py` variant `mma1` restores the MMA tiles
# at B = 1; plan_constraints(block_b=2, block_h=8) forces vector tiles at B = 2.
_VECTOR_BATCH = 1
_VECTOR_WARPS = 8
# Register budget of the weights per thread: the sm_90 compiles (Triton 3.6, bf16, 8 warps,
# B=1) hold 256 B (LSTM H=1024, block_h=8: 207 / 235 registers, no spill) and spill beyond
# (LSTM H=768 block_h=16, 384 B: 7 local loads per backward step; GRU H=1536 block_h=16,
# 576 B: 117 forward, 320 backward).
_VECTOR_THREAD_BYTES = 256


def _vector_fit(cell, H, Hout, P, dtype, batch, props, num_dirs=1) -> LayerPlan | None:
    """The vector-tile persistent grid (batch bucket <= _VECTOR_BATCH): the smallest hidden
    slice (>= 8) whose grid is co-resident and whose weights fit the register budget, or
    None (the MMA tiles then).

    Not on the interpreter preset: there every program of every step runs in NumPy, and the
    vector tiles' slices of 8 and per-column operand tiles make the end-to-end tests several
    times slower (tests force them with plan_constraints instead)."""
    from tritonrnn.kernels.grid_tiles import grid_vector_bytes

    if batch > _VECTOR_BATCH or props.interpreter:
        return None
    for block_h in (8, 16, 32, 64):
        if block_h > max(8, _pow2(H)):
            break
        lp = _grid("persistent_grid", cell, H, Hout, P, dtype, batch, block_h, batch,
                   _VECTOR_WARPS, 0, num_dirs)
        regs = grid_vector_bytes(cell, H, Hout, P, dtype, block_h) // (32 * _VECTOR_WARPS)
        if lp.num_programs <= props.sm_count and regs <= _VECTOR_THREAD_BYTES:
            return lp
    return None


def _persistent_grid_warps(block_h: int, block_b: int, cell: str = "lstm",
                           block_k: int = 0, dtype: torch.dtype = torch.bfloat16,
                           H: int = 0, Hout: int = 0, P: int = 0) -> int:
    """Warps of a persistent-grid forward program: 4 up to a 16 x 32 tile, else 8; 8 on a
    resident 16 x 32 tile (`_split_k_on_8`); 8 on a 16 x 16 tile of shape H
    (Hout, P; 0: unknown, not checked) whose resident weights the kernels hold in registers
    (HOIST, `grid_tiles.hoist_pass`) on 8 warps but not on 4.

    The 16 x 16 rule: on 8 warps each thread holds half the weights, so slices of 257 to
    512 B per thread on 4 warps stay in registers (`grid_tiles.hoist_budget`); the
    step then reads only h's operand from shared memory. The rule is HOIST's default one
    whatever TRITONRNN_HOIST_WEIGHTS says (the switch decides the launches' HOIST, not the
    plan's warps: `off` runs those forwards on 8 warps unhoisted). An H200 timed it
    against 4 warps unhoisted (2026-11-26, `scripts/step_ablation.py` variant `fw8,hoistf`,
    layer forward in ms at T = 1024, bf16): LSTM H=512 B=16 2.88 -> 2.80, H=768 3.24 ->
    3.13, H=1024 3.83 -> 3.34, GRU H=1024 3.34 -> 3.15. Slices that fit on 4 warps stay
    there (LSTM H=256 B=16: hoisted on 4 warps; 8 untimed), and so do those too large for 8
    whose first chunk is too (LSTM H=1152 / 1280: 512 B of it per thread). GRU H=1408 /
    1536 (576 B per thread on 8 warps) hold their first chunk (384 B) in registers on 8
    (`kernels.grid_tiles.Hoist.FIRST`, since 2026-11-28, untimed: the sm_90 forward
    step loop 809 -> 503 instructions and 96 -> 24 ldmatrix per warp against 4 warps
    unhoisted, Triton 3.6, GRU H=1536 B=16, no local memory).

    A step's work per program is small (a [G*16, H] @ [H, <=32] product); more warps only
    lengthen its cross-warp reductions and shared-memory traffic. Measured on an H100
    (bf16, T = 1024, `scripts/step_ablation.py`), forward + backward of the layer, 8 -> 4
    warps: LSTM H=512 B=1 15.9 -> 10.4 ms, H=768 B=16 19.5 -> 14.2, H=768 B=64 (16 x 32
    tiles) 35.5 -> 20.1; GRU H=1024 B=16 17.9 -> 13.2 (before the forward's split cap,
    `kernels.grid_tiles._FWD_GATE_SPLIT`; the 16 x 32 forward won on 8 warps after
    it, `_split_k_on_8`). Larger tiles keep 8 (not measured)."""
    if block_h * block_b > 512:
        return 8
    fma = dtype == torch.float32  # as a GPU runs it
    if _split_k_on_8(block_k, block_h, block_b, fma):
        return 8
    if H and block_h == block_b == 16 and _hoists_on_8_only("fwd", cell, block_k, dtype, H,
                                                             Hout, P):
        return 8
    return 4


def _split_k_on_8(block_k: int, block_h: int, block_b: int, fma: bool) -> bool:
    """Whether a persistent-grid forward runs 8 warps on 16 x 32 tiles: resident weights on
    MMA dots, each gate's product split over K 8 ways (`_nsplit`) where 4 warps ran the
    whole K chain per MMA tile, for every cell.

    An H200 timed it against 4 warps (2026-11-27, the third session, `scripts/
    step_ablation.py` variant `fw8`, layer forward in ms at T = 1024, bf16, B = 64): LSTM
    H=768 5.65 -> 5.06, H=1024 6.84 -> 5.82, GRU H=768 4.87 -> 4.57, H=1024 5.88 -> 5.29,
    rnn_tanh H=1024 4.08 -> 3.81 (the backwards, whose warps it leaves, within 2%). The
    sm_90 compiles (Triton 3.6) halve the step loop (LSTM H=768 1236 -> 767 instructions
    per warp, GRU H=1024 1114 -> 666), the mma.sync per warp 192 -> 96, no spills. On an
    H100 the 8-warp 16 x 32 forward had lost (12.2 against 5.8 ms at LSTM H=768 B=64) when
    its slices were added by tl.sum, before the split cap
    (`kernels.grid_tiles._FWD_GATE_SPLIT`). Streamed weights and fp32's FMA dots keep
    4 (not timed)."""
    return not block_k and not fma and (block_h, block_b) == (16, 32)


def _persistent_grid_bwd_warps(block_h: int, block_b: int, cell: str = "lstm",
                               block_k: int = 0, dtype: torch.dtype = torch.bfloat16,
                               H: int = 0, Hout: int = 0, P: int = 0) -> int:
    """Warps of a persistent-grid backward program: 4 below a 16 x 32 tile, else 8; and 8 on
    a 16 x 16 tile of shape H (Hout, P; 0: unknown, not checked) whose resident weights
    (R^T's columns) the kernels hold in registers (HOIST, `grid_tiles.hoist_pass`) on 8
    warps but not on 4, as the forward's rule (`_persistent_grid_warps`).

    The 16 x 16 rule: an H200 timed the backward hoisted on 8 warps against 4 unhoisted
    (2026-11-27, `scripts/step_ablation.py` variant `hoist,bw8`, layer backward in ms at
    T = 1024, bf16, the paired gates on): LSTM H=512 B=16 4.62 -> 4.14, H=768 5.55 -> 5.13,
    H=1024 7.08 -> 6.07, GRU H=1024 5.59 -> 5.05. Unhoisted, 8 warps gained less or lost
    (`bw8`: LSTM H=512 4.14, GRU H=1024 5.53; the anchor 5.56 -> 5.85 the session before),
    as they had on an H100 before the weights were hoisted (2026-11-22, 8 -> 4 warps: LSTM
    H=768 B=16 7.2 -> 6.5 ms, GRU H=1024 B=16 6.6 -> 5.9).
    The sm_90 compiles (Triton 3.6, `tritonrnn aot`) keep the hoisted 8-warp backwards free
    of local memory in the step loop (the anchor's 1043 -> 617 instructions, 96 -> 48
    mma.sync per warp). Weights that fit 4 warps' budget stay there (LSTM H=256 B=16), and
    so do plans with a projection (not hoisted).
    Resident weights too large for either (`_too_large_to_hoist`; on 16 x 16 tiles LSTM H =
    1152 and 1280, bf16 / fp16, B <= 16; GRU H = 1408 and 1536 were too until their first
    chunk stayed in registers on 8 warps, `kernels.grid_tiles.Hoist.FIRST`) run 8
    warps unhoisted: on 4 their
    sm_90 backwards spilled in the step loop (Triton 3.6, bf16, B = 16, stack bytes, local
    loads per step, instructions: LSTM H=1152 40 B, 10, 1360; H=1280 72 B, 17, 1506; GRU
    H=1408 64 B, 15, 1370; H=1536 40 B, 10, 1336; the same at B = 1), on 8 none (769, 856,
    761, 764 instructions; Triton 3.9 none either, where LSTM H=1280 on 4 spilled 7 per
    step). Not yet timed on a GPU (step_ablation `bw4` restores 4); unhoisted, 8 warps had
    timed about even with 4 at smaller H (above).

    At 16 x 32 the backward's [block_h, block_b] output has 4 MMA tiles, so 4 warps run a
    plain dot, each warp the whole K = G*H chain, where 8 split K in 8 (`_nsplit`).
    Measured on an H100 (bf16, T = 1024, `scripts/step_ablation.py` layer times), LSTM H=768
    B=64 backward: 12.8 ms with 8 warps, 14.3 with 4 (the forward: 4 warps 5.8 ms, 8 warps
    12.2). The sm_90 compiles agree (Triton 3.6, `tritonrnn aot`): with 4 warps the 16 x 32
    backward spills (LSTM H=768 248 B per thread, 69 local loads per step), with 8 it does
    not."""
    if block_h * block_b >= 512:
        return 8
    if H and block_h == block_b == 16 and (
        _hoists_on_8_only("bwd", cell, block_k, dtype, H, Hout, P)
        or _too_large_to_hoist("bwd", cell, block_k, dtype, H, Hout, P)
    ):
        return 8
    return 4


def _too_large_to_hoist(pass_name: str, cell: str, block_k: int, dtype: torch.dtype, H: int,
                        Hout: int, P: int) -> bool:
    """Whether a persistent 16 x 16 launch of `pass_name` of shape H with resident weights and
    no projection holds them in registers by HOIST's default rule on neither 4 nor 8 warps
    (float32 aside: it runs FMA dots, streamed on a GPU)."""
    if block_k or P or dtype == torch.float32:
        return False
    return not any(_hoists_16x16(pass_name, cell, block_k, dtype, H, Hout, P, w)
                   for w in (4, 8))


def _hoists_on_8_only(pass_name: str, cell: str, block_k: int, dtype: torch.dtype, H: int,
                      Hout: int, P: int) -> bool:
    """Whether a persistent 16 x 16 launch of `pass_name` of shape H (Hout: 0 for H) holds
    its resident weights in registers by HOIST's default rule (`hoist_pass`) on 8 warps and
    not on 4: the 16 x 16 warps rule of both passes."""
    return (_hoists_16x16(pass_name, cell, block_k, dtype, H, Hout, P, 8)
            and not _hoists_16x16(pass_name, cell, block_k, dtype, H, Hout, P, 4))


def _hoists_16x16(pass_name: str, cell: str, block_k: int, dtype: torch.dtype, H: int,
                  Hout: int, P: int, num_warps: int) -> bool:
    """HOIST's default rule (`hoist_pass`) for a persistent 16 x 16 launch of `pass_name` of
    shape H (Hout: 0 for H) on num_warps."""
    from tritonrnn.kernels.grid_tiles import hoist_pass

    return hoist_pass(pass_name, cell, H, Hout or H, P, dtype, 16, 16, block_k, num_warps,
                      True, by_default=True)


def _grid_block_h(cell, H, Hout, P, dtype, block_b, batch, props) -> int:
    """Smallest power-of-two hidden slice whose grid is co-resident (<= SMs)."""
    block_h = 16
    while block_h < _pow2(H):
        if _grid("persistent_grid", cell, H, Hout, P, dtype, block_b, block_h, batch,
                 4).num_programs <= props.sm_count:
            break
        block_h *= 2
    return block_h


def _switch_state() -> tuple:
    """The kernel switches' values (`_VARIANT_GLOBALS`), as a cache key: the on-chip formulas
    the heuristic fits plans with read some of them (`grid_pairs_gates`, `grid_onchip_bytes`),
    and tests and ablations set them in-process."""
    from tritonrnn.kernels import grid_tiles, split_k

    modules = {"grid_tiles": grid_tiles, "split_k": split_k}
    return tuple(getattr(modules[module], name) for module, name, _ in _VARIANT_GLOBALS)


def clear_plan_caches() -> None:
    """Empties the planner's caches of plans and heuristic choices, whose keys hold the kernel
    switches but not a launch rule replaced in-process (tests, ablations, the fuzz script)."""
    _plan_cached.cache_clear()
    _heuristic_cached.cache_clear()


def _heuristic(cell, H, Hout, P, dtype, batch_bucket, props, num_dirs=1) -> LayerPlan:
    """The planner's own plan for one recurrence (no constraints, no tuning entry), cached by
    its arguments and the kernel switches (`_switch_state`)."""
    return _heuristic_cached(cell, H, Hout, P, dtype, batch_bucket, props, num_dirs,
                             _switch_state())


@functools.lru_cache(maxsize=4096)
def _heuristic_cached(cell, H, Hout, P, dtype, batch_bucket, props, num_dirs,
                      _switches: tuple) -> LayerPlan:
    if dtype == torch.float64:
        return LayerPlan("reference")
    if _cta_fits(cell, H, Hout, P, dtype, props):
        return _cta(cell, H, Hout, P, dtype, 16, batch_bucket, _CTA_WARPS, num_dirs)
    return _split_heuristic(cell, H, Hout, P, dtype, batch_bucket, props, num_dirs)


def _split_heuristic(cell, H, Hout, P, dtype, batch_bucket, props, num_dirs=1) -> LayerPlan:
    """The heuristic among the families that split R over programs (vector tiles, the
    persistent grid resident then streamed, stepwise): `_heuristic` past the CTA."""
    # A pair launch (both directions, one barrier each) first; else each direction alone.
    for dirs in sorted({num_dirs, 1}, reverse=True):
        vec = _vector_fit(cell, H, Hout, P, dtype, batch_bucket, props, dirs)
        if vec is not None:
            return vec
    for block_k in _weight_layouts(dtype, props):
        for dirs in sorted({num_dirs, 1}, reverse=True):
            grid = _grid_fit(cell, H, Hout, P, dtype, batch_bucket, props, block_k, dirs)
            if grid is not None:
                return grid
    return _stepwise_fit(cell, H, Hout, P, dtype, batch_bucket, props, num_dirs)


def _stepwise_traffic(G: int, block_h: int, block_b: int) -> float:
    """L2 bytes a stepwise step (forward and backward) reads per B * H * Hout element pair
    with these tiles, up to the dtype's size: every batch tile reads the weights (R in the
    forward, R^T in the backward: 2G / block_b), every hidden slice reads the step's h (1 /
    block_h) and the backward's dph over all G gates (G / block_h)."""
    return 2 * G / block_b + (1 + G) / block_h


def _stepwise_plan(cell, H, Hout, P, dtype, block_b, block_h, batch, block_k, num_dirs,
                   budget) -> LayerPlan:
    """A stepwise plan on its rule's warps (no hoisted weights): 8 where its 4-warp
    footprint or tile is large (`_grid_warps`), else 4, both passes."""
    lp = _grid("stepwise", cell, H, Hout, P, dtype, block_b, block_h, batch, 4, block_k,
               num_dirs, budget)
    warps = _grid_warps(lp.onchip_bytes, block_h, block_b)
    if warps == 4:
        return lp
    # (the forward's warps decide its gate layout, so its bytes)
    return _grid("stepwise", cell, H, Hout, P, dtype, block_b, block_h, batch, warps, block_k,
                 num_dirs, budget)


def _stepwise_fit(cell, H, Hout, P, dtype, batch, props, num_dirs=1,
                  below: int | None = None) -> LayerPlan:
    """Stepwise tiles: those that read the fewest L2 bytes per step (`_stepwise_traffic`),
    each with its weight slice resident (staged on chip for the step) where it fits in shared
    memory, else streamed in chunks of _STREAM_K columns (a few KiB per program: fits at any
    H, so this family never fails); at equal bytes resident first. `below`: only tiles whose
    estimate is under that many bytes (`smaller_choice`); where none is, the 16 x 16
    streamed tiles.

    A launch runs one step, so a resident slice is read from L2 once per launch exactly as a
    streamed one is: residency saves no bytes here, while a small tile multiplies them
    (weights once per batch tile, h and dph once per hidden slice). GRU H=1536 B=1024 bf16 on
    an H100: 16 x 16 tiles resident (the first to fit, before this rule) read 4x the bytes
    of 64 x 64 streamed ones (0.625 against 0.156). The sm_90 compiles (Triton 3.6, bf16) of
    the old choices spilled at 7 of 11 shapes past the grid (rnn_tanh H=2048 B=1024, 32 x 32:
    10032 B per thread in the backward), the 64 x 64 streamed ones at none, on wgmma; 3.9
    spills their LSTM forward (80 B, 12 local loads; the old 16 x 64 tiles 352 / 560 B). Not
    yet timed on a GPU (`scripts/step_ablation.py` variant `sw64`).

    float32 on a GPU streams from the start (`_weight_layouts`), in hidden slices of at most
    32: its FMA dots hold a thread's rows of a 64-column chunk in registers, and 64-unit
    slices spilled (sm_90 compiles, Triton 3.6, 8 warps, forward: LSTM H=1536 B=256 at 64 x
    32 tiles 136 B, 33 local loads per step; GRU H=2048 B=256 64 B, 11; at 32 x 64 tiles
    neither spills)."""
    from tritonrnn.kernels.grid_tiles import resident_operands_fit

    budget = _smem_budget(props)
    slices = (32, 16) if _fma_dots(dtype, props) else (64, 32, 16)
    G = GATES[cell]
    best = None
    for block_k in _weight_layouts(dtype, props):
        for block_h in slices:
            for block_b in (64, 32, 16):
                if block_b > max(16, _pow2(batch)) or block_h > max(16, _pow2(H)):
                    continue
                if not block_k and not resident_operands_fit(H, Hout, block_b):
                    continue  # (as the persistent grid's: streamed instead)
                lp = _stepwise_plan(cell, H, Hout, P, dtype, block_b, block_h, batch,
                                    block_k, num_dirs, budget)
                if below is not None and lp.onchip_bytes >= below:
                    continue
                if (props.interpreter or lp.onchip_bytes <= budget) and (
                    best is None or _stepwise_traffic(G, block_h, block_b)
                    < _stepwise_traffic(G, best.block_h, best.block_b)
                ):
                    best = lp
    if best is not None:
        return best
    return _grid("stepwise", cell, H, Hout, P, dtype, 16, 16, batch, 4, _STREAM_K, num_dirs)


def _apply(base: LayerPlan, choice: dict, cell, H, Hout, P, dtype, batch, props,
           num_dirs: int = 1, where: str = "plan_constraints") -> LayerPlan:
    """The heuristic choice with `choice` (constraints or a tuning entry) applied: its tiles
    and warps (`_apply_tiles`), then its backward (`_with_split_k`). Raises ValueError, its
    message starting with `where`, when the choice cannot apply to the shape on the device:
    a tile or warps the family has no use for, a split-K backward without tiles, or a plan
    that does not fit (shared memory, co-resident programs; not checked on the interpreter
    preset)."""
    lp = _apply_tiles(base, choice, cell, H, Hout, P, dtype, batch, props, num_dirs, where)
    return _with_split_k(lp, choice, cell, H, P, dtype, batch, props, where)


# The split-K backward's rule (`_split_k_rule`): (cell, H, batch bucket) -> form, where an
# H200 timed that form faster than the plan's own backward in the layer (bf16, T = 1024, one
# layer, fwd + bwd through the ops; `scripts/step_ablation.py` set `splitk`, 2026-11-29,
# bench/results/step-ablation-nvidia-h200-2026-11-29-splitk.json; backward ms, own -> split):
#   LSTM H=1024 B=16  one barrier   5.79 -> 5.12 (0.93x the layer; two barriers 6.26, 1.05x)
#   LSTM H=1024 B=64  two barriers 13.15 -> 12.70 (0.98x)
#   GRU  H=1536 B=16  two barriers  7.52 -> 6.94 (0.95x; no one-barrier tiles there)
# and not where it lost: LSTM H=768 B=64 / 256 (1.19 / 1.16x), GRU H=1024 B=16 (two barriers
# 1.13x, one 1.22x) and B=64 (1.18x). LSTM H=1024 B=256 timed 0.98x too (33.74 -> 32.94),
# but its sm_90 compile spills in the step loop (Triton 3.6: 120 B a thread; the 20 local
# loads a step reload loop-invariant addresses from L1, kernels/NOTES.md, none on 3.9),
# which the planner's plans do not (`tritonrnn aot` flags it): left out until a second
# timing (step_ablation `confirm`), as the shapes between are (LSTM H=1024 B=32 / 128, GRU
# H=1536 B=32, other H: untimed), with the family's own backward.
# Each entry: the form and the tiles it ran on there ((units, kblock, btile): `kernels.
# split_k.form_tiles` on the H200, as on the H100 preset), which the device must give the
# form for the rule to apply (an sm_90 part with fewer SMs gets other, untimed tiles).
_SPLIT_K_RULE = {("lstm", 1024, 16): (1, (256, 128, 16)),
                 ("lstm", 1024, 64): (2, (64, 512, 64)),
                 ("gru", 1536, 16): (2, (128, 512, 16))}


def _split_k_rule(lp: LayerPlan, cell: str, H: int, P: int, dtype: torch.dtype, batch: int,
                  props: DeviceProperties) -> int:
    """The split-K form (`_SPLIT_K_RULE`) for the heuristic's plan lp of a recurrence, or 0
    (the family's own backward). Only as timed: a persistent-grid plan of one direction
    per launch (a pair launch would split into two split-K launches, untimed) without a
    projection, 16-bit (the timed bf16 and fp16, which compiles to the same tiles and MMAs),
    on an sm_90 device (the H100 / H200: the same SMs, shared memory and co-residency),
    where the form's tiles on that device (`kernels.split_k.form_tiles`) are the timed
    ones. Its launch may take more programs than the forward (LSTM H=1024 B=16: 128 against
    64); the layer pipeline bounds each pass's layers in flight by that pass's programs
    (`pipeline.concurrent_layers`), so the forward keeps its overlap."""
    from tritonrnn.kernels import split_k

    form, timed = _SPLIT_K_RULE.get((cell, H, batch), (0, None))
    if (not form or lp.family != "persistent_grid" or lp.num_dirs != 1 or P
            or dtype not in (torch.bfloat16, torch.float16) or props.interpreter
            or props.arch // 10 != 9):
        return 0
    launch = split_k.form_tiles(form, cell, H, batch, dtype, props)
    return form if launch is not None and tuple(launch[:3]) == timed else 0


def _with_split_k(lp: LayerPlan, choice: dict, cell: str, H: int, P: int, dtype: torch.dtype,
                  batch: int, props: DeviceProperties,
                  where: str = "plan_constraints", ruled: bool = False) -> LayerPlan:
    """lp with the backward that `choice` names (split_k_bwd: 0 the family's own, 1 / 2 the
    split-K backward's one- / two-barrier form), or where it names none (the heuristic's
    plan, constraints that do not mention it, a tuning entry from before the key) the form
    the switches give a grid family's backward without a projection
    (`kernels.split_k.switched_form`), unless the choice names the backward's own tiles or
    stages; where no switch gives one and ruled (the heuristic's own plan, `choice` empty),
    the rule's form (`_split_k_rule`). A split-K plan keeps its forward; its backward runs
    on the tiles the form's rule picks at the batch bucket (`split_k_launch`) with
    num_warps_bwd (default `kernels.split_k.NUM_WARPS`; forced num_warps apply to both
    passes, as elsewhere), forward_programs is the forward's where that launch has more,
    and num_programs and onchip_bytes are the larger of the forward's (`grid_programs`,
    `grid_onchip_bytes(backward=False)`) and that launch's: the layer pipeline's
    co-residency bound (`pipeline.concurrent_layers`) sees them. Raises ValueError where a
    named form cannot apply: a family other than the grid families, a projection, the backward's own
    tiles or stages named beside it, or no tiles on the device."""
    from tritonrnn.kernels import split_k

    bwd_own = [k for k in ("block_h_bwd", "block_b_bwd", "num_stages_bwd") if k in choice]
    form = choice.get("split_k_bwd")
    if form is None:
        if lp.family not in ("persistent_grid", "stepwise") or P or bwd_own:
            return lp
        form = split_k.switched_form(cell, H, batch, dtype, props)
        if not form and ruled:
            form = _split_k_rule(lp, cell, H, P, dtype, batch, props)
    if not form:
        return lp
    how = "" if "family" in choice else " (the heuristic's family for this shape)"
    name = f"split_k_bwd = {form}"
    if lp.family not in ("persistent_grid", "stepwise"):
        raise ValueError(f"{where}: {name} cannot apply to family {lp.family!r}{how}: the "
                         f"split-K backward runs a persistent-grid or stepwise plan's backward")
    if P:
        raise ValueError(f"{where}: {name} needs a layer without a projection (num_proj = "
                         f"0), got num_proj = {P}")
    if bwd_own:
        raise ValueError(f"{where}: {bwd_own[0]} = {choice[bwd_own[0]]} cannot apply with "
                         f"{name}: the split-K backward runs the tiles its rule picks, with "
                         f"resident weights")
    launch = split_k.form_tiles(form, cell, H, batch, dtype, props)
    if launch is None:
        rule = (f"split_k1_tiles`: power-of-two unit blocks and K blocks of >= 16 units that "
                f"divide H, B <= {split_k.ONE_BARRIER_BATCH}" if form == split_k.ONE_BARRIER
                else "split_k_tiles`: power-of-two unit blocks that divide H and K blocks of "
                     ">= 64 gate rows that divide the G*H")
        raise ValueError(
            f"{where}: {name} has no tiles for {cell} H={H} {dtype} batch bucket {batch} on "
            f"{props.name} (`kernels.split_k.{rule}, on at most {props.sm_count} programs "
            f"within its shared memory)")
    from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES, grid_onchip_bytes, grid_programs

    programs, onchip = split_k.footprint(cell, H, batch, dtype, launch)
    fwd_programs = grid_programs(H, H, 0, batch, lp.block_h, lp.block_b, lp.num_dirs)
    fwd_onchip = grid_onchip_bytes(cell, H, H, 0, dtype, lp.block_h, lp.block_b, lp.block_k,
                                   fwd_warps=lp.num_warps,
                                   stages=lp.num_stages or DEFAULT_STAGES, backward=False)
    warps = choice.get("num_warps_bwd", choice.get("num_warps", split_k.NUM_WARPS))
    return replace(lp, split_k_bwd=form, block_h_bwd=0, block_b_bwd=0, num_stages_bwd=0,
                   pair_gates=False, num_programs=max(fwd_programs, programs),
                   forward_programs=fwd_programs if programs > fwd_programs else 0,
                   onchip_bytes=max(fwd_onchip, onchip)).with_backward_warps(warps)


def split_k_launch(lp: LayerPlan, cell: str, H: int, batch: int, dtype: torch.dtype,
                   props: DeviceProperties):
    """The split-K launch (`kernels.split_k.SplitK`) of lp's backward at `batch`, on the
    tiles planned for its bucket, or None where lp runs its family's own backward."""
    if not lp.split_k_bwd:
        return None
    from tritonrnn.kernels.split_k import form_tiles

    launch = form_tiles(lp.split_k_bwd, cell, H, _bucket(batch), dtype, props)
    if launch is None:  # a plan made for another device or shape
        raise ValueError(f"split_k_bwd = {lp.split_k_bwd} has no tiles for {cell} H={H} "
                         f"{dtype} B={batch} on {props.name}")
    return launch


def _apply_tiles(base: LayerPlan, choice: dict, cell, H, Hout, P, dtype, batch, props,
                 num_dirs: int = 1, where: str = "plan_constraints") -> LayerPlan:
    """`_apply`'s tiles and warps (everything but split_k_bwd)."""
    family = choice.get("family", base.family)
    # A family the choice did not name is the heuristic's: say so where it is refused.
    how = "" if "family" in choice else " (the heuristic's family for this shape)"
    if family == "reference" or dtype == torch.float64:
        if family != "reference":
            raise ValueError(
                f"{where}: family {family!r} cannot run float64 (Triton kernels run "
                f"fp32/fp16/bf16); use family='reference'"
            )
        tiles = [k for k in _CONSTRAINT_KEYS if k not in ("family", "split_k_bwd")
                 and k in choice]
        if tiles:
            raise ValueError(
                f"{where}: {tiles[0]} = {choice[tiles[0]]} cannot apply to family "
                f"'reference'{how}: the pure-PyTorch recurrence has no tiles or warps"
            )
        return LayerPlan("reference")
    block_b = choice.get("block_b", base.block_b)
    from tritonrnn.kernels.grid_tiles import vector_tiles

    vector = vector_tiles(base.block_b)
    if "block_b" not in choice and vector and (
        family == "persistent_cta" or choice.get("block_k", 0)
    ):
        block_b = 16  # a vector-tile heuristic forced elsewhere: back to MMA tiles
    if vector_tiles(block_b) and (family == "persistent_cta" or choice.get("block_k", 0)):
        raise ValueError(
            f"{where}: block_b = {block_b} (vector tiles) needs resident weights "
            f"(block_k = 0) and family 'persistent_grid' or 'stepwise', got family "
            f"{family!r}, block_k = {choice.get('block_k', 0)}"
        )
    num_warps = choice.get("num_warps", base.num_warps)
    # Forced warps apply to both passes unless the backward's are given too.
    bwd = choice.get("num_warps_bwd", num_warps if "num_warps" in choice
                     else base.backward_warps)
    if family == "persistent_cta":
        from tritonrnn.kernels.persistent_cta import cta_onchip_parts

        tiles = [k for k in ("block_h", "block_k", "block_h_bwd", "block_b_bwd", "num_stages",
                             "num_stages_bwd") if choice.get(k)]  # block_k = 0: resident
        if tiles:
            raise ValueError(
                f"{where}: {tiles[0]} = {choice[tiles[0]]} cannot apply to family "
                f"'persistent_cta'{how}: its one program per batch tile holds all of R on "
                f"chip, with no hidden slices (block_h) and no streamed weights (block_k, "
                f"num_stages); force family 'persistent_grid' or 'stepwise' with it"
            )
        # Forced on another family's plan: the CTA's own warps, not that family's tile rule.
        if "num_warps" not in choice and base.family != "persistent_cta":
            num_warps = _CTA_WARPS
        # One program per batch tile: its backward keeps the forward's warps unless asked.
        plan = _cta(cell, H, Hout, P, dtype, block_b, batch, num_warps,
                    num_dirs).with_backward_warps(choice.get("num_warps_bwd", num_warps))
        smem = cta_onchip_parts(cell, H, Hout, P, dtype, block_b).smem
        if not props.interpreter and smem > props.smem_per_program:
            raise ValueError(
                f"{where}: family 'persistent_cta' needs {smem} bytes of shared "
                f"memory for H={H}, Hout={Hout}, {dtype}; {props.name} allows "
                f"{props.smem_per_program} per program"
            )
        return plan
    block_h = choice.get("block_h", base.block_h or _grid_block_h(
        cell, H, Hout, P, dtype, block_b, batch, props))
    if "block_h" not in choice and not vector_tiles(block_b) and block_h < 16:
        block_h = _grid_block_h(cell, H, Hout, P, dtype, block_b, batch, props)
    if not vector_tiles(block_b) and block_h < 16:
        raise ValueError(
            f"{where}: block_h = {block_h} needs vector tiles (block_b 1, 2 or "
            f"4); MMA tiles (block_b = {block_b}) take block_h >= 16"
        )
    # Vector tiles hold their weights resident (checked above where block_k is named): forced
    # on a heuristic that streams them, resident.
    block_k = choice.get("block_k", 0 if vector_tiles(block_b) else base.block_k)
    retiled = any(k in choice for k in ("block_h", "block_b", "block_k"))
    if "num_warps" not in choice and (retiled or family != base.family
                                      or vector != vector_tiles(block_b)):
        # Other tiles or another family than the heuristic's (whose warps are its own tiles'
        # and family's: the CTA's are its one program's): the warps of the rule for the
        # tiles and family that run, as the heuristic would give them there. Vector tiles:
        # `_VECTOR_WARPS` (`_vector_fit`); stepwise MMA tiles: the stepwise rule's
        # (`_stepwise_plan`, as `_stepwise_fit`); the grid's: its warp rules.
        if vector_tiles(block_b):
            num_warps = _VECTOR_WARPS
            bwd = choice.get("num_warps_bwd", num_warps)
        elif family == "stepwise":
            num_warps = _stepwise_plan(cell, H, Hout, P, dtype, block_b, block_h, batch,
                                       block_k, num_dirs, _smem_budget(props)).num_warps
            bwd = choice.get("num_warps_bwd", num_warps)
        else:
            num_warps = _persistent_grid_warps(block_h, block_b, cell, block_k, dtype, H,
                                               Hout, P)
            bwd = choice.get("num_warps_bwd", _persistent_grid_bwd_warps(
                block_h, block_b, cell, block_k, dtype, H, Hout, P))
    # The backward's own tiles: forced, else the heuristic's where the choice keeps its
    # family and tiles (forced tiles apply to both passes).
    bwd_tiles = ("block_h_bwd" in choice or "block_b_bwd" in choice or (
        family == base.family and not retiled and base.own_backward_tiles))
    if bwd_tiles:
        bwd_h = choice.get("block_h_bwd", base.backward_block_h if not retiled else block_h)
        bwd_b = choice.get("block_b_bwd", base.backward_block_b if not retiled else block_b)
        if block_k or vector_tiles(block_b) or family not in ("persistent_grid", "stepwise"):
            raise ValueError(
                f"{where}: the backward's own tiles (block_h_bwd = {bwd_h}, block_b_bwd = "
                f"{bwd_b}) need resident weights (block_k = 0) on MMA tiles (block_b >= 16) "
                f"of family 'persistent_grid' or 'stepwise', got family {family!r}, "
                f"block_k = {block_k}, block_b = {block_b}"
            )
        if "num_warps_bwd" not in choice and "num_warps" not in choice:
            bwd = _persistent_grid_bwd_warps(bwd_h, bwd_b, cell, 0, dtype, H, Hout, P)

    # The streamed loops' stages: forced (num_stages both passes unless num_stages_bwd is
    # given too; num_stages_bwd alone keeps the forward's as `_stream_stages` gives them),
    # else `_stream_stages`'s.
    stages = [k for k in ("num_stages", "num_stages_bwd") if k in choice]
    if stages and not block_k:
        raise ValueError(
            f"{where}: {stages[0]} = {choice[stages[0]]} needs streamed weights (block_k > "
            f"0: the stages of the loop over their chunks), got block_k = 0 (resident)"
        )
    from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES

    def planned(dirs: int) -> LayerPlan:
        lp = _grid(family, cell, H, Hout, P, dtype, block_b, block_h, batch, num_warps,
                   block_k, dirs, _smem_budget(props))
        if bwd_tiles:
            lp = _with_backward_tiles(lp, cell, H, Hout, P, dtype, bwd_h, bwd_b, batch, bwd,
                                      _smem_budget(props))
        ruled = _stream_stages(lp, cell, H, Hout, P, dtype, props)
        if not stages:
            return ruled
        fwd = choice.get("num_stages", ruled.num_stages or DEFAULT_STAGES)
        return _with_stages(lp, cell, H, Hout, P, dtype, fwd, choice.get("num_stages_bwd", fwd))

    plan = planned(num_dirs)
    if family == "persistent_grid" and plan.num_programs > props.sm_count and num_dirs == 2:
        # The pair does not fit together: each direction gets its own launch.
        plan = planned(1)
    if family == "persistent_grid" and plan.num_programs > props.sm_count:
        bwd_note = (f" (backward block_h={plan.backward_block_h}, "
                    f"block_b={plan.backward_block_b})" if plan.own_backward_tiles else "")
        raise ValueError(
            f"{where}: family 'persistent_grid' needs {plan.num_programs} "
            f"co-resident programs for H={H}, block_h={block_h}, block_b={block_b}, batch "
            f"bucket {batch}{bwd_note}; "
            f"{props.name} has {props.sm_count} SMs"
        )
    # Both grid families stage their weight slice (or a streamed chunk's tiles) in shared
    # memory: a stepwise program over the budget fails at launch as a grid program would.
    if not props.interpreter and plan.onchip_bytes > _smem_budget(props):
        staged = (f", num_stages={plan.num_stages} (backward {plan.backward_stages})"
                  if plan.num_stages else "")
        raise ValueError(
            f"{where}: family {family!r} needs {plan.onchip_bytes} bytes on chip per "
            f"program for H={H}, block_h={block_h}, block_b={block_b}, block_k={block_k}"
            f"{staged}, {dtype}; {props.name} allows {_smem_budget(props)}"
        )
    return plan.with_backward_warps(bwd)


def recurrence_choice(
    cell: str, H: int, Hout: int, P: int, dtype: torch.dtype, batch: int,
    props: DeviceProperties, num_dirs: int = 1,
) -> tuple[LayerPlan, str]:
    """(LayerPlan, source) for one recurrence; source is heuristic, tuned (with ", partial:
    best of M of N candidates" for an entry `tritonrnn tune --max-candidates` left to carry
    on) or constrained. Forced choices that cannot apply raise ValueError (`_apply`); a
    tuning entry that cannot is ignored with a warning, and the source is then heuristic.

    num_dirs = 2 plans a bidirectional layer whose directions share each launch: the grid
    counts both directions' programs (LayerPlan.num_dirs says whether the pair fits together;
    1 means each direction gets its own launch)."""
    bucket = _bucket(batch)
    key = recurrence_key(cell, H, P, dtype, batch, props, num_dirs)
    base = _heuristic(cell, H, Hout, P, dtype, bucket, props, num_dirs)
    forced = {k: v for k, v in _constraints.get() if k in _CONSTRAINT_KEYS}
    args = (cell, H, Hout, P, dtype, bucket, props, num_dirs)
    if forced:
        return _apply(base, forced, *args), "constrained"
    entry = tuning_entry(key)
    if entry:
        try:
            lp = _apply(base, entry, *args, where=f"tuning cache entry {key!r}")
        except ValueError as e:  # e.g. a CTA entry whose weights no longer fit the estimate
            warnings.warn(f"tritonrnn: {e} (ignored: the planner's heuristic runs)",
                          RuntimeWarning, stacklevel=2)
        else:
            source = "tuned" if tuning_complete(entry) else (
                f"tuned, partial: best of {entry['measured']} of {entry['candidates']} "
                f"candidates")
            return lp, source
    # (the heuristic's backward: the switches' split-K form where one is on, else the rule's)
    return _with_split_k(base, {}, cell, H, P, dtype, bucket, props, ruled=True), "heuristic"


def smaller_choice(lp: LayerPlan, cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                   batch: int, props: DeviceProperties, num_dirs: int = 1) -> LayerPlan | None:
    """The plan to run instead of `lp` when its compiled kernel needs more of the device than
    the device has (Triton's OutOfResources at launch), or None when nothing smaller exists.

    The on-chip estimates that the fit decisions rest on are calibrated on the sm_90 compiles
    of the GPU machines' Triton (3.6); another compiler can take more. Triton 3.4's backward
    of the persistent CTA did at LSTM H=128 B=16 bf16: 241920 B of shared memory against
    196612 B on 3.6 and the H100's 232448 (`tritonrnn aot`). The answer is the first of these
    candidates whose estimate is below `lp`'s: for the persistent CTA, the families that split
    R (`_split_heuristic`, then on Triton's default stages where it streams on more); for
    streamed weights on more than Triton's default stages
    (`_stream_stages`), the same plan on the default; for a persistent grid with resident
    weights, the grid with the weights streamed in chunks of _STREAM_K columns where it is
    co-resident (on its stages, then on the default); for every family,
    the stepwise tiles that read the fewest L2 bytes per step among those whose estimate is
    below `lp`'s (`_stepwise_fit`), down to 16 x 16 streamed tiles (a few KiB per program,
    which fits at any H): 64 x 64 tiles read a quarter of 16 x 16 tiles' bytes. Each step
    needs less on chip than the one before (a streamed chunk's multi-buffered tiles can take
    more than a small resident slice: such a candidate is passed over), so they end. A plan
    whose backward is the split-K kernel's (LayerPlan.split_k_bwd) is first replaced by its
    forward with its family's own backward, whatever its estimate: the heuristic's plan where
    that forward is the heuristic's, else that forward forced (its backward on the forward's
    warps). No answer goes back to split-K, so they still end; where the refused kernel was
    the forward, that plan's is refused again and the ladder goes on from there."""
    bucket = _bucket(batch)
    if lp.family not in ("persistent_cta", "persistent_grid", "stepwise"):
        return None
    if lp.split_k_bwd:
        base = _heuristic(cell, H, Hout, P, dtype, bucket, props, num_dirs)
        own = base.choice()
        forward = {k: v for k, v in lp.choice().items()
                   if k in _FORWARD_KEYS and v != own.get(k)}
        return _apply(base, {**forward, "split_k_bwd": 0}, cell, H, Hout, P, dtype, bucket,
                      props, num_dirs)
    from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES

    def with_default_stages(c: LayerPlan | None) -> list[LayerPlan | None]:
        """c, then c on Triton's default stages where it names more."""
        if c is None or not (c.block_k and c.num_stages):
            return [c]
        return [c, _with_stages(c, cell, H, Hout, P, dtype, DEFAULT_STAGES, DEFAULT_STAGES)]

    candidates = []
    if lp.family == "persistent_cta":
        candidates += with_default_stages(
            _split_heuristic(cell, H, Hout, P, dtype, bucket, props, num_dirs))
    candidates += with_default_stages(lp)[1:]
    if lp.family == "persistent_grid" and lp.block_k == 0:
        for dirs in sorted({num_dirs, 1}, reverse=True):
            candidates += with_default_stages(
                _grid_fit(cell, H, Hout, P, dtype, bucket, props, _STREAM_K, dirs))
    candidates.append(_stepwise_fit(cell, H, Hout, P, dtype, bucket, props, num_dirs,
                                    below=lp.onchip_bytes))
    return next((c for c in candidates
                 if c is not None and c.onchip_bytes < lp.onchip_bytes), None)


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    phase: str  # "forward", "backward", "reserve" (forward -> backward), "tensorarray"


@dataclass(frozen=True)
class Plan:
    """Everything decided before a training step runs (sizes at N = B*T, all valid)."""

    key: str
    rnn_mode: str
    input_size: int
    num_units: int
    num_layers: int
    num_dirs: int
    num_proj: int
    batch: int
    max_time: int
    dtype: str
    device: DeviceProperties
    layers: tuple[LayerPlan, ...]  # per pseudo-layer l*D + d
    source: str
    buffers: tuple[Buffer, ...] = field(default=())
    # The layer-pipeline decision at T = max_time for the Triton backend (pipeline.decide);
    # when pipelined, `buffers` are the pipelined run's (extra ones named "pipeline.*").
    pipeline: Decision | None = None

    @property
    def reserve_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b.phase == "reserve")

    @property
    def peak_bytes(self) -> int:
        """Reserve plus the larger of the forward and backward workspaces."""
        fwd = sum(b.nbytes for b in self.buffers if b.phase == "forward")
        bwd = sum(b.nbytes for b in self.buffers if b.phase == "backward")
        return self.reserve_bytes + max(fwd, bwd)

    def layer(self, layer: int, direction: int = 0) -> LayerPlan:
        """The recurrence of `layer` (0 .. num_layers - 1) in `direction` (0: forward; 1: the
        reverse direction of a bidirectional plan). Python or NumPy ints; ValueError naming
        the argument when out of range."""
        layer = check_int("layer", layer, minimum=0, maximum=self.num_layers - 1)
        direction = check_int("direction", direction, minimum=0, maximum=self.num_dirs - 1)
        return self.layers[layer * self.num_dirs + direction]

    def explain(self) -> str:
        lines = [
            f"Plan {self.key}",
            f"  device: {self.device.name} ({self.device.sm_count} SMs, "
            f"{self.device.smem_per_program // 1024} KiB smem/program)",
            f"  {self.rnn_mode} L={self.num_layers} D={self.num_dirs} H={self.num_units} "
            f"P={self.num_proj} I={self.input_size} B={self.batch} T={self.max_time} "
            f"{self.dtype}  (choice: {self.source})",
            "  recurrences:",
        ]
        for i, lp in enumerate(self.layers):
            if lp.family == "reference":  # no kernel: no tiles, warps or on-chip weights
                lines.append(f"    layer {i // self.num_dirs} dir {i % self.num_dirs}: "
                             f"reference       (the PyTorch recurrence: no kernel)")
                continue
            weights = _weights_label(self.rnn_mode, lp, getattr(torch, self.dtype),
                                     self.num_units, self.num_proj)
            own_bwd = (f"(backward {lp.backward_block_h} x {lp.backward_block_b}) "
                       if lp.own_backward_tiles else "")
            lines.append(
                f"    layer {i // self.num_dirs} dir {i % self.num_dirs}: {lp.family:<15} "
                f"block_b={lp.block_b} block_h={lp.block_h or '-'} "
                f"{own_bwd}"
                f"weights={weights} "
                f"warps={lp.num_warps}"
                f"{f' (backward {lp.num_warps_bwd})' if lp.backward_warps != lp.num_warps else ''}"
                f"{self._backward_exchange(lp)}"
                f" programs={lp.num_programs}"
                f"{f' (forward {lp.forward_programs})' if lp.forward_programs else ''}"
                f"{' (pair launch)' if lp.num_dirs == 2 else ''} on-chip={lp.onchip_bytes} B"
            )
        if self.pipeline is not None:
            lines += self._explain_pipeline()
        lines.append("  buffers (N = B*T, the most sum(lengths) can be):")
        for b in self.buffers:
            lines.append(
                f"    {b.phase:<9} {b.name:<22} {str(list(b.shape)):<20} {b.dtype:<9} "
                f"{b.nbytes:>14,} B"
            )
        lines.append(f"  reserve: {self.reserve_bytes:,} B   peak: {self.peak_bytes:,} B")
        return "\n".join(lines)

    @property
    def pipeline_extra_bytes(self) -> int:
        """Bytes of the workspaces the layer pipeline adds (the "pipeline.*" buffers)."""
        return sum(b.nbytes for b in self.buffers if b.name.startswith("pipeline."))

    def _backward_exchange(self, lp: LayerPlan) -> str:
        """How a grid-kernel layer's backward exchanges its carry product, for `explain`:
        the split-K kernel's tiles and form where the plan runs it (LayerPlan.split_k_bwd),
        else dph with its gates' operands paired or not."""
        split = split_k_launch(lp, self.rnn_mode, self.num_units, self.batch,
                               getattr(torch, self.dtype), self.device)
        if split is not None:
            return f" backward split-K {split.describe()}"
        return " backward gates paired" if lp.pair_gates else ""

    def _explain_pipeline(self) -> list[str]:
        d = self.pipeline
        if d.chunks <= 1:
            return [f"  layer pipeline: off ({d.reason})"]
        bwd = sum(b.nbytes for b in self.buffers
                  if b.name.startswith("pipeline.") and b.phase == "backward")
        if d.backward_pipeline is None:
            why = ("a single layer" if self.num_layers < 2 else
                   f"two layers' backward launches, 2 x "
                   f"{max(lp.num_programs for lp in self.layers)} programs, exceed the "
                   f"{self.device.sm_count} SMs")
            backward = f" in the forward; the backward unpipelined ({why})"
            extra = "states between chunks, forward only"
            dropped = "dropped [N, Hout] in each pass"
        else:
            backward = (f" (backward {d.backward_width}: its launches take more programs)"
                        if d.backward_width != d.width else "")
            extra = (f"backward {bwd:,} B ({d.backward_width - 1} more stream slot(s) of the "
                     f"weight-gradient inputs, states between chunks)")
            dropped = (f"dropped [N, Hout] (forward) and [{d.backward_width}, N, Hout] "
                       f"(backward)")
        return [
            f"  layer pipeline: {d.chunks} chunks, {d.width} "
            f"layer{'s' if d.width != 1 else ''} concurrent{backward} "
            f"({d.reason})",
            f"    decided at T={d.max_len} (max_time; the engine decides per batch on its "
            f"longest sequence) for the Triton backend's recurrences above",
            f"    extra workspaces (pipeline.* below): {self.pipeline_extra_bytes:,} B, "
            f"{extra}; dropout > 0 adds {dropped}",
        ]


def backward_writes_over_preacts(rnn_mode: str, barrier_check: str | None = None) -> bool:
    """Whether the unpipelined backward writes each recurrence's pre-activation gradients
    over its recomputed pre-activations (dpre_x into pre_x, GRU's dpre_h into pre_h): one
    [N, G*H] workspace fewer per recurrence, two for GRU. Safe in every backend because each
    gradient element is a function of the pre-activation element at its own index (a gate's
    gradient reads that gate's activation: LSTM i, f, g, o; GRU r, z and n, whose n reads
    both sides), so it is read before it can be written, and no other program, step or
    direction reads it. Not with TRITONRNN_BARRIER_CHECK=sync, where a persistent launch
    whose barrier timed out is rerun stepwise and needs its inputs as they were; not in the
    layer pipeline, whose pre-activation rows are shared by the layers in flight while each
    keeps its gradients for its weight GEMMs; not for tanh / relu, which have no
    pre-activation to write over (`reference.backward_preacts`). The one-barrier split-K
    backward, whose programs of a K block all read its cells' pre-activations, stores each
    step's gradients only once every one of them has (`kernels.split_k`). barrier_check: the
    mode (default: TRITONRNN_BARRIER_CHECK's, read now)."""
    from tritonrnn.kernels.grid_barrier import barrier_check_mode

    check = barrier_check or barrier_check_mode()
    return backward_preacts(rnn_mode)[0] and check != "sync"


def _buffer(name: str, shape, phase: str, dtype: torch.dtype) -> Buffer:
    """A Buffer of `shape` elements of `dtype`, its bytes counted."""
    shape = tuple(shape)
    return Buffer(name, shape, str(dtype).removeprefix("torch."),
                  math.prod(shape) * dtype.itemsize, phase)


def _buffers(cfg, B: int, T: int, dtype: torch.dtype, width: int = 0,
             barrier_check: str = "deferred",
             backward_width: int | None = None) -> tuple[Buffer, ...]:
    """Every buffer of a training step at N = B*T (the config's dropout included) as the
    Triton backend's engine allocates it; width > 0: the forward as the layer pipeline
    allocates it, backward_width > 0 (default: width) the backward as the pipeline with
    that many stream slots allocates it (rnn/pipeline.py's workspace shapes, the ones it
    adds named "pipeline.*"; 0: the backward unpipelined). Bidirectional: the Triton
    backend takes both directions of a layer in one call (engine.pairs_directions), so the
    per-recurrence workspaces have a half per direction ([2, N, C], listed with the leading
    2)."""
    from .pipeline import (
        SLOT_PRIVATE,
        backward_workspaces,
        extra_workspaces,
    )
    from .reserve import PAYLOAD_OFFSET

    N = B * T
    G, H, Hout, D, L, P = (cfg.num_gates, cfg.num_units, cfg.out_size, cfg.num_dirs,
                           cfg.num_layers, cfg.num_proj)
    out: list[Buffer] = []

    def add(name, shape, phase, buffer_dtype=dtype):
        out.append(_buffer(name, shape, phase, buffer_dtype))

    add("reserve.header", (PAYLOAD_OFFSET,), "reserve", torch.uint8)
    if cfg.is_lstm:
        add("reserve.c_seq", (L * D, N, H), "reserve")
    if L > 1:
        add("reserve.layer_out", (L - 1, N, D * Hout), "reserve")
    W = (D,) if D == 2 else ()  # a half per direction when the backend pairs them
    add("x_packed", (N, cfg.input_size), "forward")
    add("xg", (*W, N, G * H), "forward")
    add("y_packed", (N, D * Hout), "forward")
    if backward_width is None:
        backward_width = width
    if L > 1 and cfg.dropout > 0:
        # The inter-layer dropout's workspace in the forward (the pipelined forward's too:
        # `forward_workspaces`).
        add("dropped", (N, D * Hout), "forward")
    if width:
        for ws in extra_workspaces(cfg, N, B, 1):
            if ws.phase == "forward":
                add(ws.name, ws.shape, ws.phase)
    if backward_width:
        extra = extra_workspaces(cfg, N, B, backward_width)
        extra_names = {ws.name for ws in extra}
        for name, shape in backward_workspaces(cfg, N, B, backward_width).items():
            if name in SLOT_PRIVATE:
                add(name, shape[1:], "backward")  # slot 0; the others are pipeline.<name>
            elif f"pipeline.{name}" not in extra_names:
                add(name, shape, "backward")
        for ws in extra:
            if ws.phase == "backward":
                add(ws.name, ws.shape, ws.phase)
        add("output_backprop slab", (T, B, D * Hout), "tensorarray")
        return tuple(out)
    if L > 1 and cfg.dropout > 0:
        # The inter-layer dropout's workspace in the backward.
        add("dropped", (N, D * Hout), "backward")
    wants_x, wants_h = backward_preacts(cfg.rnn_mode)
    over = backward_writes_over_preacts(cfg.rnn_mode, barrier_check)
    gru = cfg.rnn_mode == "gru"
    if wants_x:
        add("pre_x / dpre_x" if over else "pre_x", (*W, N, G * H), "backward")
    if wants_h:
        add("pre_h / dpre_h" if over and gru else "pre_h", (*W, N, G * H), "backward")
    if not over:
        add("dpre_x", (*W, N, G * H), "backward")
        if gru:
            add("dpre_h", (*W, N, G * H), "backward")
    add("h_prev", (*W, N, Hout), "backward")
    if cfg.is_lstm:
        add("c_prev", (*W, N, H), "backward")
    if P:
        add("dh_total", (*W, N, Hout), "backward")
        add("m_seq", (*W, N, H), "backward")
    # dx / dy alternate between two buffers down the stack (one for a single layer).
    add("dx_dy (ping-pong)", (min(L, 2), N, max(cfg.input_size, D * Hout)), "backward")
    add("output_backprop slab", (T, B, D * Hout), "tensorarray")
    return tuple(out)


def recurrence_key(cell: str, H: int, P: int, dtype: torch.dtype, batch: int,
                   props: DeviceProperties, num_dirs: int = 1) -> str:
    """Tuning-cache key of one recurrence: what its kernel choice depends on (B bucketed;
    T, the input size and the layer count do not change the best recurrence kernel; a
    bidirectional pair launch, num_dirs = 2, is its own key ending in |D2)."""
    key = f"{props.name}|{cell}|H{H}|P{P}|{str(dtype).replace('torch.', '')}|B{_bucket(batch)}"
    return key + ("|D2" if num_dirs == 2 else "")


def plan_for(
    *,
    rnn_mode: str,
    input_size: int,
    num_units: int,
    num_layers: int = 1,
    direction: str = "unidirectional",
    num_proj: int = 0,
    batch: int,
    max_time: int,
    dtype: torch.dtype,
    device_properties: DeviceProperties | str | None = None,
    dropout: float = 0.0,
) -> Plan:
    """Plans one RNN stack for a batch/time size on a device (a preset name, properties, or
    None for the current device). Cached by key; T and B enter only as power-of-two buckets
    for the kernel choice (buffer sizes use the exact values). `dropout` (between layers, as
    cudnn_rnn's) changes only the buffers: the inter-layer dropout's workspaces. batch and
    max_time: Python or NumPy ints >= 1 (TypeError for another type, ValueError below 1)."""
    props = device_properties
    if props is None:
        props = _current_device_properties()
    elif isinstance(props, str):
        if props not in PRESETS:
            raise ValueError(
                f"device_properties: expected one of {sorted(PRESETS)} or DeviceProperties, "
                f"got {props!r}"
            )
        props = PRESETS[props]
    elif not isinstance(props, DeviceProperties):
        raise TypeError(
            f"device_properties: expected a DeviceProperties, a preset name (one of "
            f"{sorted(PRESETS)}) or None (the current device), got {type(props).__name__} "
            f"{props!r}"
        )
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"dtype: expected torch.float16, bfloat16, float32 or float64, got "
                        f"{type(dtype).__name__} {dtype!r}")
    # Python or NumPy ints (as make_config takes its sizes), as Python ints from here on.
    batch = check_int("batch", batch, minimum=1)
    max_time = check_int("max_time", max_time, minimum=1)
    cfg = make_config(
        rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units, input_size=input_size,
        direction=direction, num_proj=num_proj, dropout=dropout,
    )
    constraints = _constraints.get()
    automatic = os.environ.get("TRITONRNN_PIPELINE", "0") == "1"
    from tritonrnn.kernels.grid_barrier import barrier_check_mode

    return _plan_cached(cfg, batch, max_time, dtype, props, constraints, _tuning_cache_stamp(),
                        automatic, barrier_check_mode(), triton.__version__,
                        tuple(sorted(kernel_variants().items())))


def _pipeline_decision(cfg, batch: int, max_time: int, dtype: torch.dtype,
                       props: DeviceProperties, layers: tuple[LayerPlan, ...],
                       automatic: bool) -> Decision:
    """pipeline.decide for the plan: device properties without an interpreter flag are a
    CUDA device's; off only for want of TRITONRNN_PIPELINE=1, the reason says what the rule
    would choose with it."""
    from .pipeline import decide

    device = "cpu" if props.interpreter else "cuda"
    kw = dict(dtype=dtype, props=props, backend="triton")
    d = decide(cfg, batch, max_time, device, layers, automatic=automatic, **kw)
    if d.chunks == 1 and not automatic and "pipeline_chunks" not in current_constraints():
        rule = decide(cfg, batch, max_time, device, layers, automatic=True, **kw)
        would = (f"{rule.chunks} chunks, {rule.width} layers concurrent" if rule.chunks > 1
                 else f"still off: {rule.reason}")
        d = replace(d, reason=f"{d.reason}; with it: {would}")
    return d


@functools.lru_cache(maxsize=1024)
def _plan_cached(cfg, batch, max_time, dtype, props, constraints, _cache_stamp,
                 automatic: bool, barrier_check: str, _triton: str,
                 _variants: tuple) -> Plan:
    """plan_for's Plan, cached by everything it depends on: the tuning cache's file and
    version (_cache_stamp; not the id of its loaded dict, which Python reuses once the dict
    is freed: a plan made without a cache was returned for a tuned key), the barrier check
    mode (the buffers: `backward_writes_over_preacts`), the Triton release whose entries
    count (_triton) among them, and the kernel switches (`kernel_variants`: the entries
    that count, and the split-K form a choice that does not name one gets, `_with_split_k`)."""
    key = recurrence_key(cfg.rnn_mode, cfg.num_units, cfg.num_proj, dtype, batch, props,
                         cfg.num_dirs)
    choice, source = recurrence_choice(
        cfg.rnn_mode, cfg.num_units, cfg.out_size, cfg.num_proj, dtype, batch, props,
        cfg.num_dirs,
    )
    layers = (choice,) * cfg.pseudo_layers
    pipe = _pipeline_decision(cfg, batch, max_time, dtype, props, layers, automatic)
    # (the backward pipelined where its layers overlap: `Decision.backward_pipeline`)
    backward_width = pipe.backward_width if pipe.backward_pipeline is not None else 0
    return Plan(
        key=key, rnn_mode=cfg.rnn_mode, input_size=cfg.input_size, num_units=cfg.num_units,
        num_layers=cfg.num_layers, num_dirs=cfg.num_dirs, num_proj=cfg.num_proj, batch=batch,
        max_time=max_time, dtype=str(dtype).replace("torch.", ""), device=props,
        layers=layers, source=source,
        buffers=_buffers(cfg, batch, max_time, dtype, pipe.width if pipe.chunks > 1 else 0,
                         barrier_check, backward_width=backward_width)
        + _split_k_buffers(cfg, batch, dtype, props, choice, max(backward_width, 1)),
        pipeline=pipe,
    )


def _split_k_buffers(cfg, batch: int, dtype: torch.dtype, props: DeviceProperties,
                     lp: LayerPlan, copies: int = 1) -> tuple[Buffer, ...]:
    """The workspace `kernels.split_k.split_k_backward` allocates per call where the plan
    runs it as the layers' backward (LayerPlan.split_k_bwd, `split_k_launch`; one direction
    at a time): `kernels.split_k.workspace`, the fp32
    partials and the two carries (dh's direct term and dc), listed together as [2, Bpad, H]
    ([2, 2, Bpad, H] for the one-barrier form's two slots of each), and the one-barrier
    form's gradients held between launches in the layer's dtype where the steps take
    several launches (stepwise plans, the interpreter; on a GPU a persistent plan's one
    launch holds none, though its stepwise rerun after a failed launch would).
    copies: the layers whose backwards run at once (the layer pipeline's width, each on its
    own stream and so with its own workspace), a leading dimension where above 1."""
    from tritonrnn.kernels.split_k import workspace

    split = split_k_launch(lp, cfg.rnn_mode, cfg.num_units, batch, dtype, props)
    if split is None:
        return ()
    ws = workspace(cfg.rnn_mode, cfg.num_units, batch, *split,
                   persistent=lp.family == "persistent_grid", on_gpu=not props.interpreter)
    lead = (copies,) if copies > 1 else ()
    out = (_buffer("split_k.partials", (*lead, *ws["partials"]), "backward", torch.float32),
           _buffer("split_k.carries", (*lead, 2, *ws["dh_carry"]), "backward",
                   torch.float32))
    if "held" in ws:
        out += (_buffer("split_k.held", (*lead, *ws["held"]), "backward", dtype),)
    return out


def candidates(plan: Plan) -> list[dict]:
    """Tunable choices for a plan's shape that can run on its device (for `tritonrnn tune`):
    those the planner accepts forced (`_apply`: within its shared memory and, for the
    persistent grid, co-resident; every choice on the interpreter preset). A streamed
    choice names its stages (`LayerPlan.choice`), and one that `_stream_stages` pipelines
    deeper is also tried on Triton's default. A grid-family choice names its backward
    (split_k_bwd = 0), and each form of the split-K backward is tried beside every
    persistent-grid forward (`_split_k_candidates`)."""
    from tritonrnn.kernels.grid_tiles import DEFAULT_STAGES, vector_tiles

    if plan.dtype == "float64":
        return [{"family": "reference"}]
    dtype = getattr(torch, plan.dtype)
    H, P = plan.num_units, plan.num_proj
    Hout = P or H
    cell = plan.rnn_mode
    out = []
    # Vector tiles (batch tiles of 1, 2, 4: the batch bucket's width, one tile) for the grid
    # families, resident weights only, hidden slices from 8; MMA tiles from 16, and 128 in
    # the grid families (`_grid_batch_tiles`).
    vec = (_pow2(plan.batch),) if _pow2(plan.batch) <= 4 else ()
    for family in ("persistent_cta", "persistent_grid", "stepwise"):
        grid = family != "persistent_cta"
        for block_b in (*vec, 16, 32, 64, 128) if grid else (16, 32, 64):
            if block_b > max(16, _pow2(plan.batch)):
                continue
            vector = vector_tiles(block_b)
            for num_warps, num_warps_bwd in itertools.product((4, 8), (4, 8)):
                if not grid and num_warps_bwd != num_warps:
                    continue  # the one-program family's warps are tuned for both passes
                for block_h in ((8, 16, 32) if vector else (16, 32, 64, 128)) if grid else (0,):
                    for block_k in ((0,) if vector else (0, 64, 128)) if grid else (None,):
                        choice = {"family": family, "block_b": block_b, "num_warps": num_warps}
                        if grid:
                            choice.update(num_warps_bwd=num_warps_bwd, split_k_bwd=0)
                        if block_h:
                            if block_h > _pow2(H):
                                continue
                            choice["block_h"] = block_h
                        if block_k is not None:
                            if block_k > max(16, _pow2(max(H, Hout))):
                                continue
                            choice["block_k"] = block_k
                        # Resident MMA tiles of 32 columns or more: also with the backward
                        # on tiles twice as tall and half as wide (`_taller_backward`).
                        taller = grid and block_k == 0 and not vector and block_b >= 32
                        for c in (choice, {**choice, "block_h_bwd": 2 * block_h,
                                           "block_b_bwd": block_b // 2})[:1 + taller]:
                            try:
                                with plan_constraints(**c):
                                    lp, _ = recurrence_choice(cell, H, Hout, P, dtype,
                                                              plan.batch, plan.device,
                                                              plan.num_dirs)
                            except ValueError:
                                continue
                            if lp.block_k:  # spelled as the plan's own choice spells them
                                c = {**c, "num_stages": lp.num_stages or DEFAULT_STAGES,
                                     "num_stages_bwd": lp.backward_stages or DEFAULT_STAGES}
                            out.append(c)
                            if max(lp.num_stages, lp.backward_stages) > DEFAULT_STAGES:
                                out.append({**c, "num_stages": DEFAULT_STAGES,
                                            "num_stages_bwd": DEFAULT_STAGES})
    out += _split_k_candidates(plan, out)
    own = plan.layers[0].choice()
    if ("block_h_bwd" in own or own.get("split_k_bwd")) and own not in out:
        out.insert(0, own)  # the plan's own backward tiles (or split-K warps) too
    return out


# The forward's part of a grid choice: what a split-K backward keeps of it.
_FORWARD_KEYS = ("family", "block_b", "num_warps", "block_h", "block_k", "num_stages")


def _split_k_candidates(plan: Plan, choices: list[dict]) -> list[dict]:
    """`candidates`' split-K backwards: each persistent-grid forward among `choices` (its
    _FORWARD_KEYS; the backward's warps, tiles and stages dropped, so one per forward) with
    each form of the split-K backward that has tiles for the plan's shape (none with a
    projection), on the kernel's NUM_WARPS; those the planner accepts forced. Stepwise
    forwards are left out: their split-K backward would run two launches a step."""
    from tritonrnn.kernels import split_k

    if plan.num_proj or plan.dtype == "float64":
        return []
    dtype = getattr(torch, plan.dtype)
    forms = [f for f in (split_k.ONE_BARRIER, split_k.TWO_BARRIERS)
             if split_k.form_tiles(f, plan.rnn_mode, plan.num_units, _bucket(plan.batch), dtype,
                                   plan.device) is not None]
    out: list[dict] = []
    for c in choices:
        if c["family"] != "persistent_grid":
            continue
        for form in forms:
            v = {**{k: c[k] for k in _FORWARD_KEYS if k in c},
                 "num_warps_bwd": split_k.NUM_WARPS, "split_k_bwd": form}
            if v in out:
                continue
            try:
                with plan_constraints(**v):
                    recurrence_choice(plan.rnn_mode, plan.num_units, plan.num_units, 0, dtype,
                                      plan.batch, plan.device, plan.num_dirs)
            except ValueError:
                continue
            out.append(v)
    return out


# ----------------------------------------------------------------------------- TensorArrays


def tensorarray_allocator(shape: tuple[int, ...], dtype: torch.dtype,
                          device: torch.device) -> torch.Tensor:
    """The planner's TensorArray slab allocator: one contiguous [size, *element] block, laid
    out exactly as the fused backward reads output_backprop ([T, B, D*Hout] time-major), so a
    gradient array's slab is handed to the backward as is (listed in Plan.buffers as the
    "output_backprop slab"). NaN-poisoned under TRITONRNN_POISON=1 like every workspace."""
    from .engine import new_buffer

    return new_buffer(*shape, dtype=dtype, device=device)


def output_tensor_array(output: torch.Tensor, *, name: str | None = None):
    """A TensorArray of per-step RNN outputs whose slab IS `output` (time-major [T, B, C], no
    copy). Its gradient array is allocated by `tensorarray_allocator`, and the backward of the
    RNN receives that gradient slab itself as output_backprop."""
    from tritonrnn.tensorarray import TensorArray

    if not isinstance(output, torch.Tensor) or output.dim() != 3:
        raise ValueError(
            f"output: expected the time-major [T, B, D*Hout] output of cudnn_rnn, got "
            f"{list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__}"
        )
    if not output.is_contiguous():
        raise ValueError(
            "output: expected a contiguous time-major tensor (time_major=True), got strides "
            f"{output.stride()}"
        )
    return TensorArray.from_slab(output, name=name or "rnn_output",
                                 allocator=tensorarray_allocator)
