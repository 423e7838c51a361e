"""Co-execution of programs whose tensors live on CUDA (skipped without a GPU).

The GraphRunner enqueues each op on the stream the program had current (terra_core/runtime/
streams.h), so results must equal eager execution's (bitwise where the kernels are deterministic,
which these programs are chosen to be: no atomics-based backward), fetches must see finished
values, and work the program puts on a side stream must stay on it.
"""
import contextlib

import pytest
import torch

import terra

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def fresh_graphs():
    terra.reset()
    yield
    terra.reset()


def mlp_training(steps=40, stream=None, log=None):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32, device=device)
    y = torch.randint(0, 4, (16,), device=device)
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for step in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if log is not None and step % 5 == 0:
                log.append(round(loss.item(), 6))  # a fetch: must see this step's value
            if loss.item() < 0.05:  # a data-dependent stop, every step
                break
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in model.parameters()]


def test_cuda_training_matches_eager_and_coexecutes():
    eager_log, terra_log = [], []
    eager = mlp_training(log=eager_log)
    result = terra.run(mlp_training, log=terra_log)
    assert terra_log == eager_log
    for a, b in zip(eager, result):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    stats = terra.stats("mlp_training")
    assert stats["iterations_coexecuted"] > stats["iterations_traced"]


def test_cuda_side_stream_is_kept():
    side = torch.cuda.Stream()
    eager = mlp_training(steps=20, stream=side)
    result = terra.run(mlp_training, steps=20, stream=side)
    for a, b in zip(eager, result):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert terra.stats("mlp_training")["iterations_coexecuted"] > 0
