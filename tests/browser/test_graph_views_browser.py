"""The graph and timeline views end to end, in a real browser.

JupyterLab from the venv (loopback port, token off in this test only) serves a copy of
notebooks/graph_views.ipynb; Debian's Chromium, driven by Playwright, opens it, runs all cells
through the Run menu with the `terra` kernel, and then:
- the graph view draws as many block groups and nodes as the engine exported (the notebook prints
  `terra.graph_json()`'s counts), marks the fallback point, zooms on the wheel, shows a tooltip on
  hover, and a click on the node found by the search box shows its cell, line and source text;
- collapsing a block replaces its nodes by one;
- the timeline view draws spans in both lanes and one bar per iteration;
- the notebook executed headless by nbclient and opened without running it shows the views again
  from their saved state (trusted) or the static fallbacks (untrusted).
Screenshots go to tests/browser/artifacts/ (kept, not committed) for a person to look at.
"""
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
NOTEBOOK = "graph_views.ipynb"
TIMEOUT_MS = 120_000  # for the whole run of the notebook; waits end as soon as the page is ready


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a fresh copy of the demo notebook."""
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: run scripts/setup.sh"
    home = tmp_path_factory.mktemp("lab")
    notebooks = home / "notebooks"
    notebooks.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, notebooks / NOTEBOOK)
    settings = home / "settings" / "@jupyterlab"
    for extension, name, value in [
            # Every cell in the DOM (no virtual scrolling), so outputs below the fold exist.
            ("notebook-extension", "tracker", '{"windowingMode": "none"}'),
            # No "news" notification over the page (and nothing fetched from the internet).
            ("apputils-extension", "notification", '{"fetchNews": "false", "checkForUpdates": false}')]:
        (settings / extension).mkdir(parents=True, exist_ok=True)
        (settings / extension / f"{name}.jupyterlab-settings").write_text(value)
    port = free_port()
    env = dict(os.environ, JUPYTER_PATH=str(VENV / "share" / "jupyter"),
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_DATA_DIR=str(home / "data"),  # the notebook signatures (trust) live here
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               TERRA_HISTORY_FILE=str(home / "history.sqlite"),
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    command = [str(VENV / "bin" / "jupyter"), "lab", "--ip=127.0.0.1", f"--port={port}",
               "--no-browser", "--IdentityProvider.token=", "--ServerApp.password=",
               f"--ServerApp.root_dir={notebooks}", "--LabApp.news_url=",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = open(home / "lab.log", "w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if server.poll() is not None:
            pytest.fail(f"jupyter lab exited: {(home / 'lab.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"jupyter lab did not answer: {(home / 'lab.log').read_text()[-3000:]}")
        time.sleep(0.3)
    yield {"url": url, "notebooks": notebooks, "env": env}
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


@pytest.fixture(scope="module")
def page(lab):
    """The demo notebook opened in Chromium, every cell run through the Run menu."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        console = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        try:
            page.goto(f"{lab['url']}/lab/tree/{NOTEBOOK}")
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            wait_idle(page)
            page.click(".lm-MenuBar-itemLabel:text-is('Run')")
            page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
            page.wait_for_selector(".terra-graph-view[data-drawn-nodes]")
            page.wait_for_selector(".terra-timeline-view[data-bars]")
            wait_idle(page)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "failure.png"))
            (ARTIFACTS / "failure-console.txt").write_text("\n".join(console))
            raise
        page.screenshot(path=str(ARTIFACTS / "notebook.png"))
        yield page
        page.close()
        browser.close()


def wait_idle(page):
    """Waits until the notebook's session runs the terra kernel and it is idle. (If JupyterLab
    asks which kernel to start, as it may while it is still loading the kernel specs, the answer
    is the notebook's own: Terra.)"""
    status = page.locator(".jp-StatusBar-Widget", has_text="Python 3 (Terra) | Idle")
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    status.or_(dialog).first.wait_for()
    if dialog.count():
        dialog.locator("select").select_option(label="Python 3 (Terra)")
        dialog.locator("button", has_text="Select").click()
        status.wait_for()
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")


def exported_counts(page):
    text = page.locator(".jp-OutputArea-output", has_text="graph of the training cell").inner_text()
    match = re.search(r"(\d+) nodes, (\d+) basic blocks, (\d+) edges, (\d+) fallback", text)
    assert match, text
    return dict(zip(("nodes", "blocks", "edges", "fallbacks"), map(int, match.groups())))


def test_graph_view_draws_the_exported_graph(page):
    counts = exported_counts(page)
    view = page.locator(".terra-graph-view")
    assert view.count() == 1
    view.scroll_into_view_if_needed()
    view.screenshot(path=str(ARTIFACTS / "graph_view.png"))
    assert view.get_attribute("data-nodes-total") == str(counts["nodes"])
    # Small graph: every block expanded, every node drawn in its block's group.
    assert view.locator("g.terra-block").count() == counts["blocks"]
    assert view.locator("g.terra-node[data-node]").count() == counts["nodes"]
    assert view.locator("path.terra-edge").count() == counts["edges"]
    assert view.locator("g.terra-node.fallback").count() >= min(1, counts["fallbacks"])
    assert view.locator("path.terra-edge.on-path").count() > 0  # the last path


def test_click_on_a_node_shows_its_source_line(page):
    view = page.locator(".terra-graph-view")
    view.locator(".terra-search").fill("pow")
    view.locator(".terra-search").press("Enter")  # centres the first match
    assert view.get_attribute("data-matches") == "1"
    node = view.locator("g.terra-node.match").first
    node.hover()
    assert view.locator(".terra-tooltip").is_visible()
    node.click()
    details = view.locator(".terra-details")
    text = details.inner_text()
    # The regularisation line of the training cell (In [2], its 6th line).
    assert "In [2], line 6" in text, text
    assert "logits.pow(2).mean()" in text, text
    view.screenshot(path=str(ARTIFACTS / "graph_view_selected.png"))


def test_wheel_zooms_and_a_block_collapses(page):
    view = page.locator(".terra-graph-view")
    viewport = view.locator("g.terra-viewport")
    before = viewport.get_attribute("transform")
    box = view.locator("svg.terra-canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -400)
    assert viewport.get_attribute("transform") != before
    view.locator("button", has_text="Fit").click()
    nodes = int(view.get_attribute("data-nodes-total"))
    big = max(view.locator("g.terra-block").all(),
              key=lambda g: g.locator("g.terra-node").count())
    size = big.locator("g.terra-node").count()
    assert size > 1
    big.locator("text.terra-block-head").click()
    assert view.locator("g.terra-node[data-collapsed-block]").count() == 1
    assert view.locator("g.terra-node[data-node]").count() == nodes - size
    view.screenshot(path=str(ARTIFACTS / "graph_view_collapsed.png"))


def test_timeline_view_draws_both_lanes_and_step_times(page):
    view = page.locator(".terra-timeline-view")
    assert view.count() == 1
    view.scroll_into_view_if_needed()
    view.screenshot(path=str(ARTIFACTS / "timeline_view.png"))
    assert view.locator("rect.terra-span[data-lane='python']").count() > 0
    assert view.locator("rect.terra-span[data-lane='graph']").count() > 0
    bars = view.locator("rect.terra-bar")
    assert bars.count() == int(view.get_attribute("data-bars")) > 0
    modes = {bars.nth(i).get_attribute("data-mode") for i in range(bars.count())}
    assert {"traced", "coexec"} <= modes, modes


def test_views_follow_a_rerun_of_the_training_cell(page):
    """Running the training cell again from the notebook: both views get the kernel's updates
    and redraw with the grown graph's counts."""
    graph = page.locator(".terra-graph-view .terra-summary")
    steps = page.locator(".terra-timeline-view")
    before, bars = graph.inner_text(), int(steps.get_attribute("data-bars"))
    coexecuted = int(re.search(r"(\d+) co-executed", before).group(1))
    cell = page.locator(".jp-Notebook .jp-Cell").nth(2)  # markdown, setup, training
    assert "for step in range(60)" in cell.inner_text()
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        "n => { const m = document.querySelector('.terra-graph-view .terra-summary').textContent"
        ".match(/(\\d+) co-executed/); return m && +m[1] >= n; }", arg=coexecuted + 60)
    page.wait_for_function(
        "n => +document.querySelector('.terra-timeline-view').dataset.bars > n", arg=bars)
    wait_idle(page)
    page.locator(".terra-timeline-view").screenshot(path=str(ARTIFACTS / "timeline_after_rerun.png"))


@pytest.mark.parametrize("trusted", [True, False])
def test_a_notebook_run_headless_shows_the_views_it_saved(lab, page, trusted):
    """Executed by nbclient (scripts/run_notebook.py) and opened without running it: trusted, the
    views are drawn again from the widget state saved in the notebook; untrusted, JupyterLab
    shows the safe fallbacks: the graph's text summary and the timeline as Vega-Lite."""
    name = f"headless-{'trusted' if trusted else 'untrusted'}.ipynb"
    path = lab["notebooks"] / name
    run = subprocess.run([str(VENV / "bin" / "python"), str(ROOT / "scripts" / "run_notebook.py"),
                          str(lab["notebooks"] / NOTEBOOK), "--output", str(path)],
                         env=lab["env"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    counts = re.search(r"graph of the training cell: (\d+) nodes, (\d+) basic blocks", run.stdout)
    if trusted:
        subprocess.run([str(VENV / "bin" / "jupyter"), "trust", str(path)], env=lab["env"],
                       check=True, capture_output=True)
    saved = page.context.new_page()
    saved.goto(f"{lab['url']}/lab/tree/{name}")
    saved.wait_for_selector(".jp-Notebook .jp-Cell")
    if trusted:
        view = saved.locator(".terra-graph-view[data-drawn-nodes]")
        view.wait_for()
        assert view.get_attribute("data-nodes-total") == counts.group(1)
        assert view.locator("g.terra-block").count() == int(counts.group(2))
        saved.locator(".terra-timeline-view[data-bars]").wait_for()
        assert saved.locator(".terra-timeline-view rect.terra-bar").count() > 0
    else:
        saved.locator(".jp-OutputArea-output", has_text=f"Terra graph In [2]: {counts.group(1)} nodes").wait_for()
        saved.locator(".jp-RenderedVegaCommon5 svg, .vega-embed svg").first.wait_for()
        assert saved.locator(".terra-graph-view").count() == 0
    saved.locator(".jp-Cell").last.scroll_into_view_if_needed()
    saved.screenshot(path=str(ARTIFACTS / f"headless_{'trusted' if trusted else 'untrusted'}.png"))
    saved.close()
