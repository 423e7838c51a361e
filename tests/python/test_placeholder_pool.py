"""Dropped output placeholders handed out again (PlaceholderPool, terra_core/runtime/placeholder.h).

While co-executing, a small op's output placeholder that the program has dropped (no Python
reference, attribute, weak reference or hook left) is kept and returned again as the same node's
output a later iteration, instead of a new tensor and Python object. Nothing about it may differ
from a new tensor: each test runs a loop eagerly and co-executed and compares what the program saw
(values, attributes, weak references, version counters, what the cyclic collector lists), and
checks from the graph's counters that placeholders were reused at all.
"""
import gc
import weakref

import pytest
import torch

import terra
from terra import _C


@pytest.fixture(autouse=True)
def fast_path_on(fresh_graphs):  # tests/python/conftest.py
    terra.config(fast_path=True, adaptive=False)  # co-executed, whichever way is faster


def operands():
    g = torch.Generator().manual_seed(5)
    return torch.rand(3, 7, generator=g), torch.rand(3, 7, generator=g)


def reused(name):
    s = terra.stats(name)
    assert s["iterations_coexecuted"] >= 20, s
    return s["placeholders_reused"]


def test_a_chain_reuses_its_dropped_outputs_and_matches_eager():
    def chain(steps=60):
        x, y = operands()
        kept = []
        for i in range(steps):
            z = x
            for _ in range(10):
                z = z * 0.5 + y
            if i % 10 == 0:
                kept.append(z)  # held: never handed out again while the program has it
        return kept

    eager = chain()
    coexec = terra.run(chain)
    assert len({id(t) for t in coexec}) == len(coexec)
    assert all(torch.equal(a, b) for a, b in zip(eager, coexec))
    assert reused("test_a_chain_reuses_its_dropped_outputs_and_matches_eager.<locals>.chain") > 0


def test_a_tensor_with_an_attribute_or_a_weak_reference_is_never_handed_out_again():
    def loop(steps=600):
        x, y = operands()
        seen, refs, values = [], [], []
        for i in range(steps):
            a = x + y * i
            seen.append(hasattr(a, "tag"))  # a reused tensor would still carry the old one
            a.tag = i
            b = a * 2.0
            # Earlier iterations' weak references: dead or their old tensors, never this one.
            seen.append(any(r() is b for r in refs[-50:]))
            refs.append(weakref.ref(b))
            values.append(b.sum())
        return seen, torch.stack(values)

    eager_seen, eager_values = loop()
    seen, values = terra.run(loop)
    assert not any(eager_seen)
    assert seen == eager_seen
    assert torch.equal(values, eager_values)
    reused("test_a_tensor_with_an_attribute_or_a_weak_reference_is_never_handed_out_again.<locals>.loop")


def test_version_counters_move_as_in_eager_and_a_reused_tensor_starts_at_zero():
    def loop(steps=600):  # enough items that the executed ones are dropped while it runs
        x, y = operands()
        versions, values = [], []
        for _ in range(steps):
            c = x - y
            v = c[1]  # a view shares its base's version counter
            before = c._version
            c.add_(1.0)  # bumps it; the program then drops `c`
            versions.append((before, c._version, v._version))
            d = c * c
            values.append(d)
        return versions, values

    eager_versions, eager_values = loop()
    versions, values = terra.run(loop)
    assert versions == eager_versions == [(0, 1, 1)] * 600
    assert all(torch.equal(a, b) for a, b in zip(eager_values, values))
    assert reused("test_version_counters_move_as_in_eager_and_a_reused_tensor_starts_at_zero.<locals>.loop") > 0


def test_outputs_that_require_grad_are_reused_and_training_matches_eager():
    def train(steps=400):
        torch.manual_seed(0)
        w = torch.randn(7, 5, requires_grad=True)
        b = torch.zeros(5, requires_grad=True)
        opt = torch.optim.SGD([w, b], lr=0.05)  # in place: no new outputs of its own
        x, y = operands()
        losses = []
        for _ in range(steps):
            h = torch.tanh(x @ w + b)  # the small outputs here all require grad
            loss = ((h - y[:, :5]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return w.detach(), b.detach(), torch.stack(losses)

    eager = train()
    coexec = terra.run(train)
    assert all(torch.equal(a, c) for a, c in zip(eager, coexec))
    assert reused("test_outputs_that_require_grad_are_reused_and_training_matches_eager.<locals>.train") > 0


def test_the_cyclic_collector_lists_no_kept_placeholder_and_every_listed_tensor_reads():
    # gc.get_objects() (memory debugging snippets list every live tensor with it) must not find a
    # kept placeholder, nor a placeholder the program dropped while an item still reads it, whose
    # value is released right after that item (DeadValueWatch): eagerly both tensors were freed.
    # Reading every listed tensor raised before the latter were taken off the collector's lists.
    def loop(steps=200):
        x, y = operands()
        kinds, sums = set(), []
        for i in range(steps):
            z = x
            for _ in range(6):
                z = z + y
            if i % 20 == 19:
                # (type(), not isinstance: a dead weakref.proxy among the objects, as TorchDynamo
                # and TorchScript leave behind, raises ReferenceError on isinstance)
                found = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
                kinds.update(_C.placeholder_state(o) for o in found)
                for o in found:
                    if o.shape == (3, 7) and _C.placeholder_state(o) != "kept":
                        float(o.sum())
            sums.append(float(z.sum()))
        return kinds, sums

    eager_kinds, eager = loop()
    kinds, coexec = terra.run(loop)
    assert coexec == eager
    assert eager_kinds == {"tensor"} and "kept" not in kinds, kinds
    assert reused("test_the_cyclic_collector_lists_no_kept_placeholder_and_every_listed_tensor_reads.<locals>.loop") > 0
