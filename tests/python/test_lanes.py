"""Kernel lanes (terra_core/runtime/kernel_lanes.h): while the program thread waits for the
GraphRunner, it runs independent kernels of the replayed backward itself, with eager's bits."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import terra


@pytest.fixture(autouse=True)
def lanes_on(fresh_graphs):  # tests/python/conftest.py
    terra.config(replay=True, lanes=True)


class Branches(torch.nn.Module):
    """Four independent branches: each one's backward kernels are free of the others', and its
    elementwise ones (over 256x512 values) are long enough to be worth the program thread."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ModuleList(torch.nn.Linear(192, 512) for _ in range(4))
        self.down = torch.nn.ModuleList(torch.nn.Linear(512, 192) for _ in range(4))
        self.head = torch.nn.Linear(192, 1)

    def forward(self, x):
        out = 0
        for up, down in zip(self.up, self.down):
            h = torch.tanh(up(x))
            out = out + down(h * torch.sigmoid(h))
        return self.head(out)


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


def helped_with(**settings):
    """Trains under `settings` (terra.config) and returns the graph's stats, having checked the
    results against eager's and that iterations were replayed."""
    terra.config(**settings)
    try:
        (me, le), (mc, lc) = branches_train(20), terra.run(branches_train, 20)
    finally:
        terra.config(worker_spin="auto")
    assert le == lc
    s = terra.stats("branches_train")
    assert s["iterations_replayed"] >= 10, s
    return s


def test_no_lanes_while_the_workers_spin():
    s = helped_with(worker_spin="spin")
    assert s["kernels_run_by_waiting_program"] == 0, s


def test_lanes_turned_off_leave_the_program_thread_waiting():
    s = helped_with(lanes=False, worker_spin="sleep")
    assert s["kernels_run_by_waiting_program"] == 0, s


def test_lanes_are_off_by_default_and_on_with_terra_lanes_1():
    env = {k: v for k, v in os.environ.items() if k != "TERRA_LANES"}
    ask = [sys.executable, "-c", "import terra; print(terra.config()['lanes'])"]
    assert subprocess.run(ask, env=env, capture_output=True, text=True, check=True).stdout.strip() == "False"
    env["TERRA_LANES"] = "1"
    assert subprocess.run(ask, env=env, capture_output=True, text=True, check=True).stdout.strip() == "True"
