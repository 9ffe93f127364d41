"""tritonrnn.rnn: the CudnnRNN V3 op API, its autograd, the engine, planner and references."""

from .modules import GRU, LSTM, RNN
from .ops import CudnnRNNBackpropOutput, CudnnRNNOutput, cudnn_rnn, cudnn_rnn_backprop
from .params import canonical_to_params, params_size, params_to_canonical

__all__ = [
    "CudnnRNNBackpropOutput",
    "CudnnRNNOutput",
    "GRU",
    "LSTM",
    "RNN",
    "canonical_to_params",
    "cudnn_rnn",
    "cudnn_rnn_backprop",
    "params_size",
    "params_to_canonical",
]
