"""DistributedDataParallel over tritonrnn modules: two CPU processes on gloo train on halves of
each batch; every step's averaged gradients and the final weights equal one process training
on the whole batch.

Tolerance: float64; the only differences are the order of the two-way gradient average and
the split of the loss mean (exact halves), so errors are a few ulps of the gradients: 1e-12
(measured: <= 1e-16).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from tritonrnn.rnn.modules import LSTM, RNN

F64 = torch.float64
V, E, H, C, T, B, STEPS = 13, 5, 6, 3, 6, 8, 3


class Tagger(nn.Module):
    """Embedding -> bidirectional 2-layer LSTM (with projection) on padded tokens + lengths
    -> relu RNN without biases on a PackedSequence -> linear on the final state."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E, dtype=F64)
        self.lstm = LSTM(E, H, num_layers=2, bidirectional=True, proj_size=4, batch_first=True,
                         dtype=F64, backend="reference")
        self.rnn = RNN(8, H, nonlinearity="relu", bias=False, batch_first=True, dtype=F64,
                       backend="reference")
        self.head = nn.Linear(H, C, dtype=F64)

    def forward(self, tokens, lengths):
        out, _ = self.lstm(self.emb(tokens), lengths=lengths)
        packed = pack_padded_sequence(out, lengths, batch_first=True, enforce_sorted=False)
        _, h = self.rnn(packed)
        return self.head(h[-1])


def _data(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    labels = torch.randint(0, C, (B,), generator=g)
    return tokens, lengths, labels


def _train(model, rank=0, world=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    grads = []
    share = B // world
    named = list(model.named_parameters())
    for step in range(STEPS):
        tokens, lengths, labels = (t[rank * share : (rank + 1) * share] for t in _data(step))
        opt.zero_grad()
        nn.functional.cross_entropy(model(tokens, lengths), labels).backward()
        grads.append({n: p.grad.detach().clone() for n, p in named})
        opt.step()
    return grads


def _worker(rank, world, init_file, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(rank)  # different init per rank: DDP must broadcast rank 0's
        model = Tagger()
        if rank == 0:
            torch.save(model.state_dict(), out_path + ".init")
        dist.barrier()
        ddp = nn.parallel.DistributedDataParallel(model)
        # The broadcast wrote into the parameters in place: still views of the flat buffers.
        assert model.lstm._flat_is_current() and model.rnn._flat_is_current()
        grads = _train(ddp, rank, world)
        if rank == 0:
            state = {k.removeprefix("module."): v for k, v in ddp.state_dict().items()}
            torch.save({"grads": grads, "state": state}, out_path)
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_match_single_process(tmp_path):
    out_path = str(tmp_path / "ddp.pt")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), out_path), nprocs=2, join=True)
    got = torch.load(out_path)
    model = Tagger()
    model.load_state_dict(torch.load(out_path + ".init"))
    want = _train(model)
    for step, (g_got, g_want) in enumerate(zip(got["grads"], want, strict=True)):
        for name, g in g_want.items():
            name_ddp = "module." + name
            assert name_ddp in g_got, name_ddp
            torch.testing.assert_close(g_got[name_ddp], g, rtol=1e-12, atol=1e-12,
                                       msg=lambda m, s=step, n=name: f"step {s} {n}: {m}")
    for name, p in model.state_dict().items():
        torch.testing.assert_close(got["state"][name], p, rtol=1e-12, atol=1e-12)
    assert "rnn.bias_ih_l0" not in got["state"]
    assert os.path.getsize(out_path) > 0
