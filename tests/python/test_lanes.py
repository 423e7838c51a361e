"""Kernel lanes (terra_core/runtime/kernel_lanes.h): while the program thread waits for the
GraphRunner, it runs independent kernels of the replayed backward itself, with eager's bits."""
import pytest
import torch
import torch.nn.functional as F

import terra


@pytest.fixture(autouse=True)
def replay_on(fresh_graphs):  # tests/python/conftest.py
    terra.config(replay=True)


class Branches(torch.nn.Module):
    """Four independent branches of two 192-wide layers: each one's backward kernels (two
    matmuls and a sum per layer) are free of the others', and long enough to be worth a thread."""

    def __init__(self):
        super().__init__()
        self.branches = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(192, 192), torch.nn.Tanh(), torch.nn.Linear(192, 192))
            for _ in range(4))
        self.head = torch.nn.Linear(192, 1)

    def forward(self, x):
        return self.head(sum(b(x) for b in self.branches))


def branches_train(steps):
    torch.manual_seed(0)
    model = Branches()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(256, 192), torch.randn(256, 1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # the program waits for the step: it helps with its backward
    return model, losses


@pytest.fixture
def workers_asleep():
    # Lanes run only while the GraphRunner's OpenMP workers sleep (the payoff check's choice for
    # programs such as hf_llama); the suite pins co-execution, so the test asks for it.
    terra.config(worker_spin="sleep")
    yield
    terra.config(worker_spin="auto")


def test_a_waiting_program_thread_runs_backward_kernels_with_eagers_bits(workers_asleep):
    (me, le), (mc, lc) = branches_train(25), terra.run(branches_train, 25)
    assert le == lc
    assert all(torch.equal(p, q) for p, q in zip(me.parameters(), mc.parameters()))
    s = terra.stats("branches_train")
    assert s["iterations_replayed"] >= 10, s
    assert s["kernels_run_by_waiting_program"] > 0, s


def test_no_lanes_while_the_workers_spin():
    terra.config(worker_spin="spin")
    try:
        (me, le), (mc, lc) = branches_train(20), terra.run(branches_train, 20)
    finally:
        terra.config(worker_spin="auto")
    assert le == lc
    s = terra.stats("branches_train")
    assert s["iterations_replayed"] >= 10, s
    assert s["kernels_run_by_waiting_program"] == 0, s
