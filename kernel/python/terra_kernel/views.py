"""Terra's graph and timeline views: anywidget models whose ES modules live in `widgets/`.

`GraphView` syncs one graph (`graph`: `terra.graph_json` plus the cell of each source line) and
`TimelineView` the recent iterations (`timeline`: `terra.timeline`); the JavaScript in
`widgets/graph_view.js` and `widgets/timeline_view.js` (installed next to this package) draws
them. Each view's mimebundle also carries a static rendering (text, SVG or Vega-Lite, from
`static_views`) for frontends without widgets, and nbclient saves the model state, so a notebook
executed headless shows the views when opened.

Live updates: while a cell runs, `Views.push` refreshes the displayed views of the graph being
run. The cell's co-execution calls it at iteration boundaries (`CellCoexecution.boundary_hook`),
in the program's own thread (comm messages go out from the shell thread only), once a view is
due: at most every `interval` seconds per view, and the gap grows with what the view's refresh
costs, so that refreshing one view takes at most about 1% of a loop
(bench/results/widget_overhead.md measures it).

This module imports anywidget (and ipywidgets): the magics import it on first use, never at
kernel start.
"""
import sys
import time
from pathlib import Path

import anywidget
import traitlets

from . import static_views, viewdata

ASSETS = Path(__file__).resolve().parent / "widgets"


def _asset(name):
    path = ASSETS / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise RuntimeError(f"Terra's widget file {path} is missing ({error}); reinstall the kernel "
                           "with scripts/setup.sh") from error


class _View(anywidget.AnyWidget):
    _css = _asset("views.css")

    def __init__(self, source, name, **kwargs):
        self._source = source  # the Views that made it
        self.follows = name is None  # None: always the graph run last (or running now)
        self.name = name
        self.due = 0.0         # live refreshes: when the next is due, what the last one cost
        self.cost = 0.0
        super().__init__(**kwargs)

    def __repr__(self):
        return f"<Terra {type(self).__name__} of {self.name}>"


class GraphView(_View):
    """The TraceGraph of one cell: blocks, nodes, edges, last path and fallback points."""
    _esm = _asset("dom.js") + _asset("graph_view.js")
    graph = traitlets.Dict().tag(sync=True)
    collapse_threshold = traitlets.Int(300).tag(sync=True)

    def refresh(self, name):
        self.name = name
        self.graph = self._source.graph(name)

    def _repr_mimebundle_(self, **kwargs):
        data, metadata = super()._repr_mimebundle_(**kwargs)
        data["text/plain"] = static_views.graph_text(self.graph)
        picture = static_views.graph_svg(self.graph)
        if picture:
            data["image/svg+xml"] = picture
        return data, metadata


class TimelineView(_View):
    """Recent iterations: Python thread and GraphRunner lanes, step time per iteration."""
    _esm = _asset("dom.js") + _asset("timeline_view.js")
    timeline = traitlets.Dict().tag(sync=True)

    def __init__(self, source, name, every_graph=False, **kwargs):
        self.every_graph = every_graph
        super().__init__(source, name, **kwargs)

    def refresh(self, name):
        self.name = name
        self.timeline = self._source.timeline(None if self.every_graph else name)

    def _repr_mimebundle_(self, **kwargs):
        data, metadata = super()._repr_mimebundle_(**kwargs)
        data["text/plain"] = static_views.timeline_text(self.timeline)
        data[static_views.VEGA_LITE] = static_views.timeline_vegalite(self.timeline)
        return data, metadata


class Views:
    """Makes the views of this kernel's graphs and keeps the displayed ones up to date."""

    interval = 0.5       # seconds between live refreshes of a view, at least
    cost_factor = 100    # ... and at least this many times what its last refresh cost
    keep = 8             # live views kept (older ones stay as drawn)
    window = 300         # iterations a timeline view shows (the engine keeps more)

    def __init__(self, shell, cells):
        self.shell = shell
        self.cells = cells
        self.live = []
        self.due = float("inf")  # perf_counter time of the next refresh of a view
        self.stopped = False     # a refresh failed: no more live refreshes
        self.ran = None          # the graph of the cell being run
        self.pushes = 0          # views refreshed from iteration boundaries, and their cost
        self.push_seconds = 0.0
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)

    def _terra(self):
        import terra

        return terra

    # -- data ----------------------------------------------------------------------------------
    def graph(self, name):
        return viewdata.graph(self._terra(), self.shell, name, self.cells.labels.get(name))

    def timeline(self, name):
        data = viewdata.timeline(self._terra(), name, self.window)
        if name is not None:
            data["graph"] = self.cells.labels.get(name, name)
        return data

    # -- views ---------------------------------------------------------------------------------
    # The first state goes with the widget's comm_open (so a frontend never draws an empty view).
    def graph_view(self, name, follow=False):
        view = GraphView(self, None if follow else name, graph=self.graph(name))
        view.name = name
        return self._track(view)

    def timeline_view(self, name, follow=False, every_graph=False):
        view = TimelineView(self, None if follow else name, every_graph=every_graph,
                            timeline=self.timeline(None if every_graph else name))
        view.name = name
        return self._track(view)

    def _track(self, view):
        self.live.append(view)
        del self.live[:-self.keep]
        self.cells.boundary_hook = self
        self.cells.bind_mark()
        return view

    # -- live updates --------------------------------------------------------------------------
    # Each view has its own schedule (`view.due`, a perf_counter time, and `view.cost`, what its
    # last refresh took), so a cheap view stays live while an expensive one refreshes less often;
    # `self.due` is the earliest due of the views showing the running graph.
    def _gap(self, view):
        return max(self.interval, self.cost_factor * view.cost)

    def _showing(self, graph):
        return [view for view in self.live
                if view.follows or view.name == graph or getattr(view, "every_graph", False)]

    def _pre_run_cell(self, info):
        self.ran = self.cells.graph
        # The views were refreshed after the last cell: the first refresh comes one gap into
        # this one (a loop shorter than that gets only the refresh after it).
        now = time.perf_counter()
        for view in self.live:
            view.due = now + self._gap(view)
        self._schedule()

    def _post_run_cell(self, result):
        if self.ran is not None:
            self._refresh(self.ran, only_due=False)
        self.ran = None

    def push(self):
        """Called at iteration boundaries while a cell runs (once `due`): refreshes the views
        of the running graph that are due."""
        if self.cells.graph is not None:
            self._refresh(self.cells.graph, only_due=True)
        self._schedule()

    def _schedule(self):
        if self.stopped or self.cells.graph is None:
            self.due = float("inf")
        else:
            self.due = min((view.due for view in self._showing(self.cells.graph)), default=float("inf"))

    def _refresh(self, graph, only_due):
        """Refreshes the views showing `graph` (only those due, or all of them). Nothing happens
        while `graph` has recorded no op: the views keep what they show, and stay due."""
        if self.stopped or graph not in viewdata.graph_names(self._terra(), [graph]):
            return
        for view in self._showing(graph):
            started = time.perf_counter()
            if only_due and view.due > started:
                continue
            try:
                view.refresh(graph if view.follows else view.name)
            except Exception as error:  # a view must never break the user's cell
                self.stopped = True
                print(f"Terra: live view updates stopped: {type(error).__name__}: {error}",
                      file=sys.stderr)
                return
            view.cost = time.perf_counter() - started
            view.due = time.perf_counter() + self._gap(view)
            if only_due:
                self.pushes += 1
                self.push_seconds += view.cost
