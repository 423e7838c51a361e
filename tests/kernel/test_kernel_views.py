"""The graph and timeline views over the Jupyter protocol: `%terra graph` / `%terra timeline`
open anywidget models whose state is what the engine exports (`terra.graph_json`,
`terra.timeline`), display them with static fallbacks, update them while a loop runs, export a
Chrome trace, and answer bad arguments with usage, not a traceback. Executed headless with
nbclient, the demo notebook keeps the views' state."""
import json
import xml.etree.ElementTree as ElementTree

import nbformat
import pytest
from nbclient import NotebookClient

from kernel_helpers import ROOT, WIDGET_VIEW, execute, opened_and_displayed, stdout

VEGA_LITE = "application/vnd.vegalite.v5+json"

TRAIN = '''
regularised = 0
for step in range(40):
    logits = model(X)
    loss = F.cross_entropy(logits, Y)
    if loss.item() > 1.2:  # data-dependent branch
        loss = loss + 0.01 * logits.pow(2).mean()
        regularised += 1
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", regularised)
'''

SETUP = '''
import json, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
X, Y = torch.randn(64, 16), torch.randint(0, 4, (64,))
'''


def ok(kc, code, timeout=120):
    reply, messages = execute(kc, code, timeout=timeout)
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert reply["status"] == "ok" and not errors, (reply, errors)
    return messages


@pytest.fixture(scope="module")
def kc(kernel):
    km, kc = kernel
    ok(kc, SETUP)
    ok(kc, TRAIN)
    return kc


def engine_json(kc, expression):
    """`expression` evaluated in the kernel without opening a Terra session of its own."""
    messages = ok(kc, f"%%terra off\nimport terra\nprint(json.dumps({expression}))")
    return json.loads(stdout(messages).strip().splitlines()[-1])


def test_graph_magic_opens_a_widget_with_the_engine_graph(kc):
    messages = ok(kc, "%terra graph")
    opened, shown = opened_and_displayed(messages, "AnyModel", "terra_kernel.views.GraphView")
    state = opened["data"]["state"]
    assert state["_view_name"] == "AnyView" and state["_model_module"] == "anywidget"
    assert "export default" in state["_esm"] and "terra-graph-view" in state["_esm"]
    assert ".terra-node" in state["_css"]
    graph = state["graph"]
    # The same graph the engine exports (the last graph run: the training cell's).
    exported = engine_json(kc, "terra.graph_json()")
    assert graph["name"] == exported["name"]
    assert len(graph["nodes"]) == len(exported["nodes"]) > 10
    assert graph["control_edges"] == exported["control_edges"]
    assert graph["blocks"] == exported["blocks"]
    assert graph["switch_cases"] == exported["switch_cases"]
    assert graph["last_path"] == exported["last_path"]
    assert [n["op"] for n in graph["nodes"]] == [n["op"] for n in exported["nodes"]]
    # What only the kernel adds: the cell and line behind each op.
    assert graph["cell"] == "In [2]"
    places = [n["where"] for n in graph["nodes"] if n.get("where")]
    assert {"cell": "In [2]", "line": 6, "function": "<module>",
            "code": "loss = loss + 0.01 * logits.pow(2).mean()"} in places
    # Fallbacks for frontends without widgets: a text summary and a static SVG of the blocks.
    data = shown["data"]
    assert f"{exported['stats']['nodes']} nodes" in data["text/plain"]
    svg = ElementTree.fromstring(data["image/svg+xml"])
    boxes = svg.findall("{http://www.w3.org/2000/svg}rect")
    assert len(boxes) == len(exported["blocks"])


def test_graph_text_stays_available(kc):
    text = stdout(ok(kc, "%terra graph --text"))
    assert "branch points" in text and "In [2]" in text
    assert not any(m["msg_type"] == "comm_open" for m in ok(kc, "%terra graph --text"))


def test_timeline_magic_opens_a_widget_with_both_lanes(kc):
    messages = ok(kc, "%terra timeline")
    opened, shown = opened_and_displayed(messages, "AnyModel", "terra_kernel.views.TimelineView")
    timeline = opened["data"]["state"]["timeline"]
    assert {e["lane"] for e in timeline["events"]} == {"python", "graph"}
    modes = {it["mode"] for it in timeline["iterations"]}
    assert {"traced", "coexec"} <= modes, modes
    exported = engine_json(kc, "terra.timeline(terra.graph_json()['name'])")
    assert timeline["iterations"] == exported["iterations"]
    # The static fallback: a Vega-Lite chart of the lanes and the step times.
    chart = shown["data"][VEGA_LITE]
    lanes, steps = chart["vconcat"]
    assert {v["lane"] for v in lanes["data"]["values"]} == {"Python thread", "GraphRunner"}
    assert len(steps["data"]["values"]) == len(exported["iterations"])


def test_steps_magic_shows_a_step_time_chart(kc):
    messages = ok(kc, "%terra steps")
    shown = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert len(shown) == 1 and VEGA_LITE in shown[0] and WIDGET_VIEW not in shown[0]
    values = shown[0][VEGA_LITE]["data"]["values"]
    assert {"coexec", "traced"} <= {v["mode"] for v in values}
    assert all(v["ms"] > 0 for v in values)
    assert "coexec:" in shown[0]["text/plain"]


def test_timeline_export_writes_a_chrome_trace(kc, tmp_path):
    path = tmp_path / "trace.json"
    text = stdout(ok(kc, f"%terra timeline --export {path}"))
    assert str(path) in text
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {names[e["tid"]] for e in spans} == {"Python thread", "GraphRunner"}
    assert {e["name"] for e in spans} >= {"coexec", "busy"}


def test_views_update_while_the_loop_runs(kc):
    graph_open, _ = opened_and_displayed(ok(kc, "%terra graph"), "AnyModel",
                                          "terra_kernel.views.GraphView")
    timeline_open, _ = opened_and_displayed(ok(kc, "%terra timeline"), "AnyModel",
                                             "terra_kernel.views.TimelineView")
    before = graph_open["data"]["state"]["graph"]["stats"]["iterations_coexecuted"]
    # Refreshes at most every 0.5 s (or 50x their cost) would make whether one falls inside this
    # short loop a matter of timing: here every boundary refreshes.
    ok(kc, "_views = get_ipython().magics_manager.registry['TerraMagics']._views\n"
           "_views.interval, _views.cost_factor = 0.0, 0.0")
    messages = ok(kc, TRAIN)  # the training cell again: the same graph grows
    printed = next(i for i, m in enumerate(messages) if m["msg_type"] == "stream"
                   and "trained" in m["content"]["text"])
    updates = {graph_open["comm_id"]: [], timeline_open["comm_id"]: []}
    for i, m in enumerate(messages):
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] in updates:
            assert m["content"]["data"]["method"] == "update"
            updates[m["content"]["comm_id"]].append((i, m["content"]["data"]["state"]))
    for comm_id, states in updates.items():
        assert states, comm_id
        assert states[0][0] < printed  # pushed from inside the loop, not only after the cell
    during = [s["graph"] for i, s in updates[graph_open["comm_id"]] if "graph" in s]
    assert during[-1]["stats"]["iterations_coexecuted"] >= before + 40  # the final push
    timelines = [s["timeline"] for i, s in updates[timeline_open["comm_id"]] if "timeline" in s]
    assert len(timelines[-1]["iterations"]) > len(timeline_open["data"]["state"]["timeline"]["iterations"])

    # Both views follow the cell run last: another loop's graph replaces the training cell's.
    messages = ok(kc, "for i in range(5):\n    z = torch.ones(3) * i\nprint('other loop')")
    graphs = [m["content"]["data"]["state"]["graph"] for m in messages if m["msg_type"] == "comm_msg"
              and m["content"]["comm_id"] == graph_open["comm_id"]
              and "graph" in m["content"]["data"]["state"]]
    assert graphs and graphs[-1]["name"] != during[-1]["name"]
    assert graphs[-1]["cell"].startswith("In [")
    assert {"aten::mul.Tensor", "aten::ones"} <= {n["op"] for n in graphs[-1]["nodes"]}
    ok(kc, "_views.interval, _views.cost_factor = 0.5, 50")


def test_a_failing_refresh_stops_live_updates_not_the_loop(kc):
    ok(kc, "%terra graph")
    ok(kc, "_views = get_ipython().magics_manager.registry['TerraMagics']._views\n"
           "_views.interval, _views.cost_factor = 0.0, 0.0\n"
           "_graph = _views.graph\n"
           "_views.graph = lambda name: 1 / 0")
    messages = ok(kc, TRAIN)
    assert "trained" in stdout(messages)
    errors = "".join(m["content"]["text"] for m in messages
                     if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
    assert errors.count("live view updates stopped: ZeroDivisionError") == 1, errors
    ok(kc, "_views.graph = _graph\n_views.stopped = False\n"
           "_views.interval, _views.cost_factor = 0.5, 50")


@pytest.mark.parametrize("command, expected", [
    ("%terra graph --bogus", "unknown option '--bogus'"),
    ("%terra graph In[999]", "no graph"),
    ("%terra graph 1 2", "at most one"),
    ("%terra graph --text=yes", "takes no value"),
    ("%terra timeline --export", "--export needs a value"),
    ("%terra timeline --all 2", "--all takes no cell"),
    ("%terra timeline --export /nonexistent-dir/t.json", "cannot write"),
    ("%terra steps In[999]", "no graph"),
])
def test_bad_view_arguments_give_usage_not_traceback(kc, command, expected):
    reply, messages = execute(kc, command)
    text = "".join(m["content"].get("text", "") + m["content"].get("evalue", "") for m in messages)
    assert expected in text, (command, text)
    assert "Traceback" not in text
    assert not any(m["msg_type"] == "comm_open" for m in messages)


def test_help_lists_the_views(kc):
    reply, _ = execute(kc, "%terra?")
    pages = [p["data"]["text/plain"] for p in reply.get("payload", []) if p.get("source") == "page"]
    assert pages, reply
    for command in ("%terra graph", "%terra timeline", "--export FILE.json", "%terra steps"):
        assert command in pages[0], pages[0]


def test_headless_run_keeps_the_views_state(tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / "graph_views.ipynb", as_version=4)
    NotebookClient(nb, kernel_name="terra", timeout=300, store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    views = {s["state"].get("_anywidget_id"): s["state"] for s in states.values()
             if s["model_name"] == "AnyModel"}
    graph = views["terra_kernel.views.GraphView"]["graph"]
    assert (f"graph of the training cell: {graph['stats']['nodes']} nodes, "
            f"{len(graph['blocks'])} basic blocks, {graph['stats']['edges']} edges") in printed
    assert views["terra_kernel.views.TimelineView"]["timeline"]["iterations"]
    # Each view's output keeps its static fallback beside the widget view.
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if o.output_type == "display_data" and WIDGET_VIEW in o.data]
    assert [sorted(o.data) for o in outputs] == [
        sorted([WIDGET_VIEW, "image/svg+xml", "text/plain"]), sorted([WIDGET_VIEW, VEGA_LITE, "text/plain"])]
