"""The graph view on a 10k-node graph, in Chromium without Jupyter (tests/browser/standalone.py):
blocks start collapsed (one drawn node per block), expanding everything draws only what is in
view, search still finds ops inside collapsed blocks and jumps to them, and a new graph pushed
by the kernel replaces the drawing. (How long each of these takes is measured by
bench/graph_view_scale.py, not asserted here.)"""
from pathlib import Path

import pytest

from standalone import open_view, synthetic_graph

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: run scripts/setup.sh"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def test_ten_thousand_nodes_start_collapsed_and_cull_when_expanded(browser):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    graph = synthetic_graph(10_000)
    root = open_view(page, "graph_view.js", {"graph": graph, "collapse_threshold": 300})
    assert int(root.get_attribute("data-nodes-total")) == len(graph["nodes"]) >= 10_000
    assert int(root.get_attribute("data-blocks-total")) == len(graph["blocks"])
    # Collapsed: each drawn block is one node; no op node is drawn on its own.
    assert root.locator("g.terra-node[data-node]").count() == 0
    drawn_blocks = root.locator("g.terra-block").count()
    assert drawn_blocks == len(graph["blocks"])
    assert root.locator("g.terra-node[data-collapsed-block]").count() == drawn_blocks
    page.screenshot(path=str(ARTIFACTS / "scale_collapsed.png"))

    root.locator("button", has_text="Expand all").click()
    assert root.get_attribute("data-culled") == "1"
    drawn = int(root.get_attribute("data-drawn-nodes"))
    assert 0 < drawn < len(graph["nodes"]) // 4
    assert root.locator("g.terra-node[data-node]").count() == drawn
    page.screenshot(path=str(ARTIFACTS / "scale_expanded.png"))

    # Panning brings other nodes into the drawing.
    first = root.locator("g.terra-node[data-node]").first.get_attribute("data-node")
    box = root.locator("svg.terra-canvas").bounding_box()
    page.mouse.move(box["x"] + 300, box["y"] + 400)
    page.mouse.down()
    page.mouse.move(box["x"] + 300, box["y"] - 2000, steps=5)
    page.mouse.up()
    page.wait_for_function("document.querySelector('.terra-graph-view g.terra-node[data-node]')"
                           f".dataset.node !== '{first}'")

    root.locator("button", has_text="Collapse all").click()
    assert root.get_attribute("data-culled") == "0"
    search = root.locator(".terra-search")
    search.fill("layer_norm")
    expected = sum(1 for n in graph["nodes"] if n["op"] == "aten::layer_norm")
    assert int(root.get_attribute("data-matches")) == expected > 0
    assert root.locator("g.terra-node.match[data-collapsed-block]").count() > 0
    search.press("Enter")  # expands the first match's block and selects the node
    assert root.locator("g.terra-node.match.selected[data-node]").count() == 1
    assert "layer_norm" in root.locator(".terra-details").inner_text()
    page.screenshot(path=str(ARTIFACTS / "scale_search.png"))
    page.close()


def test_a_new_graph_from_the_kernel_replaces_the_drawing(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    root = open_view(page, "graph_view.js", {"graph": synthetic_graph(200, block=10),
                                             "collapse_threshold": 300})
    assert root.locator("g.terra-node[data-node]").count() == int(root.get_attribute("data-nodes-total"))
    bigger = synthetic_graph(400, block=10, seed=1)
    page.evaluate("graph => window.terraModel.set('graph', graph)", bigger)
    assert int(root.get_attribute("data-nodes-total")) == len(bigger["nodes"])
    # Past the threshold now: collapsed.
    assert root.locator("g.terra-node[data-node]").count() == 0
    page.close()
