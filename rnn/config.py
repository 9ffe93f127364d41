"""The static configuration of one CudnnRNN call, validated once at the public boundary.

`RNNConfig` holds everything that decides shapes and math but not the data itself: the mode
strings, layer/hidden/projection sizes, the dropout seeds and the memory layout attributes.
Every public entry point builds one with `make_config`, which raises a ValueError/TypeError
naming the argument, the expected and the given value for every bad attribute.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

RNN_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
INPUT_MODES = ("linear_input", "skip_input", "auto_select")
DIRECTIONS = ("unidirectional", "bidirectional")
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return value


def check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """An int attribute as a Python int: Python and NumPy integers are taken (TensorFlow's
    int attributes take both), bools are not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"{name}: expected an int in [{minimum}, {maximum}], got {value}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_dropout(value: object) -> float:
    """The dropout attribute as a Python float in [0, 1) (Python and NumPy reals)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"dropout: expected a float in [0, 1), got {type(value).__name__}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"dropout: expected a float in [0, 1), got {value}")
    return float(value)


def check_int64(name: str, value: object) -> int:
    """An int64 attribute (TensorFlow's seeds, and the torch.library op schema's ints)."""
    return check_int(name, value, minimum=-(2**63), maximum=2**63 - 1)


@dataclass(frozen=True)
class RNNConfig:
    """Shapes and attributes of one RNN stack (everything but T, B and the data).

    `skip_input` is the resolved input mode (auto_select already decided).
    """

    rnn_mode: str
    num_layers: int
    num_units: int
    input_size: int
    skip_input: bool
    bidirectional: bool
    num_proj: int = 0
    dropout: float = 0.0
    seed: int = 0
    seed2: int = 0

    @property
    def num_gates(self) -> int:
        return GATES[self.rnn_mode]

    @property
    def num_dirs(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def out_size(self) -> int:
        """Hout: the size of h (the projection size when num_proj > 0)."""
        return self.num_proj if self.num_proj > 0 else self.num_units

    @property
    def is_lstm(self) -> bool:
        return self.rnn_mode == "lstm"

    def layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.num_dirs * self.out_size

    def has_input_weights(self, layer: int) -> bool:
        return not (layer == 0 and self.skip_input)

    @property
    def pseudo_layers(self) -> int:
        return self.num_layers * self.num_dirs

    def without_dropout(self) -> RNNConfig:
        """This configuration with dropout and seeds 0: all that the params' and reserve's
        layouts depend on (a cache keyed by the whole configuration would take one entry
        per seed pair, and the modules draw a new pair every training step)."""
        if self.dropout == 0 and self.seed == 0 and self.seed2 == 0:
            return self
        return replace(self, dropout=0.0, seed=0, seed2=0)


INT32_MAX = 2**31 - 1


def params_count(rnn_mode: str, L: int, H: int, I: int, D: int, P: int) -> int:
    """The flat params' element count in closed form (params.py's layout walks the layers;
    tests/test_ops_api.py checks the two agree). I = 0 under skip_input."""
    G = {"lstm": 4, "gru": 3}.get(rnn_mode, 1)
    Hout = P or H
    per_layer = G * H * Hout + P * H + 2 * G * H  # R, Pw, both biases
    return D * (G * H * I + (L - 1) * G * H * D * Hout + L * per_layer)


def _check_params_count(rnn_mode: str, L: int, H: int, I: int, D: int, P: int) -> None:
    """The flat params' element count must be an int64: torch's sizes, and the op schema's
    ints."""
    count = params_count(rnn_mode, L, H, I, D, P)
    if count > 2**63 - 1:
        raise ValueError(f"num_units, input_size, num_layers: expected a params buffer of at "
                         f"most 2**63 - 1 elements, got {count} (num_layers={L}, num_units={H}, "
                         f"input_size={I}, num_proj={P})")


def make_config(
    *,
    rnn_mode: str,
    num_layers: int,
    num_units: int,
    input_size: int,
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
) -> RNNConfig:
    """Validates the attributes of CudnnRNN(V3) and resolves input_mode."""
    check_choice("rnn_mode", rnn_mode, RNN_MODES)
    check_choice("input_mode", input_mode, INPUT_MODES)
    check_choice("direction", direction, DIRECTIONS)
    num_layers = check_int("num_layers", num_layers, minimum=1)
    num_units = check_int("num_units", num_units, minimum=1)
    input_size = check_int("input_size", input_size, minimum=1)
    num_proj = check_int("num_proj", num_proj, minimum=0)
    seed = check_int64("seed", seed)
    seed2 = check_int64("seed2", seed2)
    if num_proj > 0:
        if rnn_mode != "lstm":
            raise ValueError(
                f"num_proj: expected 0 for rnn_mode={rnn_mode!r} (projection is LSTM only), "
                f"got {num_proj}"
            )
        if num_proj > num_units:
            raise ValueError(
                f"num_proj: expected a value in (0, num_units={num_units}], got {num_proj}"
            )
    for name, value in (("num_layers", num_layers), ("num_units", num_units),
                        ("input_size", input_size), ("num_proj", num_proj)):
        if value > INT32_MAX:
            raise ValueError(f"{name}: expected at most {INT32_MAX} (TensorFlow's int32 "
                             f"sizes), got {value}")
    dropout = check_dropout(dropout)
    if input_mode == "auto_select":
        skip = input_size == num_units
    else:
        skip = input_mode == "skip_input"
        if skip and input_size != num_units:
            raise ValueError(
                f"input_mode: 'skip_input' needs input size == num_units ({num_units}), "
                f"got input size {input_size}"
            )
    _check_params_count(rnn_mode, num_layers, num_units, 0 if skip else input_size,
                        2 if direction == "bidirectional" else 1, num_proj)
    return RNNConfig(
        rnn_mode=rnn_mode,
        num_layers=num_layers,
        num_units=num_units,
        input_size=input_size,
        skip_input=skip,
        bidirectional=direction == "bidirectional",
        num_proj=num_proj,
        dropout=float(dropout),
        seed=seed,
        seed2=seed2,
    )
