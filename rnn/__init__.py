"""tritonrnn.rnn: the CudnnRNN V3 op API, its autograd, the engine, planner and references."""

from .modules import GRU, LSTM, RNN
from .ops import CudnnRNNBackpropOutput, CudnnRNNOutput, cudnn_rnn, cudnn_rnn_backprop
from .params import canonical_to_params, params_size, params_to_canonical
from .planner import (
    Plan,
    device_properties,
    output_tensor_array,
    plan_constraints,
    plan_for,
    tensorarray_allocator,
)

__all__ = [
    "CudnnRNNBackpropOutput",
    "CudnnRNNOutput",
    "GRU",
    "LSTM",
    "Plan",
    "RNN",
    "canonical_to_params",
    "cudnn_rnn",
    "cudnn_rnn_backprop",
    "device_properties",
    "output_tensor_array",
    "params_size",
    "params_to_canonical",
    "plan_constraints",
    "plan_for",
    "tensorarray_allocator",
]
