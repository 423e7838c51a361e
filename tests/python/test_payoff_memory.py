"""The payoff check's choices are kept across processes (terra_core/runtime/payoff_memory.h).

A process that runs a program again starts each loop from the choice an earlier process's check
made for it on this machine, instead of timing both modes again. The choices here are forced
with the margin (-1: eager execution always wins; 100: co-execution does), so they do not depend
on this machine's timing; the results stay bitwise eager's whichever mode runs.
"""
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, sys
import torch
import terra

def train(steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 6), torch.randn(64, 1)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[step % 4::4]), y[step % 4::4])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses

def train_edited(steps):  # the same ops, written as a notebook cell edited and run again would be
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 6), torch.randn(64, 1)
    losses = []
    step = 0
    while step < steps:
        opt.zero_grad()
        pred = model(x[step % 4::4])
        loss = torch.nn.functional.mse_loss(pred, y[step % 4::4])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
    return model, losses

terra.config(adaptive=True, payoff_margin=float(sys.argv[1]), worker_spin="spin")
steps = int(sys.argv[2])
if len(sys.argv) > 3:  # the original first, then the edited one in the same process
    terra.run(train, steps)
    terra.sync()
    terra.reset()
    train = train_edited
model, losses = terra.run(train, steps)
terra.sync()
s = terra.stats()
eager_model, eager_losses = train(steps)
same = losses == eager_losses and all(torch.equal(p, q) for p, q in zip(model.parameters(), eager_model.parameters()))
print(json.dumps({"payoff": terra._c().stats(train.__name__)["payoff"], "coexecuted": s["iterations_coexecuted"],
                  "traced": s["iterations_traced"],
                  "eager_chosen": s["iterations_eager_chosen"], "same": same,
                  "cache": terra._c().runner_counts()["payoff_cache"]}))
"""


def run(cache, margin, steps=40, remember=True, edited=False):
    env = dict(os.environ, TERRA_CACHE_DIR=str(cache), TERRA_REMEMBER_PAYOFF="1" if remember else "0")
    child = cache / "child.py"  # terra.run marks the loops of functions it can read the source of
    child.write_text(CHILD)
    out = subprocess.run([sys.executable, str(child), str(margin), str(steps)] + (["edited"] if edited else []),
                         capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("margin,eager", [(-1.0, True), (100.0, False)])
def test_a_later_process_starts_from_the_choice_an_earlier_one_made(tmp_path, margin, eager):
    first = run(tmp_path, margin)
    assert first["same"]
    assert first["cache"].startswith(str(tmp_path)), first
    assert first["payoff"]["checks"] >= 1 and not first["payoff"]["remembered"], first["payoff"]
    assert first["payoff"]["choice"] == ("eager" if eager else "co-execute")
    # Timing both modes: the first process co-executed some iterations and ran some eagerly.
    assert first["coexecuted"] >= 3 and first["eager_chosen"] >= 1, first

    later = run(tmp_path, margin, steps=20)  # within the hold (at least Payoff::kFirstHold, 32)
    assert later["same"]
    payoff = later["payoff"]
    assert payoff["remembered"] and payoff["checks"] == 0, payoff
    assert payoff["phase"] == "holding" and payoff["choice"] == first["payoff"]["choice"], payoff
    # Held from its first stable iteration: the mode not chosen never ran.
    if eager:
        assert later["coexecuted"] == 0 and later["eager_chosen"] > 0, later
        # From the loop's second iteration: its first was traced (the key is its ops), the rest of
        # its warm-up is not.
        assert later["traced"] < first["traced"], (later["traced"], first["traced"])
    else:
        assert later["eager_chosen"] == 0 and later["coexecuted"] > 0, later


def test_nothing_is_remembered_when_turned_off_or_for_another_margin(tmp_path):
    run(tmp_path, -1.0)
    off = run(tmp_path, -1.0, remember=False)
    assert not off["payoff"]["remembered"] and off["coexecuted"] >= 3, off
    # The margin is part of what the choice was made by: another one is another measurement.
    other = run(tmp_path, -0.99)
    assert not other["payoff"]["remembered"] and other["coexecuted"] >= 3, other


def test_the_same_ops_written_otherwise_start_from_the_choice_made_for_them(tmp_path):
    # A notebook cell edited and run again is another graph (another loop, other call stacks)
    # doing the same computation: it starts from the choice made for the cell before the edit.
    edited = run(tmp_path, -1.0, steps=20, edited=True)
    assert edited["same"]
    assert edited["payoff"]["remembered"] and edited["payoff"]["checks"] == 0, edited["payoff"]
    assert edited["coexecuted"] == 0 and edited["eager_chosen"] > 0, edited
