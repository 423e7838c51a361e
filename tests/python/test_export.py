"""What the viewers get from the engine: `terra.graph_json` and `terra.timeline`.

The graph export must describe the graph that actually ran: its blocks partition the nodes the
program followed, the last path walks recorded edges, branch points start new switch-cases,
fallbacks point at the node the iteration left after, and the counts agree with `terra.stats()`.
The timeline must show one Python-lane span per iteration, tagged as `terra.stats()` counts them,
and GraphRunner spans only for co-executed work.
"""
import collections

import pytest
import torch

import terra


@pytest.fixture(autouse=True)
def fresh_graphs():
    terra.reset()
    yield
    terra.reset()


def branchy(steps=24, new_branch_at=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, 5), torch.randn(16, 1)
    for step in range(steps):
        out = model(x)
        if step % 3 == 0:
            out = out * 0.5  # a second path, taken every third iteration
        if new_branch_at is not None and step >= new_branch_at:
            out = out + 1.0  # a path not seen before step `new_branch_at`
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_graph_json_describes_the_recorded_graph():
    terra.run(branchy)
    g = terra.graph_json()
    assert g["name"] == "branchy"
    # The core's export schema over the one TraceGraph: ids are its dense node ids, the virtual
    # entry (0) and exit (1) included; an edge's id is its place in control_edges.
    assert [n["id"] for n in g["nodes"]] == list(range(len(g["nodes"])))
    assert [n["kind"] for n in g["nodes"][:2]] == ["entry", "exit"]
    assert [e["id"] for e in g["control_edges"]] == list(range(len(g["control_edges"])))
    nodes = {n["id"]: n for n in g["nodes"][2:]}
    ops = [e for e in g["control_edges"] if e["from"] in nodes and e["to"] in nodes]
    assert g["stats"] == terra.stats("branchy")
    assert (g["stats"]["nodes"], g["stats"]["edges"]) == (len(nodes), len(ops))
    ids = set(nodes)

    # Blocks: disjoint, made of known nodes, covering every node a path followed.
    in_blocks = [i for b in g["blocks"] for i in b["nodes"]]
    assert len(in_blocks) == len(set(in_blocks))
    assert set(in_blocks) <= ids
    followed = {e["from"] for e in ops} | {e["to"] for e in ops}
    assert followed <= set(in_blocks)
    # The branch every third step: the graph forks, so there are several switch-cases and some
    # block is entered by more than one edge or starts after a fork.
    assert len(g["blocks"]) >= 3
    assert len(g["switch_cases"]) == len(g["blocks"])
    for case in g["switch_cases"]:
        for e in case["entering"]:
            assert g["control_edges"][e]["to"] == g["blocks"][case["block"]]["nodes"][0]

    # The last path walks recorded edges from an iteration marker.
    edges = {(e["from"], e["to"]) for e in ops}
    path = g["last_path"]
    assert nodes[path[0]]["kind"] == "iteration"
    assert len(path) > 5
    assert all((a, b) in edges for a, b in zip(path, path[1:]))

    # Edge counts: every node's successors were taken as often as the node was left (each
    # iteration leaves each node it visits at most once, except the last node of the iteration).
    by_op = collections.Counter(n["op"] for n in g["nodes"])
    assert by_op["aten::mse_loss"] >= 1 and by_op["backward"] >= 1
    mul = [n for n in g["nodes"] if n["op"] == "aten::mul.Tensor"]
    assert mul and mul[0]["count"] == 8  # steps 0, 3, ..., 21
    assert all(n["shapes"] for n in g["nodes"] if n["kind"] == "graph")


def test_graph_json_marks_the_fallback_point():
    terra.run(branchy, steps=20, new_branch_at=14)
    g = terra.graph_json("branchy")
    assert g["fallbacks"], "the new branch must have fallen back once"
    f = g["fallbacks"][0]
    assert f["op"] == "aten::add.Tensor"
    assert f["node"] is not None
    left_after = {n["id"]: n for n in g["nodes"]}[f["node"]]
    assert left_after["fallback"] is True
    # The iteration left right after the linear layer's output (or its scaled version).
    assert left_after["op"] in ("aten::linear", "aten::mul.Tensor")
    assert sum(n["fallback"] for n in g["nodes"]) == len({x["node"] for x in g["fallbacks"]})


def test_timeline_spans_match_the_stats():
    terra.run(branchy, steps=30)
    stats = terra.stats("branchy")
    tl = terra.timeline("branchy")
    modes = collections.Counter(i["mode"] for i in tl["iterations"])
    assert modes["coexec"] == stats["iterations_coexecuted"] > 0
    assert modes["traced"] == stats["iterations_traced"]
    assert modes["fallback"] == stats["iterations_fallback"]
    # Iterations follow each other without overlapping, in order.
    its = tl["iterations"]
    assert [i["index"] for i in its] == sorted(i["index"] for i in its)
    assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(its, its[1:]))
    assert all(i["start_ns"] <= i["end_ns"] for i in its)
    # The GraphRunner worked only for co-executed iterations.
    coexec = {i["index"] for i in its if i["mode"] == "coexec"}
    busy = [e for e in tl["events"] if e["lane"] == "graph"]
    assert busy and all(e["kind"] == "busy" and e["iteration"] in coexec for e in busy)
    assert all("ops" in e["detail"] for e in busy)


def test_timeline_records_the_wait_of_a_divergence():
    terra.run(branchy, steps=20, new_branch_at=14)
    events = terra.timeline("branchy")["events"]
    diverge = [e for e in events if e["kind"] == "diverge"]
    assert len(diverge) == 1
    assert "aten::add.Tensor" in diverge[0]["detail"]
    its = {i["index"]: i for i in terra.timeline("branchy")["iterations"]}
    assert its[diverge[0]["iteration"]]["mode"] == "fallback"


def test_reset_clears_the_timeline_and_unknown_graph_raises():
    terra.run(branchy, steps=6)
    assert terra.timeline()["events"]
    terra.reset()
    assert terra.timeline()["events"] == []
    with pytest.raises(KeyError):
        terra.graph_json("no such graph")


def test_timeline_last_keeps_the_newest_iterations():
    terra.run(branchy, steps=30)
    everything = terra.timeline("branchy")["iterations"]
    newest = terra.timeline("branchy", last=5)["iterations"]
    assert [i["index"] for i in newest] == [i["index"] for i in everything][-len(newest):]
    assert 1 <= len(newest) <= 5
