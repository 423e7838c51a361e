"""The payoff check's choices are kept across processes (terra_core/runtime/payoff_memory.h).

A process that runs a program again starts each loop from the choice an earlier process's check
made for it on this machine, instead of timing both modes again. The choices here are forced
with the margin (-1: eager execution always wins; 100: co-execution does), so they do not depend
on this machine's timing; the results stay bitwise eager's whichever mode runs.
"""
import json
import os
import struct
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


# runtime/payoff_memory.h's record (format 2): key, tag | hold << 8 | flags, the two times, three
# pairs, how many of them.
RECORD = struct.Struct("<QQdd3fI")
TAG, CHOSEN, PAIRING = 0x7E77A9A4 << 32, 16, 32


def records(cache):
    """The payoff memory's records in the cache directory, oldest first: (key, flags, pairs)."""
    (path,) = cache.glob("payoff_choices-*.bin")
    data = path.read_bytes()
    out = []
    for at in range(0, len(data) - RECORD.size + 1, RECORD.size):
        key, tagged, _, _, *pairs, n = RECORD.unpack_from(data, at)
        out.append((key, tagged & 0xFF, pairs[:n]))
    return path, out


def leave_pairing(cache, pairs):
    """The cache file as a process leaves it that ended while its check paired the modes of the
    loop the file's last record is for, with `pairs` (t(eager) / t(co-executed)) done."""
    path, recs = records(cache)
    key = recs[-1][0]
    with open(path, "ab") as f:
        f.write(RECORD.pack(key, TAG | PAIRING, 0.0, 0.0, *(pairs + [0.0] * (3 - len(pairs))), len(pairs)))
    return key


def test_a_pairing_an_earlier_process_left_goes_on_from_its_pairs(tmp_path):
    # With the margin at 100 co-execution wins any check of this program's by itself; an earlier
    # process left a pairing with three pairs in which eager execution took a thousandth of
    # co-execution's time: the fourth pair, whatever its ratio, decides for eager execution by the
    # median, and no mode is timed alone first. Remembering nothing, the check co-executes.
    first = run(tmp_path, 100.0)
    assert first["payoff"]["choice"] == "co-execute", first["payoff"]
    leave_pairing(tmp_path, [0.001] * 3)
    later = run(tmp_path, 100.0, steps=40)
    assert later["same"]
    payoff = later["payoff"]
    assert payoff["pairing_remembered"] and not payoff["remembered"], payoff
    assert payoff["checks"] == 1 and payoff["choice"] == "eager", payoff


def test_a_pairing_is_kept_after_each_pair_and_taken_up_where_it_stopped(tmp_path):
    # Two pairs left (eager execution a thousandth of co-execution's time); this process completes
    # the third, which is kept with them, and the fourth decides: the median of the four is the
    # mean of the earlier runs' 0.001 and the smaller of this run's, so co-execution, kept within
    # the margin of 100, wins.
    run(tmp_path, 100.0)
    key = leave_pairing(tmp_path, [0.001] * 2)
    later = run(tmp_path, 100.0, steps=40)
    assert later["same"]
    payoff = later["payoff"]
    assert payoff["pairing_remembered"] and payoff["checks"] == 1, payoff
    assert payoff["choice"] == "co-execute", payoff
    _, recs = records(tmp_path)
    kept = [pairs for k, flags, pairs in recs if k == key and flags & PAIRING and not flags & CHOSEN]
    assert len(kept[-1]) == 3, recs  # the third pair, after the two left
    assert kept[-1][:2] == pytest.approx([0.001, 0.001]) and kept[-1][2] > 0.01, kept
    # The choice after it, kept after the pairing's records.
    assert recs[-1][0] == key and recs[-1][1] & CHOSEN and not recs[-1][1] & PAIRING, recs[-1]
