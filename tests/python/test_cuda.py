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


# Blocks on CUDA: an accelerator's backward runs on the autograd engine's device thread, which the
# recorder follows (terra_core/runtime/block_replay.h); replayed iterations launch the recorded
# kernels on the program's stream, below autograd. Bitwise equal to eager: every kernel here is
# deterministic (no atomics in these backwards) and dropout draws from the CUDA generator in the
# same order. Off by default until a device run has passed these (Policy::accelerator_blocks).
@pytest.fixture
def accelerator_blocks():
    before = terra.config()["accelerator_blocks"]
    terra.config(accelerator_blocks=True)
    yield
    terra.config(accelerator_blocks=before)


def cuda_fit(steps=30, stream=None, dropout=0.0, adam=False, cpu_part=False):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                torch.nn.Linear(64, 4)).to(device)
    extra = torch.nn.Parameter(torch.randn(8))  # on the CPU: a backward on two devices
    params = list(model.parameters()) + ([extra] if cpu_part else [])
    opt = (torch.optim.Adam(params, lr=1e-3) if adam else torch.optim.SGD(params, lr=0.05, momentum=0.9))
    x = torch.randn(16, 32, device=device)
    y = torch.randint(0, 4, (16,), device=device)
    losses = []
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if cpu_part:
                loss = loss + (extra * extra).sum().to(device)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.cuda.synchronize()
        return [p.detach().cpu() for p in params], [float(v) for v in losses]


@pytest.mark.parametrize("variant", ["sgd", "adam_dropout", "side_stream"])
def test_cuda_blocks_are_replayed_bitwise(variant, accelerator_blocks):
    stream = torch.cuda.Stream() if variant == "side_stream" else None
    kw = dict(stream=stream, dropout=0.2 if variant == "adam_dropout" else 0.0, adam=variant == "adam_dropout")
    eager = cuda_fit(**kw)
    result = terra.run(cuda_fit, **kw)
    assert eager[1] == result[1]
    assert all(torch.equal(a, b) for a, b in zip(eager[0], result[0]))
    s = terra.stats("cuda_fit")
    assert s["blocks_recorded"] >= 1, s
    assert s["iterations_replayed"] >= 10, s


def test_a_backward_on_the_cpu_and_cuda_keeps_the_autograd_route(accelerator_blocks):
    eager = cuda_fit(steps=20, cpu_part=True)
    result = terra.run(cuda_fit, steps=20, cpu_part=True)
    assert eager[1] == result[1]
    assert all(torch.equal(a, b) for a, b in zip(eager[0], result[0]))
    s = terra.stats("cuda_fit")
    assert s["iterations_replayed"] == 0, s
    assert "CPU and an accelerator" in s["replay_refusal"], s


def test_cuda_blocks_are_off_by_default_and_say_so():
    eager = cuda_fit(steps=15)
    result = terra.run(cuda_fit, steps=15)
    assert all(torch.equal(a, b) for a, b in zip(eager[0], result[0]))
    s = terra.stats("cuda_fit")
    assert s["iterations_replayed"] == 0 and "accelerator_blocks=True" in s["replay_refusal"], s
