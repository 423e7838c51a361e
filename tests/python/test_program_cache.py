"""The program thread's large CPU allocations come from Terra's caching allocator while a session is
open and it runs ops itself (Policy::program_cache, runner_allocator.h): traced, fallen-back and
eager steps then reuse their buffers instead of taking fresh pages from glibc. Values never depend on it: results and
parameters stay bitwise equal to eager execution. After the session the program thread's eager work
keeps taking its large blocks from the cache (freeing them at the session's end made the eager
steps after it fault 2-3x as many pages), within a smaller budget; off, nothing is kept."""
import pytest
import torch
import torch.nn.functional as F

import terra


def conv_train(steps):
    """A small CNN whose activations (32x16x16x16 floats, 512 KiB) are above the cache's 64 KiB."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 16 * 16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def hits():
    return terra._c().allocator_counts().get("hits", 0)


@pytest.mark.parametrize("enabled", [False, True], ids=["traced only", "co-executed"])
def test_a_session_reuses_the_program_threads_buffers_with_eagers_results(fresh_graphs, enabled):
    # Traced only (enabled=False): every op runs eagerly on the program thread, as in an eager
    # hold, and its activations and gradients come back from the cache step after step.
    terra.config(enabled=enabled, program_cache=True)
    eager_model, eager_losses = conv_train(12)
    before = hits()
    model, losses = terra.run(conv_train, 12)
    assert losses == eager_losses
    for a, b in zip(model.parameters(), eager_model.parameters()):
        assert torch.equal(a, b)
    assert hits() - before >= 12  # at least one reused buffer per step
    # Eager work after the session takes its large buffers from what the session left, and its
    # results are still eager's.
    counts = terra._c().allocator_counts()
    assert 0 < counts["cached_bytes"] <= counts["idle_budget_bytes"]
    before = hits()
    again_model, again_losses = conv_train(2)
    assert again_losses == eager_losses[:2]
    assert hits() - before >= 2


def test_after_a_session_only_the_program_threads_sizes_are_kept(fresh_graphs):
    # Co-executed: the GraphRunner's small blocks (biases, gradients of a few KiB) are cached while
    # the session runs; the program thread never takes blocks under 64 KiB, so none stays after it.
    terra.config(enabled=True, program_cache=True)
    terra.run(conv_train, 12)
    counts = terra._c().allocator_counts()
    assert counts["cached_bytes"] > 0
    assert all(size >= counts["program_min_bytes"] for size in counts["cached_sizes"])


def test_turning_the_cache_off_between_sessions_frees_it(fresh_graphs):
    terra.config(enabled=True, program_cache=True)
    terra.run(conv_train, 6)
    assert terra._c().allocator_counts()["cached_bytes"] > 0
    terra.config(program_cache=False)
    assert terra._c().allocator_counts()["cached_bytes"] == 0
    before = hits()
    conv_train(2)
    assert hits() == before


def test_off_the_program_thread_allocates_as_eager(fresh_graphs):
    terra.config(enabled=False, program_cache=False)
    eager_model, eager_losses = conv_train(6)
    before = hits()
    model, losses = terra.run(conv_train, 6)
    assert losses == eager_losses
    assert hits() == before


def test_the_setting_is_in_the_policy(fresh_graphs):
    assert terra.config()["program_cache"] is True  # the default (TERRA_PROGRAM_CACHE unset)
    assert terra.config(program_cache=False)["program_cache"] is False
