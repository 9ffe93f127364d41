"""Drop-in nn.Modules: `LSTM`, `GRU` and `RNN` with torch.nn's constructor, parameter names,
inputs and outputs, computed by one call into the CudnnRNN V3 op per forward.

Swap `torch.nn.LSTM` for `tritonrnn.rnn.LSTM` and nothing else changes: the state dict keys
and shapes are torch's (weight_ih_l{k}[_reverse] = W, weight_hh = R, bias_ih = bW,
bias_hh = bR, weight_hr = P_w; the gate orders are the same), `parameters()` come in torch's
order and are initialized as torch initializes them (same values under the same seed),
and forward takes a padded tensor, a PackedSequence, or a padded tensor with `lengths=`.

Flat params without copies
--------------------------
The op wants one flat buffer in the canonical order (rnn/params.py). The module owns that
buffer (`_flat`, a plain attribute, not in the state dict) and every named nn.Parameter *is*
a view of its slice: no copy is ever made to call the op, and an optimizer's in-place
update of a Parameter is an update of the buffer. In a forward:

- `_FlatParams` (an autograd.Function) hands the buffer to the op as a differentiable input
  of the named Parameters; its backward cuts the op's flat gradient into per-parameter views,
  so autograd (and DDP's hooks) see ordinary per-parameter gradients.
- bias=False: the bias slices of the buffer stay zero and belong to no Parameter, so they get
  no gradient (torch.nn registers no bias parameters either).
- If a Parameter stopped being a view of the buffer (replaced by assignment,
  `load_state_dict(assign=True)`, `.data = ...`, a conversion by `.to()`/`.half()`), the
  buffer is rebuilt once from the current Parameters and they become views again
  (`flatten_parameters`, which `_apply` calls after every conversion). The check is a
  pointer comparison per Parameter.
- Because the Parameters share the buffer (and its autograd version counter), editing any
  of them in place between a forward and its backward makes that backward raise (torch.nn
  on the CPU raises only for a tensor it saved, in practice weight_hh); and
  `safetensors.torch.save_model` refuses the module's shared storage, so save
  `safetensors.torch.save_file(module.state_dict(), path)` instead.
- Only the Parameters the module registered itself are ever re-pointed at its buffer. Weights
  that are computed (torch.nn.utils.parametrize, torch.nn.utils.prune) or that are not the
  module's (the caller's tensors under torch.func.functional_call, which a functional call
  must not modify), and traced runs under torch.compile, concatenate the weights instead
  (one copy, differentiable by autograd; the compiler sees only tensor ops). Conversions
  and unpickling leave such weights as torch.nn does and keep no stale buffer.

Autocast
--------
Under torch.autocast (float16/bfloat16) the input, states and a cast of the weights go to
the op in the autocast dtype (the fp32 Parameters stay the masters, as torch.nn does on CUDA);
the op itself runs with autocast off, so its result is that of a plain call in that dtype,
eager or compiled.

Empty batch
-----------
A batch of 0 (B = 0, T >= 1) returns what torch.nn returns without calling the op (which
takes B >= 1): empty output and final states of the op's dtype, whose gradients are zeros.

Dropout and training
--------------------
In training mode with dropout > 0 and more than one layer, fresh dropout seeds are drawn from
torch's default CPU generator each forward (`torch.randint`), so `torch.manual_seed` makes
runs reproducible. In eval mode there is no dropout; the op still keeps its reserve whenever a
gradient is required, so backward works in eval mode too (is_training=False, no reserve, only
when nothing needs a gradient).
"""

from __future__ import annotations

import math
import numbers
import threading
import warnings
import weakref

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from tritonrnn.kernels.grid_barrier import capturing

from . import library
from .config import make_config
from .ops import BACKENDS, check_length_values, check_untransformed
from .params import FLOAT_DTYPES, check_dense, params_layout

_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}
_SEED_HIGH = 2**62  # seeds drawn in [0, 2**62): any int the op accepts


class _FlatParams(torch.autograd.Function):
    """Identity on the flat buffer whose gradient goes to the named Parameters viewing it."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, slots: tuple, *params: torch.Tensor) -> torch.Tensor:
        ctx.slots = slots
        return flat.view_as(flat)

    @staticmethod
    def backward(ctx, grad_flat: torch.Tensor):
        g = grad_flat.contiguous()
        grads = []
        for (offset, shape, numel), needed in zip(ctx.slots, ctx.needs_input_grad[2:],
                                                  strict=True):
            grads.append(g[offset : offset + numel].view(shape) if needed else None)
        return (None, None, *grads)


# The storage address of each module's flat buffer -> the module, weakly (`_register_flat`;
# no weak reference to a Parameter: torch's swap-mode conversions refuse to swap one). A
# Parameter that views another live module's buffer is left where it is: two modules
# re-pointing one shared Parameter at their own buffers would rebuild both on every forward.
_FLAT_OWNERS: dict[int, weakref.ref] = {}
_FLAT_OWNERS_LOCK = threading.Lock()  # modules built or converted on several threads


def _storage_address(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return 0


def _register_flat(module: nn.Module, flat: torch.Tensor) -> None:
    address = _storage_address(flat)
    with _FLAT_OWNERS_LOCK:
        for dead in [a for a, ref in _FLAT_OWNERS.items() if ref() is None]:
            del _FLAT_OWNERS[dead]
        if address:  # (0: meta tensors, which hold no memory to share)
            _FLAT_OWNERS[address] = weakref.ref(module)


def _buffer_owner(p: torch.Tensor) -> nn.Module | None:
    """The live module whose current flat buffer `p` views, or None."""
    address = _storage_address(p)
    ref = _FLAT_OWNERS.get(address) if address else None
    owner = ref() if ref is not None else None
    if owner is None or _storage_address(owner._flat) != address:
        return None
    return owner


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def _check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """value as a Python int: Python and NumPy integers (torch.nn takes both), not bools."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def _check_weight(name: str, w: object, shape: tuple[int, ...]) -> None:
    """A weight the module's flat buffer can take: a tensor of its slot's shape."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor of shape {list(shape)}, got "
                        f"{type(w).__name__}")
    if tuple(w.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(w.shape)}")


class _RNNBase(nn.Module):
    """Shared machinery of LSTM, GRU and RNN (torch.nn.RNNBase's interface)."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device=None,
        dtype=None,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        input_size = _check_positive_int("input_size", input_size)
        hidden_size = _check_positive_int("hidden_size", hidden_size)
        num_layers = _check_positive_int("num_layers", num_layers)
        proj_size = _check_positive_int("proj_size", proj_size, minimum=0)
        _check_bool("bias", bias)
        _check_bool("batch_first", batch_first)
        _check_bool("bidirectional", bidirectional)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
            raise TypeError(f"dropout: expected a float in [0, 1), got "
                            f"{type(dropout).__name__} {dropout!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout: expected a float in [0, 1), got {dropout}")
        if proj_size > 0 and mode != "LSTM":
            raise ValueError(f"proj_size: expected 0 for {mode} (projection is LSTM only), "
                             f"got {proj_size}")
        if proj_size >= hidden_size and proj_size > 0:
            raise ValueError(f"proj_size: expected a value in [0, hidden_size={hidden_size}) "
                             f"as torch.nn.LSTM, got {proj_size}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {list(BACKENDS)}, got {backend!r}")
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected float16, bfloat16, float32 or float64 (None: "
                            f"torch's default), got {dtype!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero "
                f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                f"num_layers={num_layers}",
                stacklevel=3,
            )
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        self.backend = backend
        self._cfg = make_config(
            rnn_mode=_MODES[mode], num_layers=num_layers, num_units=hidden_size,
            input_size=input_size, direction="bidirectional" if bidirectional else
            "unidirectional", num_proj=proj_size,
        )
        self._build_slots()
        # The Parameters this module registered under the weight names (register_parameter):
        # the only ones flatten_parameters may re-point at `_flat`.
        self._owned: dict[str, nn.Parameter | None] = {}
        flat = torch.zeros(self._flat_numel, device=device, dtype=dtype)
        for name, (offset, shape, numel) in zip(self._flat_weights_names, self._slots,
                                                strict=True):
            # A Parameter made from a view shares the buffer's storage and version counter.
            setattr(self, name, nn.Parameter(flat[offset : offset + numel].view(shape)))
        self._flat = flat
        _register_flat(self, flat)
        self.reset_parameters()

    # ------------------------------------------------------------------ the flat buffer

    def _build_slots(self) -> None:
        """Names in torch.nn's registration order and their (offset, shape, numel) slots."""
        cfg = self._cfg
        layout, total = params_layout(cfg)
        G, H, Hout, P = cfg.num_gates, cfg.num_units, cfg.out_size, cfg.num_proj
        names, slots, all_weights = [], [], []
        for layer in range(cfg.num_layers):
            for d in range(cfg.num_dirs):
                off = layout[layer * cfg.num_dirs + d]
                sfx = f"l{layer}{'_reverse' if d else ''}"
                entries = [(f"weight_ih_{sfx}", off.w, (G * H, off.in_w)),
                           (f"weight_hh_{sfx}", off.r, (G * H, Hout))]
                if self.bias:
                    entries += [(f"bias_ih_{sfx}", off.bw, (G * H,)),
                                (f"bias_hh_{sfx}", off.br, (G * H,))]
                if P:
                    entries.append((f"weight_hr_{sfx}", off.p, (P, H)))
                for name, offset, shape in entries:
                    names.append(name)
                    slots.append((offset, shape, math.prod(shape)))
                all_weights.append([e[0] for e in entries])
        self._flat_weights_names = names
        self._all_weights = all_weights
        self._slots = tuple(slots)
        self._flat_numel = total

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        super().register_parameter(name, param)
        if name in self._flat_weights_names:
            self._owned[name] = param

    def _own_parameters(self) -> list[nn.Parameter] | None:
        """The registered Parameters in slot order when each is one this module registered
        itself; None when a weight is computed (parametrize, prune), removed, or a tensor
        torch.func.functional_call put in its place (the caller's, never to be re-pointed),
        and when weights are tied: one Parameter in two slots (it can view only one), or one
        that another live module's buffer holds (as torch.nn skips flattening aliased
        weights). Forwards concatenate the weights then."""
        params = [self._parameters.get(n) for n in self._flat_weights_names]
        for name, p in zip(self._flat_weights_names, params, strict=True):
            if p is None or p is not self._owned.get(name):
                return None
            if _buffer_owner(p) not in (None, self):
                return None
        if len({id(p) for p in params}) != len(params):
            return None
        return params

    def _flat_is_current(self) -> bool:
        """True when every named Parameter is still the view of its slice of `_flat`."""
        flat = self._flat
        if flat.numel() != self._flat_numel:  # released by _refresh_flat
            return False
        base, itemsize = flat.data_ptr(), flat.element_size()
        for name, (offset, shape, _) in zip(self._flat_weights_names, self._slots,
                                            strict=True):
            p = self._parameters.get(name)
            if (
                p is None
                or p.dtype != flat.dtype
                or p.device != flat.device
                or p.data_ptr() != base + offset * itemsize
                or p.shape != shape
                or not p.is_contiguous()
            ):
                return False
        return True

    def flatten_parameters(self) -> None:
        """Makes every named Parameter a view of one fresh flat buffer again (one copy), unless
        they already are. Parameter objects are kept, so optimizers stay valid. Does nothing,
        as torch.nn's flatten_parameters returns quietly, when a weight is not a Parameter
        this module registered (parametrized, pruned, removed, or the caller's under
        torch.func.functional_call: forwards concatenate the weights then) or the weights'
        dtypes or devices differ (a forward names the odd one)."""
        if self._flat_is_current():
            return
        own = self._own_parameters()
        if own is None or self._mixed(own):
            return
        params = list(zip(self._flat_weights_names, own, strict=True))
        ref = params[0][1]
        flat = torch.zeros(self._flat_numel, dtype=ref.dtype, device=ref.device)
        with torch.no_grad():
            for (name, p), (offset, shape, numel) in zip(params, self._slots, strict=True):
                _check_weight(name, p, shape)
                view = flat[offset : offset + numel].view(shape)
                view.copy_(p)
                p.data = view
        self._flat = flat
        _register_flat(self, flat)

    def _mixed(self, params) -> str | None:
        """What is wrong when the weights' dtypes or devices differ (one flat buffer cannot
        hold them), else None."""
        names, ref = self._flat_weights_names, params[0]
        for name, p in zip(names, params, strict=True):
            if p.dtype != ref.dtype or p.device != ref.device:
                return (f"{name}: expected dtype {ref.dtype} on {ref.device} like {names[0]}, "
                        f"got {p.dtype} on {p.device}")
        return None

    def _refresh_flat(self) -> None:
        """After a conversion or an unpickling: the buffer rebuilt from the Parameters, or,
        when a weight is not one of this module's Parameters, released (forwards concatenate
        the weights; flatten_parameters builds a fresh buffer once they are all its own)."""
        if self._own_parameters() is None:
            self._flat = self._flat.new_empty(0)
        else:
            self.flatten_parameters()

    def _apply(self, fn, recurse=True):
        own = [n for n in self._flat_weights_names
               if n in self._parameters and self._parameters[n] is self._owned.get(n)]
        ret = super()._apply(fn, recurse)
        # A conversion may store new Parameter objects in place of the module's own
        # (torch.__future__.set_overwrite_module_params_on_conversion): still its own.
        for name in own:
            self._owned[name] = self._parameters.get(name)
        # .to()/.half()/.cuda() gave the Parameters new storage: rebuild the buffer from them.
        self._refresh_flat()
        return ret

    def __setstate__(self, state):
        super().__setstate__(state)
        if "_owned" not in self.__dict__:  # pickled before `_owned` existed: all its own
            self._owned = {n: self._parameters.get(n) for n in self._flat_weights_names}
        # deepcopy and unpickling copy every Parameter separately (Parameter.__deepcopy__
        # clones): make them views of one buffer again.
        self._refresh_flat()

    def _cat_weights(self) -> torch.Tensor:
        """The flat buffer as a concatenation of the current weights (differentiable)."""
        weights = {}
        for name, (_, shape, _) in zip(self._flat_weights_names, self._slots, strict=True):
            w = getattr(self, name)  # a parametrization or a plain attribute may stand here
            _check_weight(name, w, shape)
            weights[name] = w
        pieces = [w.reshape(-1) for name, w in weights.items() if name.startswith("weight")]
        ref = weights[self._flat_weights_names[0]]
        n_weights = sum(p.numel() for p in pieces)
        biases = []
        if self.bias:
            biases += [w.reshape(-1) for name, w in weights.items() if name.startswith("bias")]
        else:
            biases.append(ref.new_zeros(self._flat_numel - n_weights))
        # Canonical order: every weight, then every bias, pseudo-layer by pseudo-layer; the
        # registration order (w_ih, w_hh, [b_ih, b_hh], [w_hr]) per pseudo-layer keeps it
        # once weights and biases are split (w_hr is a weight after w_hh).
        return torch.cat(pieces + biases)

    def _flat_weights_for_forward(self) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._cat_weights()
        for name in self._flat_weights_names:
            check_untransformed(name, self._parameters.get(name))
        if not self._flat_is_current():
            # Only this module's own Parameters are re-pointed at a new buffer; anything else
            # (parametrizations, pruning, torch.func.functional_call's tensors) is
            # concatenated, leaving the caller's tensors as they are.
            own = self._own_parameters()
            if own is None:
                return self._cat_weights()
            problem = self._mixed(own)
            if problem:
                raise TypeError(problem)
            self.flatten_parameters()
        params = [self._parameters[n] for n in self._flat_weights_names]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return _FlatParams.apply(self._flat, self._slots, *params)
        return self._flat

    @property
    def _flat_weights(self) -> list[nn.Parameter]:
        """The weights as torch.nn.RNNBase._flat_weights lists them, for code written against it."""
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        return [[getattr(self, w) for w in ws] for ws in self._all_weights]

    def reset_parameters(self) -> None:
        """torch.nn's initialization, in torch.nn's order: U(-1/sqrt(H), 1/sqrt(H))."""
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        if self.backend != "auto":
            s += ", backend={backend!r}"
        return s.format(**self.__dict__)

    # ------------------------------------------------------------------ forward

    def _state_shapes(self, B: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        LD = self.num_layers * (2 if self.bidirectional else 1)
        return (LD, B, self.proj_size or self.hidden_size), (LD, B, self.hidden_size)

    def _check_state(self, name: str, t: object, shape: tuple, x: torch.Tensor,
                     batched: bool) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        check_dense(name, t)
        if _autocast_dtype(x.device) == x.dtype and t.is_floating_point():
            t = t.to(x.dtype)
        want = shape if batched else (shape[0], shape[2])
        layout = "[num_layers*num_directions, batch, size]" if batched else \
            "[num_layers*num_directions, size] (unbatched input)"
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: expected shape {list(want)} {layout}, got "
                             f"{list(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{name}: expected dtype {x.dtype} (the input's), got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected a tensor on {x.device} (the input's), got "
                             f"{t.device}")
        return t if batched else t.unsqueeze(1)

    def _initial_states(self, hx, x: torch.Tensor, B: int, batched: bool):
        h_shape, c_shape = self._state_shapes(B)
        lstm = self.mode == "LSTM"
        if hx is None:
            h0 = x.new_zeros(h_shape)
            return h0, (x.new_zeros(c_shape) if lstm else None)
        if lstm:
            if not isinstance(hx, (tuple, list)):
                raise TypeError(f"hx: expected a tuple (h_0, c_0) of 2 tensors for LSTM, got "
                                f"{type(hx).__name__}")
            if len(hx) != 2:
                raise TypeError(f"hx: expected a tuple (h_0, c_0) of 2 tensors for LSTM, got "
                                f"a {type(hx).__name__} of {len(hx)} entries")
            return (self._check_state("hx[0]", hx[0], h_shape, x, batched),
                    self._check_state("hx[1]", hx[1], c_shape, x, batched))
        return self._check_state("hx", hx, h_shape, x, batched), None

    def _check_input(self, x: object) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input: expected a tensor or a PackedSequence, got "
                            f"{type(x).__name__}")
        check_untransformed("input", x)
        check_dense("input", x)
        if x.dim() not in (2, 3):
            raise ValueError(f"input: expected a 2-D (unbatched) or 3-D tensor, got shape "
                             f"{list(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input: expected last dimension input_size={self.input_size}, "
                             f"got shape {list(x.shape)}")
        ref = getattr(self, self._flat_weights_names[0])
        autocast = _autocast_dtype(x.device) is not None and x.is_floating_point()
        if x.dtype != ref.dtype and not autocast:
            raise TypeError(f"input: expected dtype {ref.dtype} (the module's parameters), "
                            f"got {x.dtype}")
        if x.device != ref.device:
            raise ValueError(f"input: expected a tensor on {ref.device} (the module's "
                             f"parameters), got {x.device}")
        return x

    @staticmethod
    def _check_lengths(lengths: object, B: int, T: int) -> torch.Tensor:
        if isinstance(lengths, (list, tuple)):
            if not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
                raise TypeError(f"lengths: expected ints, got {lengths!r}")
            check_length_values("lengths", lengths, T)  # (before int64 could overflow)
            lengths = torch.tensor(lengths, dtype=torch.int64)
        if not isinstance(lengths, torch.Tensor):
            raise TypeError(f"lengths: expected a 1-D int tensor or a list of ints, got "
                            f"{type(lengths).__name__}")
        check_dense("lengths", lengths)
        if lengths.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"lengths: expected dtype int32 or int64, got {lengths.dtype}")
        if tuple(lengths.shape) != (B,):
            raise ValueError(f"lengths: expected shape [{B}] (the batch), got "
                             f"{list(lengths.shape)}")
        # The op reads them on the host too; read here, they keep their name in its errors.
        # Not while compiling: the op reads them inside, where a graph does not trace it.
        if lengths.is_meta:
            raise ValueError("lengths: expected a tensor with data (the lengths are read on "
                             "the host), got a meta tensor")
        if not torch.compiler.is_compiling():
            values = lengths.tolist()
            check_length_values("lengths", values, T)
            if lengths.device.type != "cpu":  # one device read: the op's two read this copy
                lengths = torch.tensor(values, dtype=lengths.dtype)
        return lengths

    def _empty_batch(
        self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor | None, flat: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """torch.nn's result for B = 0 (the op takes B >= 1): output [T, 0, D*Hout], h_n
        [L*D, 0, Hout] and c_n [L*D, 0, H] (LSTM, else None) in x's dtype, on whose backward
        x, h0, c0 and every weight get zero gradients, as torch.nn's do."""
        D = 2 if self.bidirectional else 1
        h_shape, c_shape = self._state_shapes(0)
        # An empty slice's sum is an exact 0 whose gradient is zeros of the source's shape.
        zero = sum(t.reshape(-1)[:0].sum() for t in (x, h0, c0, flat) if t is not None)
        output = x.new_zeros(x.shape[0], 0, D * h_shape[2]) + zero
        h_n = x.new_zeros(h_shape) + zero
        c_n = x.new_zeros(c_shape) + zero if self.mode == "LSTM" else None
        return output, h_n, c_n

    def forward(self, input, hx=None, *, lengths=None):
        """Same inputs and outputs as torch.nn.{LSTM,GRU,RNN}.forward, plus `lengths`.

        input: [T, B, I] ([B, T, I] if batch_first), [T, I] unbatched, or a PackedSequence.
        hx: h_0 [L*D, B, Hout] (GRU/RNN), or (h_0, c_0 [L*D, B, H]) (LSTM); zeros if None.
        lengths: optional [B] ints (tensor or list) for a padded input: steps t >= lengths[b]
        are padding (output exactly 0 there, h_n/c_n the state after the last valid step).
        Returns (output, h_n) or (output, (h_n, c_n)); output is a PackedSequence when input
        is one, else [T, B, D*Hout] ([B, T, D*Hout] if batch_first). A batch of 0 gives
        torch.nn's empty results without calling the op.
        """
        lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        batched = True
        if packed:
            if lengths is not None:
                raise ValueError("lengths: expected None for a PackedSequence input (it "
                                 "carries its own lengths), got a value")
            data, batch_sizes, sorted_indices, _ = input
            self._check_input(data)
            x, seq_lengths, rows = _pad_packed(data, batch_sizes, sorted_indices)
        else:
            x = self._check_input(input)
            batched = x.dim() == 3
            time_axis = 1 if batched and self.batch_first else 0
            if x.shape[time_axis] == 0:  # torch.nn refuses it too, whatever the batch
                layout = "[B, T, I]" if time_axis else "[T, B, I]" if batched else "[T, I]"
                raise ValueError(f"input: expected max time >= 1, got shape {list(x.shape)} "
                                 f"({layout})")
            if not batched:
                if lengths is not None:
                    raise ValueError("lengths: expected None for an unbatched 2-D input, got "
                                     "a value")
                x = x.unsqueeze(1)
            elif self.batch_first:
                x = x.transpose(0, 1)
            seq_lengths = (None if lengths is None
                           else self._check_lengths(lengths, x.shape[1], x.shape[0]))
        B = x.shape[1]
        cast = _autocast_dtype(x.device)
        if cast is not None:  # autocast: input, states and weights in its dtype (fp32 masters)
            x = x.to(cast)
        h0, c0 = self._initial_states(hx, x, B, batched)
        if packed and sorted_indices is not None:  # the op runs the batch in sorted order
            h0 = h0.index_select(1, sorted_indices)
            c0 = c0.index_select(1, sorted_indices) if lstm else None
        flat = self._flat_weights_for_forward()
        if cast is not None:
            flat = flat.to(cast)
        if B == 0 and x.shape[0] > 0:
            output, h_n, c_n = self._empty_batch(x, h0, c0, flat)
        else:
            need_grad = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (flat, x, h0, c0)
            )
            use_dropout = self.training and self.dropout > 0 and self.num_layers > 1
            seeds = (torch.randint(0, _SEED_HIGH, (2,), dtype=torch.int64) if use_dropout
                     else None)
            res = library.cudnn_rnn(
                x, h0, c0, flat, seq_lengths, rnn_mode=self._cfg.rnn_mode,
                direction="bidirectional" if self.bidirectional else "unidirectional",
                dropout=self.dropout if use_dropout else 0.0, seeds=seeds,
                num_proj=self.proj_size, is_training=need_grad or use_dropout,
                time_major=True, backend=self.backend,
            )
            output, h_n = res.output, res.output_h
            c_n = res.output_c if lstm else None
        if packed:
            output = PackedSequence(
                output.reshape(-1, output.shape[2]).index_select(0, rows),
                batch_sizes, sorted_indices, input.unsorted_indices,
            )
            if sorted_indices is not None:  # final states back in the caller's order
                h_n = h_n.index_select(1, input.unsorted_indices)
                c_n = c_n.index_select(1, input.unsorted_indices) if lstm else None
        elif not batched:
            output, h_n = output.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if lstm else None
        elif self.batch_first:
            output = output.transpose(0, 1).contiguous()
        return (output, (h_n, c_n)) if lstm else (output, h_n)


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype when autocast is on for `device` (a float16/bfloat16 dtype); None
    on a device type without autocast (meta: shape-only runs)."""
    try:
        enabled = torch.is_autocast_enabled(device.type)
    except RuntimeError:  # "unknown device type for autocast"
        return None
    if enabled:
        dtype = torch.get_autocast_dtype(device.type)
        if dtype in (torch.float16, torch.bfloat16):
            return dtype
    return None


def _pad_packed(data: torch.Tensor, batch_sizes: torch.Tensor,
                sorted_indices: torch.Tensor | None):
    """PackedSequence pieces -> (padded [T, B, I], lengths [B] int64 on the host, rows [N]:
    the padded row t*B + j of every packed row), the batch in the PackedSequence's sorted
    order (j: position in it), as torch.nn runs it: the caller permutes the states by
    sorted_indices and back. Everything is derived from batch_sizes, which lives on the
    host, so sorted_indices (on the data's device) is never read there: no host sync."""
    # Sizes from shapes where possible (no host read of data, so torch.compile traces it).
    T, N = batch_sizes.numel(), data.shape[0]
    B = sorted_indices.numel() if sorted_indices is not None else int(batch_sizes[0])
    t_of_row = torch.repeat_interleave(torch.arange(T), batch_sizes, output_size=N)
    starts = torch.cumsum(batch_sizes, 0) - batch_sizes
    rows = t_of_row * B + (torch.arange(N) - starts[t_of_row])
    lengths = (batch_sizes[None, :] > torch.arange(B)[:, None]).sum(1)
    if data.is_cuda and not torch.compiler.is_compiling():
        if capturing(data.device):  # the copy's pinned source would not outlive the capture
            raise ValueError("input: a PackedSequence cannot run while a CUDA graph is "
                             "captured (its rows are copied from the host); capture a padded "
                             "input with lengths, run once before the capture")
        rows = rows.pin_memory().to(data.device, non_blocking=True)  # no wait on the stream
    else:
        rows = rows.to(data.device)
    padded = data.new_zeros(T * B, data.shape[1]).index_copy(0, rows, data)
    return padded.view(T, B, data.shape[1]), lengths, rows


class LSTM(_RNNBase):
    """torch.nn.LSTM on the CudnnRNN V3 op (see the module docstring).

    LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0, device=None, dtype=None, *, backend="auto").
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None, dtype=None,
                 *, backend: str = "auto") -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype, backend=backend)


def _refuse_proj_size(name: str, proj_size: object) -> None:
    """torch.nn.GRU and RNN refuse a proj_size argument whatever its value (0 included):
    projection is LSTM only."""
    if proj_size is not None:
        raise ValueError(f"proj_size: expected no proj_size for {name} (projection is LSTM "
                         f"only; torch.nn.{name} refuses the argument too), got {proj_size!r}")


class GRU(_RNNBase):
    """torch.nn.GRU on the CudnnRNN V3 op ("reset after" GRU, torch's equations).

    GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None, *, backend="auto").
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device=None, dtype=None, *,
                 proj_size: int | None = None, backend: str = "auto") -> None:
        _refuse_proj_size("GRU", proj_size)
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype, backend=backend)


class RNN(_RNNBase):
    """torch.nn.RNN (Elman, tanh or relu) on the CudnnRNN V3 op.

    RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None, *,
    backend="auto").
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device=None, dtype=None,
                 *, proj_size: int | None = None, backend: str = "auto") -> None:
        _refuse_proj_size("RNN", proj_size)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity: expected one of ['tanh', 'relu'], got "
                             f"{nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype, backend=backend)
