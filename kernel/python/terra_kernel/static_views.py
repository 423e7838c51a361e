"""The views for frontends without widgets: text summaries, a static SVG of a graph's blocks and
Vega-Lite charts of a timeline.

A widget's mimebundle carries these beside its widget view; frontends pick the richest type they
render (JupyterLab with a kernel: the widget; nbconvert, GitHub or a terminal: SVG, Vega-Lite or
text). The SVG draws the graph one box per basic block, layered by longest path (no crossing
reduction): an overview, the interactive view has the detail.
"""
from html import escape

# One palette for the widgets (widgets/*.js) and these static views.
KIND_COLORS = {"tracing": "#e8a33d", "coexec": "#4c9f70", "fallback": "#d9534f", "eager": "#9e9e9e",
               "fetch_wait": "#7b61c4", "diverge": "#a93226", "busy": "#3b7dd8"}
MODE_KIND = {"traced": "tracing", "coexec": "coexec", "fallback": "fallback", "eager": "eager"}
NESTED_KINDS = ("fetch_wait", "diverge")  # drawn inside the iteration span they interrupt
VEGA_LITE = "application/vnd.vegalite.v5+json"


# -- graph ----------------------------------------------------------------------------------------
def op_nodes(graph):
    """The graph's nodes by id, the TraceGraph's virtual entry and exit left out."""
    return {n["id"]: n for n in graph.get("nodes", []) if n.get("kind") not in ("entry", "exit")}


def op_edges(graph, nodes):
    """(edge id, edge) of the control edges between `nodes`."""
    return [(i, e) for i, e in enumerate(graph.get("control_edges", []))
            if e["from"] in nodes and e["to"] in nodes]


def graph_text(graph):
    stats = graph.get("stats", {})
    nodes, blocks = op_nodes(graph), graph.get("blocks", [])
    lines = [f"Terra graph {graph.get('cell', graph.get('name'))}: {len(nodes)} nodes, "
             f"{len(op_edges(graph, nodes))} edges, {len(blocks)} basic blocks, "
             f"{len(graph.get('switch_cases', []))} switch-cases"]
    if stats:
        lines.append(f"iterations: {stats.get('iterations_traced', 0)} traced, "
                     f"{stats.get('iterations_coexecuted', 0)} co-executed, "
                     f"{stats.get('iterations_fallback', 0)} fell back, "
                     f"{stats.get('iterations_eager', 0)} eager")
    for f in graph.get("fallbacks", [])[:10]:
        w = f.get("where")
        at = f"{w['cell']}, line {w['line']}: " if w else ""
        lines.append(f"fallback ×{f.get('count', 1)} at {at}{f.get('op')}: {f.get('reason')}")
    return "\n".join(lines)


def graph_svg(graph, max_blocks=400):
    """A static overview: one box per basic block (first and last op, op count), edges between
    blocks with the times taken; fallback blocks outlined red."""
    nodes = op_nodes(graph)
    blocks = graph.get("blocks", [])[:max_blocks]
    if not blocks:
        return None
    block_of = {nid: b["id"] for b in blocks for nid in b["nodes"]}
    back = set(graph.get("back_edges", []))
    links = {}
    for index, e in op_edges(graph, nodes):
        a, b = block_of.get(e["from"]), block_of.get(e["to"])
        if a is None or b is None or a == b or index in back:
            continue
        links[(a, b)] = links.get((a, b), 0) + e.get("count", 1)
    # Longest-path layers over the block DAG, in Kahn order; where a cycle leaves no block ready,
    # the first unvisited block goes next and the edges into visited blocks are ignored.
    after = {}
    indegree = {b["id"]: 0 for b in blocks}
    for (a, b) in links:
        after.setdefault(a, []).append(b)
        indegree[b] += 1
    layer = dict.fromkeys(indegree, 0)
    ready = [b for b, d in indegree.items() if d == 0]
    seen = set()
    while len(seen) < len(layer):
        a = ready.pop() if ready else next(b for b in layer if b not in seen)
        if a in seen:
            continue
        seen.add(a)
        for b in after.get(a, ()):
            if b not in seen:
                layer[b] = max(layer[b], layer[a] + 1)
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
    rows = {}
    for b in blocks:
        rows.setdefault(layer[b["id"]], []).append(b)
    box_w, box_h, gap_x, gap_y = 220, 46, 30, 40
    pos = {}
    for r, row in rows.items():
        for c, b in enumerate(row):
            pos[b["id"]] = (20 + c * (box_w + gap_x), 20 + r * (box_h + gap_y))
    width = 40 + max(len(row) for row in rows.values()) * (box_w + gap_x)
    height = 40 + (max(rows) + 1) * (box_h + gap_y)
    top = max(links.values(), default=1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">']
    for (a, b), count in links.items():
        (x1, y1), (x2, y2) = pos[a], pos[b]
        stroke = 1 + 4 * count / top
        out.append(f'<line x1="{x1 + box_w / 2}" y1="{y1 + box_h}" x2="{x2 + box_w / 2}" y2="{y2}" '
                   f'stroke="#888" stroke-width="{stroke:.1f}"><title>×{count}</title></line>')
    for b in blocks:
        x, y = pos[b["id"]]
        ops = [nodes[i] for i in b["nodes"] if i in nodes]
        fell = any(n.get("fallback") for n in ops)
        first = ops[0]["op"] if ops else "?"
        last = ops[-1]["op"] if ops else "?"
        out.append(f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="4" fill="#f4f7fb" '
                   f'stroke="{"#d9534f" if fell else "#5b7fa6"}" stroke-width="{2 if fell else 1}"/>')
        out.append(f'<text x="{x + 6}" y="{y + 15}">block {b["id"]} · {len(ops)} ops</text>')
        out.append(f'<text x="{x + 6}" y="{y + 31}">{escape(_short(first))} … '
                   f'{escape(_short(last))}</text>')
    out.append("</svg>")
    return "".join(out)


def _short(text, n=13):
    text = text.replace("aten::", "")
    return text if len(text) <= n else text[:n - 1] + "…"


# -- timeline -------------------------------------------------------------------------------------
def _origin(data):
    starts = [e["start_ns"] for e in data.get("events", [])]
    starts += [i["start_ns"] for i in data.get("iterations", [])]
    return min(starts) if starts else 0


def steps(data):
    """Per-iteration step times: [{"index", "mode", "ms", "graph"}] in iteration order."""
    return [{"index": it.get("index", n), "mode": it.get("mode", "?"), "graph": it.get("graph"),
             "ms": (it["end_ns"] - it["start_ns"]) / 1e6}
            for n, it in enumerate(data.get("iterations", []))]


def timeline_text(data):
    events, iterations = data.get("events", []), steps(data)
    lanes = data.get("lanes", {})
    lines = [f"Terra timeline{' of ' + data['graph'] if data.get('graph') else ''}: "
             f"{len(iterations)} iterations, {len(events)} spans"]
    for lane, title in lanes.items():
        spans = [e for e in events if e.get("lane") == lane]
        busy = sum(e["end_ns"] - e["start_ns"] for e in spans if e.get("kind") not in NESTED_KINDS)
        lines.append(f"  {title}: {len(spans)} spans, {busy / 1e6:.1f} ms")
    lines.append(steps_text(iterations))
    return "\n".join(lines)


def steps_text(iterations):
    by_mode = {}
    for it in iterations:
        by_mode.setdefault(it["mode"], []).append(it["ms"])
    parts = []
    for mode, values in by_mode.items():
        values = sorted(values)
        parts.append(f"{mode}: {len(values)} iterations, median {values[len(values) // 2]:.2f} ms")
    return "  step time by mode: " + ("; ".join(parts) if parts else "no iterations recorded")


def _color_scale(domain):
    return {"domain": domain, "range": [KIND_COLORS.get(k, "#bbbbbb") for k in domain]}


def timeline_vegalite(data, width=640):
    """Lanes of spans over time (ms) and, below, the per-iteration step-time chart."""
    origin = _origin(data)
    lanes = data.get("lanes", {})
    values = [{"lane": lanes.get(e.get("lane"), e.get("lane")), "kind": e.get("kind", "?"),
               "start_ms": (e["start_ns"] - origin) / 1e6, "end_ms": (e["end_ns"] - origin) / 1e6,
               "iteration": e.get("iteration"), "detail": e.get("detail") or ""}
              for e in data.get("events", [])]
    kinds = sorted({v["kind"] for v in values}, key=lambda k: list(KIND_COLORS).index(k)
                   if k in KIND_COLORS else len(KIND_COLORS))
    lane_order = list(lanes.values())
    encoding = {
        "y": {"field": "lane", "type": "nominal", "sort": lane_order, "title": None},
        "x": {"field": "start_ms", "type": "quantitative", "title": "time (ms)"},
        "x2": {"field": "end_ms"},
        "color": {"field": "kind", "type": "nominal", "scale": _color_scale(kinds)},
        "tooltip": [{"field": "kind"}, {"field": "iteration"}, {"field": "detail"},
                    {"field": "start_ms", "format": ".3f"}, {"field": "end_ms", "format": ".3f"}],
    }
    lanes_chart = {
        "title": "Terra timeline: Python thread and GraphRunner",
        "width": width, "height": 90,
        "data": {"values": values},
        "layer": [
            {"transform": [{"filter": {"not": {"field": "kind", "oneOf": list(NESTED_KINDS)}}}],
             "mark": {"type": "bar"}, "encoding": encoding},
            {"transform": [{"filter": {"field": "kind", "oneOf": list(NESTED_KINDS)}}],
             "mark": {"type": "bar", "height": {"band": 0.45}}, "encoding": encoding},
        ],
    }
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "vconcat": [lanes_chart, steps_vegalite(data, width, standalone=False)],
            "resolve": {"scale": {"color": "independent"}, "legend": {"color": "independent"}}}


def steps_vegalite(data, width=640, standalone=True):
    """Step time of each recent iteration, coloured by how it ran (traced, co-executed, ...)."""
    values = steps(data)
    modes = sorted({v["mode"] for v in values})
    chart = {
        "title": "Step time per iteration",
        "width": width, "height": 140,
        "data": {"values": [dict(v, n=n) for n, v in enumerate(values)]},
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "n", "type": "ordinal", "title": "iteration (recent, in order)",
                  "axis": {"labels": len(values) <= 60}},
            "y": {"field": "ms", "type": "quantitative", "title": "step time (ms)"},
            "color": {"field": "mode", "type": "nominal",
                      "scale": {"domain": modes,
                                "range": [KIND_COLORS.get(MODE_KIND.get(m, m), "#bbbbbb")
                                          for m in modes]}},
            "tooltip": [{"field": "index"}, {"field": "mode"}, {"field": "graph"},
                        {"field": "ms", "format": ".3f"}],
        },
    }
    if standalone:
        chart["$schema"] = "https://vega.github.io/schema/vega-lite/v5.json"
    return chart
