"""The flat ("opaque") params buffer: layout, size and the canonical conversions.

Canonical order (TensorFlow's CudnnRNN canonical order), pseudo-layer p = layer * D + dir:
all weights of p = 0, 1, ... first, then all biases of p = 0, 1, ....
Weights of one pseudo-layer: W_0..W_{G-1} ([H, in_w] each; absent for layer 0 under
skip_input), R_0..R_{G-1} ([H, Hout] each), then P_w ([P, H]) when num_proj > 0.
Biases of one pseudo-layer: bW_0..bW_{G-1}, bR_0..bR_{G-1} ([H] each).
The flat buffer is these tensors flattened row-major and concatenated in that order.

Because the G gate matrices of one pseudo-layer are adjacent, W of a pseudo-layer is one
[G*H, in_w] matrix, R one [G*H, Hout] matrix, bW and bR one [G*H] vector each: the engine
takes them as zero-copy views (`layer_views`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .config import RNNConfig, make_config


@dataclass(frozen=True)
class PseudoLayerOffsets:
    """Element offsets of one pseudo-layer's tensors inside the flat buffer (-1 = absent)."""

    w: int
    r: int
    p: int
    bw: int
    br: int
    in_w: int


def _layout(cfg: RNNConfig) -> tuple[tuple[PseudoLayerOffsets, ...], int]:
    """(offsets per pseudo-layer, total elements), cached by configuration without its
    dropout attributes (several reads a call)."""
    return _layout_of(cfg.without_dropout())


@functools.lru_cache(maxsize=64)
def _layout_of(cfg: RNNConfig) -> tuple[tuple[PseudoLayerOffsets, ...], int]:
    G, H, Hout, P = cfg.num_gates, cfg.num_units, cfg.out_size, cfg.num_proj
    offsets: list[dict[str, int]] = []
    pos = 0
    for layer in range(cfg.num_layers):
        in_w = cfg.layer_input_size(layer) if cfg.has_input_weights(layer) else 0
        for _ in range(cfg.num_dirs):
            entry = {"in_w": in_w, "w": -1, "p": -1}
            if in_w:
                entry["w"] = pos
                pos += G * H * in_w
            entry["r"] = pos
            pos += G * H * Hout
            if P:
                entry["p"] = pos
                pos += P * H
            offsets.append(entry)
    for entry in offsets:
        entry["bw"] = pos
        pos += G * H
        entry["br"] = pos
        pos += G * H
    return tuple(PseudoLayerOffsets(**e) for e in offsets), pos


def params_layout(cfg: RNNConfig) -> tuple[list[PseudoLayerOffsets], int]:
    """Per pseudo-layer offsets and the total element count."""
    layout, total = _layout(cfg)
    return list(layout), total


def config_params_size(cfg: RNNConfig) -> int:
    return _layout(cfg)[1]


@dataclass(frozen=True)
class LayerParams:
    """Views into the flat buffer for one pseudo-layer (W is None under skip_input)."""

    W: torch.Tensor | None  # [G*H, in_w]
    R: torch.Tensor  # [G*H, Hout]
    Pw: torch.Tensor | None  # [P, H]
    bW: torch.Tensor  # [G*H]
    bR: torch.Tensor  # [G*H]


def layer_views(cfg: RNNConfig, params: torch.Tensor) -> list[LayerParams]:
    """Zero-copy views of every pseudo-layer's tensors in a flat params buffer."""
    G, H, Hout, P = cfg.num_gates, cfg.num_units, cfg.out_size, cfg.num_proj
    layout, _ = _layout(cfg)
    views = []
    for off in layout:
        W = None
        if off.w >= 0:
            W = params[off.w : off.w + G * H * off.in_w].view(G * H, off.in_w)
        Pw = params[off.p : off.p + P * H].view(P, H) if off.p >= 0 else None
        views.append(
            LayerParams(
                W=W,
                R=params[off.r : off.r + G * H * Hout].view(G * H, Hout),
                Pw=Pw,
                bW=params[off.bw : off.bw + G * H],
                bR=params[off.br : off.br + G * H],
            )
        )
    return views


def canonical_shapes(cfg: RNNConfig) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Shapes of the canonical weight and bias lists, in canonical order."""
    G, H, Hout, P = cfg.num_gates, cfg.num_units, cfg.out_size, cfg.num_proj
    weights: list[tuple[int, ...]] = []
    biases: list[tuple[int, ...]] = []
    for layer in range(cfg.num_layers):
        for _ in range(cfg.num_dirs):
            if cfg.has_input_weights(layer):
                weights += [(H, cfg.layer_input_size(layer))] * G
            weights += [(H, Hout)] * G
            if P:
                weights.append((P, H))
            biases += [(H,)] * (2 * G)
    return weights, biases


def _config_from_keywords(
    rnn_mode: str,
    num_layers: int,
    num_units: int,
    input_size: int,
    input_mode: str,
    direction: str,
    num_proj: int,
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
) -> RNNConfig:
    """The helpers' configuration. dropout, seed and seed2 are attributes of TensorFlow's
    params ops too: checked as the RNN ops check them, and without effect on the layout."""
    return make_config(
        rnn_mode=rnn_mode,
        num_layers=num_layers,
        num_units=num_units,
        input_size=input_size,
        input_mode=input_mode,
        direction=direction,
        num_proj=num_proj,
        dropout=dropout,
        seed=seed,
        seed2=seed2,
    )


def params_size(
    *,
    rnn_mode: str = "lstm",
    num_layers: int,
    num_units: int,
    input_size: int,
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
) -> int:
    """CudnnRNNParamsSize: the number of elements of the flat params buffer (dropout, seed,
    seed2: TensorFlow's attributes of the op, checked; the size does not depend on them)."""
    cfg = _config_from_keywords(
        rnn_mode, num_layers, num_units, input_size, input_mode, direction, num_proj,
        dropout, seed, seed2,
    )
    return config_params_size(cfg)


def canonical_to_params(
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    *,
    rnn_mode: str = "lstm",
    num_layers: int,
    num_units: int,
    input_size: int,
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
) -> torch.Tensor:
    """CudnnRNNCanonicalToParams: concatenates canonical weights and biases into one buffer.

    weights/biases are lists in canonical order (see the module docstring) whose shapes must
    match exactly; a 1-D tensor of `params_size(...)` elements is returned.
    """
    cfg = _config_from_keywords(
        rnn_mode, num_layers, num_units, input_size, input_mode, direction, num_proj,
        dropout, seed, seed2,
    )
    w_shapes, b_shapes = canonical_shapes(cfg)
    for arg, tensors, shapes in (("weights", weights, w_shapes), ("biases", biases, b_shapes)):
        if not isinstance(tensors, (list, tuple)):
            raise TypeError(f"{arg}: expected a list of tensors, got {type(tensors).__name__}")
        if len(tensors) != len(shapes):
            raise ValueError(f"{arg}: expected {len(shapes)} tensors, got {len(tensors)}")
        for i, (t, shape) in enumerate(zip(tensors, shapes, strict=True)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{arg}[{i}]: expected a tensor, got {type(t).__name__}")
            check_dense(f"{arg}[{i}]", t)
            if tuple(t.shape) != shape:
                raise ValueError(
                    f"{arg}[{i}]: expected shape {list(shape)}, got {list(t.shape)}"
                )
    tensors = list(weights) + list(biases)
    ref = tensors[0]
    _check_float("weights[0]", ref.dtype)
    named = [("weights", i) for i in range(len(weights))]
    named += [("biases", i) for i in range(len(biases))]
    for (arg, i), t in zip(named, tensors, strict=True):
        if t.dtype != ref.dtype or t.device != ref.device:
            raise TypeError(
                f"{arg}[{i}]: expected dtype {ref.dtype} on {ref.device} (weights[0]'s), "
                f"got {t.dtype} on {t.device}"
            )
    return torch.cat([t.reshape(-1) for t in tensors])


def params_to_canonical(
    params: torch.Tensor,
    *,
    rnn_mode: str = "lstm",
    num_layers: int,
    num_units: int,
    input_size: int,
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """CudnnRNNParamsToCanonical: splits the flat buffer into canonical weights and biases.

    Returns (weights, biases) as views of `params` in canonical order.
    """
    cfg = _config_from_keywords(
        rnn_mode, num_layers, num_units, input_size, input_mode, direction, num_proj,
        dropout, seed, seed2,
    )
    check_params_tensor(cfg, params)
    w_shapes, b_shapes = canonical_shapes(cfg)
    out: list[torch.Tensor] = []
    pos = 0
    for shape in w_shapes + b_shapes:
        n = 1
        for s in shape:
            n *= s
        out.append(params[pos : pos + n].view(shape))
        pos += n
    return out[: len(w_shapes)], out[len(w_shapes) :]


def check_dense(name: str, t: torch.Tensor) -> None:
    """A TypeError naming `name` for a tensor that is not dense (sparse, nested, mkldnn):
    the ops reshape, view and launch kernels on strided storage, and such a tensor would fail
    deep inside instead (a reshape or data-pointer RuntimeError)."""
    if t.is_nested or t.layout != torch.strided:
        got = "a nested tensor" if t.is_nested else f"layout {t.layout}"
        raise TypeError(f"{name}: expected a dense tensor (layout torch.strided), got {got}")


def check_params_tensor(cfg: RNNConfig, params: object, sizes_from: str = "") -> None:
    """`params` a 1-D float tensor of `cfg`'s size. `sizes_from`: where the configuration's
    sizes came from, for the message (the op's: its tensors' shapes)."""
    if not isinstance(params, torch.Tensor):
        raise TypeError(f"params: expected a tensor, got {type(params).__name__}")
    check_dense("params", params)
    if params.dim() != 1:
        raise ValueError(f"params: expected a 1-D tensor, got shape {list(params.shape)}")
    _check_float("params", params.dtype)
    expected = config_params_size(cfg)
    if params.numel() != expected:
        raise ValueError(
            f"params: expected {expected} elements for this configuration "
            f"({cfg.rnn_mode}, num_layers={cfg.num_layers}, num_units={cfg.num_units}, "
            f"input_size={cfg.input_size}, num_proj={cfg.num_proj}, "
            f"{'bidirectional' if cfg.bidirectional else 'unidirectional'}, "
            f"{'skip_input' if cfg.skip_input else 'linear_input'}"
            f"{'; ' + sizes_from if sizes_from else ''}), got {params.numel()}"
        )


# The dtypes of the ops' tensors (CudnnRNNV3's T).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_float(name: str, dtype: torch.dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16, float32 or float64, "
                        f"got {dtype}")
