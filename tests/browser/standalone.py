"""A widget's ES module in a bare page, without Jupyter: the module is rendered into a div with
a minimal stand-in for anywidget's model (`get`, `set`, `on`), so large or unusual graphs can be
checked (tests/browser/test_graph_view_scale.py) and timed (bench/graph_view_scale.py) without a
kernel. The page is loaded with `set_content`: nothing is served, nothing leaves the machine."""
import json
import random
from pathlib import Path

WIDGETS = Path(__file__).resolve().parents[2] / "widgets"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><style>{css}</style></head>
<body style="margin:0;width:{width}px">
<div id="view"></div>
<script type="module">
const source = {module};
const url = URL.createObjectURL(new Blob([source], {{ type: "text/javascript" }}));
const widget = (await import(url)).default;
const state = {state};
const handlers = {{}};
window.terraModel = {{
  get: (key) => state[key],
  set: (key, value) => {{ state[key] = value; (handlers["change:" + key] || []).forEach((f) => f()); }},
  on: (event, f) => {{ (handlers[event] = handlers[event] || []).push(f); }},
  off: () => {{}}, save_changes: () => {{}}, send: () => {{}},
}};
const started = performance.now();
await widget.render({{ model: window.terraModel, el: document.getElementById("view") }});
window.terraRenderMs = performance.now() - started;
document.body.dataset.rendered = "1";
</script></body></html>"""


def open_view(page, module, state, width=1400):
    """Renders widgets/`module` with `state` into `page`; returns the view's root element (the
    `el` anywidget hands to `render`)."""
    html = PAGE.format(css=(WIDGETS / "views.css").read_text(), width=width,
                       module=json.dumps((WIDGETS / "dom.js").read_text() + (WIDGETS / module).read_text()), state=json.dumps(state))
    page.set_content(html)
    page.wait_for_selector("body[data-rendered='1']")
    return page.locator("#view")


def synthetic_graph(nodes=10_000, block=40, seed=0):
    """A graph_json-shaped graph of about `nodes` nodes: a spine of blocks where every third
    block is followed by two alternative blocks (a data-dependent branch) that join again."""
    rng = random.Random(seed)
    ops = ["aten::linear", "aten::relu", "aten::add.Tensor", "aten::mul.Tensor", "aten::mean",
           "aten::layer_norm", "aten::softmax.int", "aten::matmul", "aten::dropout", "backward"]
    graph = {"name": "synthetic", "cell": "synthetic", "nodes": [], "control_edges": [], "blocks": [],
             "switch_cases": [], "back_edges": [], "last_path": [], "fallbacks": [], "stats": {}}

    def new_block(size):
        ids = []
        for _ in range(size):
            i = len(graph["nodes"])
            graph["nodes"].append({"id": i, "label": "", "op": rng.choice(ops), "kind": "graph",
                                   "shapes": [f"Float[{rng.choice([32, 64, 128])}, 64]"],
                                   "count": 10, "source": {"op": "op", "frames": [
                                       {"file": "synthetic.py", "line": 1 + i % 500, "function": "step"}]},
                                   "fallback": False, "where": None})
            if ids:
                edge(ids[-1], i, 10)
            ids.append(i)
        graph["blocks"].append({"id": len(graph["blocks"]), "nodes": ids})
        return ids

    def edge(a, b, count):
        graph["control_edges"].append({"id": len(graph["control_edges"]), "from": a, "to": b, "count": count})
        return len(graph["control_edges"]) - 1

    last = new_block(block)
    while len(graph["nodes"]) < nodes:
        if len(graph["blocks"]) % 3 == 0:
            left, right = new_block(block // 2), new_block(block // 2)
            edge(last[-1], left[0], 7)
            edge(last[-1], right[0], 3)
            join = new_block(block)
            edge(left[-1], join[0], 7)
            edge(right[-1], join[0], 3)
            last = join
        else:
            nxt = new_block(block)
            edge(last[-1], nxt[0], 10)
            last = nxt
    entering = {}
    for index, e in enumerate(graph["control_edges"]):
        entering.setdefault(e["to"], []).append(index)
    graph["switch_cases"] = [{"block": b["id"], "entering": [i for i in entering.get(b["nodes"][0], [])
                                                             if graph["control_edges"][i]["from"] not in b["nodes"]]}
                             for b in graph["blocks"]]
    graph["last_path"] = graph["blocks"][0]["nodes"] + graph["blocks"][1]["nodes"]
    graph["nodes"][len(graph["nodes"]) // 2]["fallback"] = True
    return graph
