"""What the graph and timeline views show, as plain JSON-able dicts.

The engine describes a graph (`terra.graph_json`) and recent iterations (`terra.timeline`); this
module adds what only the kernel knows, the notebook cell behind each source file (`In [n], line
L` and the line's text, which IPython keeps in `linecache`), and turns timelines into a Chrome
trace. Keys the views do not know are passed through untouched.
"""
import linecache

LANES = {"python": "Python thread", "graph": "GraphRunner"}


def place(shell, filename):
    """`In [n]` for a cell's file name, else the file name."""
    mapping = getattr(getattr(shell, "compile", None), "_filename_map", {}) or {}
    if filename in mapping:
        return f"In [{mapping[filename]}]"
    return filename


def where(shell, frame):
    """The user's line behind an op (the engine's `where`: {file, line, function}): cell (or
    file), line, function and the line's text."""
    if frame is None:
        return None
    filename, line, function = frame["file"], int(frame["line"]), frame["function"]
    return {"cell": place(shell, filename), "line": line, "function": function,
            "code": linecache.getline(filename, line).strip()}


# -- graphs ---------------------------------------------------------------------------------------
def graph_names(terra, names=None):
    """Graphs (of `names`, default all) that recorded at least one op: cells without PyTorch
    work leave empty ones."""
    known = terra._C.graphs()
    out = []
    for name in known if names is None else [n for n in names if n in known]:
        s = terra.stats(name)
        if s["ops_traced"] + s["ops_coexecuted"]:
            out.append(name)
    return out


def latest_graph(terra, labels):
    """The graph of the cell run last that recorded ops, else the last graph, else None."""
    graphs = graph_names(terra)
    recent = [name for name in labels if name in graphs]
    if recent:
        return recent[-1]
    return graphs[-1] if graphs else None


def graph(terra, shell, name, label=None):
    """The graph `name` for the graph view: the engine's description plus the user's places."""
    data = dict(terra.graph_json(name))
    data["cell"] = label or data.get("name", name)
    for node in data.get("nodes", ()):
        node["where"] = where(shell, node.get("where"))
    for fallback in data.get("fallbacks", ()):
        fallback["where"] = where(shell, fallback.get("where"))
    return data


# -- timelines ------------------------------------------------------------------------------------
def timeline(terra, name=None, window=None):
    """Recent iterations of graph `name` (None: of all graphs), with the lanes' titles; with a
    `window`, only the spans of the last `window` iterations (the engine keeps thousands: a view
    redrawn while a loop runs needs the recent ones only)."""
    # The engine converts only the newest iterations' spans when asked (over all graphs, so a named
    # graph's window is cut below, from a margin of other graphs' iterations).
    last = None if window is None else (window if name is None else 4 * window)
    data = dict(terra.timeline(name, last=last))
    iterations = data.get("iterations", [])
    if window is not None and len(iterations) > window:
        kept = iterations[-window:]
        serials = {it["index"] for it in kept}
        data["events"] = [e for e in data.get("events", []) if e.get("iteration") in serials]
        data["iterations"] = kept
        data["dropped_iterations"] = len(iterations) - window
    data["graph"] = name
    data["lanes"] = dict(LANES)
    return data


def chrome_trace(data):
    """The timeline as Chrome trace events (`ph: "X"` spans, µs), which Perfetto and
    chrome://tracing open. One thread per lane, named by metadata events."""
    events = data.get("events", [])
    starts = [e["start_ns"] for e in events] + [i["start_ns"] for i in data.get("iterations", [])]
    origin = min(starts) if starts else 0
    tids = {lane: n + 1 for n, lane in enumerate(LANES)}
    trace = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "Terra"}}]
    for lane, tid in tids.items():
        trace.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                      "args": {"name": LANES[lane]}})
        trace.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid,
                      "args": {"sort_index": tid}})
    for e in events:
        tid = tids.setdefault(e.get("lane", "?"), len(tids) + 1)
        args = {k: e[k] for k in ("iteration", "graph", "detail") if e.get(k) not in (None, "")}
        trace.append({"name": e.get("kind", "?"), "cat": e.get("lane", "?"), "ph": "X",
                      "ts": (e["start_ns"] - origin) / 1000.0,
                      "dur": max(0, e["end_ns"] - e["start_ns"]) / 1000.0,
                      "pid": 1, "tid": tid, "args": args})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
