// Terra graph view: an anywidget ES module (plain JavaScript, no build step, no imports;
// the kernel puts widgets/dom.js in front of it).
//
// Draws the `graph` the kernel syncs (terra.graph_json plus the notebook cell of each source
// line, see kernel/python/terra_kernel/viewdata.py) as SVG: basic blocks are boxes, nodes are
// labelled with their op and output shapes, control edges are as thick as they are taken often,
// the last path the program took is highlighted and fallback points are marked. Hover shows a
// node's details, a click shows its source line and cell; the wheel zooms, dragging pans, the
// search box highlights ops by name, and a block's header collapses it to one node (all blocks
// start collapsed above `collapse_threshold` nodes, so graphs of 10k nodes stay responsive).
//
// Layout (docs/widgets.md says why it suffices): a layered, Sugiyama-style layout whose unit is
// the basic block. A block is a chain, so its nodes stack in one column by construction and only
// blocks need placing: longest-path layering over the block DAG (back edges and any edge closing a
// cycle left out), block order by barycentric sweeps over the neighbouring blocks' columns, then
// each block goes to the column of its most-taken predecessor if free (the hot path is a straight
// line), else the nearest free column to the right. Linear in nodes plus edges.

const L = { colW: 250, nodeW: 214, nodeH: 22, step: 30, header: 22, pad: 8, gap: 26, margin: 20 };
const CULL_ABOVE = 1500; // drawn nodes past which only what is in view is drawn


function shortOp(op) {
  return String(op || "?").replace(/^aten::/, "");
}

// "Float[64, 32] requires_grad" -> "f32[64,32]∇" (the details pane shows the full text).
const DTYPES = { Float: "f32", Double: "f64", Half: "f16", BFloat16: "bf16", Long: "i64", Int: "i32",
                 Short: "i16", Char: "i8", Byte: "u8", Bool: "bool", ComplexFloat: "c64" };
function shortShape(text) {
  return String(text).replace(/^([A-Za-z0-9]+)(?=\[)/, (d) => DTYPES[d] || d)
    .replace(/,\s+/g, ",").replace(/\s*requires_grad/, "∇");
}

function nodeText(n) {
  const shape = (n.shapes || []).filter(Boolean).map(shortShape).join(" ");
  const text = shortOp(n.op) + (shape ? "  " + shape : "");
  return text.length > 34 ? text.slice(0, 33) + "…" : text;
}

function whereText(w) {
  if (!w) return "";
  return `${w.cell}, line ${w.line}` + (w.function ? ` (${w.function})` : "");
}

// ---- the graph as the view needs it --------------------------------------------------------------
function prepare(graph) {
  // The engine's export schema (terra/export.h): the TraceGraph's virtual entry and exit are not
  // drawn, nor the control edges into and out of them; an edge's id is its place in control_edges.
  const nodes = new Map();
  for (const n of graph.nodes || []) if (n.kind !== "entry" && n.kind !== "exit") nodes.set(n.id, n);
  const blocks = [];
  const blockOf = new Map();
  for (const b of graph.blocks || []) {
    const members = (b.nodes || []).filter((id) => nodes.has(id) && !blockOf.has(id));
    if (!members.length) continue;
    const block = { id: b.id, key: String(members[0]), nodes: members };
    members.forEach((id) => blockOf.set(id, block));
    blocks.push(block);
  }
  const indexInBlock = new Map();
  for (const b of blocks) b.nodes.forEach((id, k) => indexInBlock.set(id, k));
  for (const n of nodes.values()) {
    // Nodes outside every block (an engine that could not cut this graph): one block each.
    if (blockOf.has(n.id)) continue;
    const block = { id: `n${n.id}`, key: String(n.id), nodes: [n.id], loose: true };
    blockOf.set(n.id, block);
    indexInBlock.set(n.id, 0);
    blocks.push(block);
  }
  const edges = (graph.control_edges || []).map((e) => ({ ...e, drawn: nodes.has(e.from) && nodes.has(e.to) }));
  const back = new Set(graph.back_edges || []);
  const path = graph.last_path || [];
  const pathNodes = new Set(path);
  const pathLinks = new Set();
  for (let i = 1; i < path.length; i++) pathLinks.add(`${path[i - 1]}>${path[i]}`);
  const fallbackNodes = new Set();
  const reasons = new Map();
  for (const n of nodes.values()) if (n.fallback) fallbackNodes.add(n.id);
  for (const f of graph.fallbacks || []) {
    if (f.node === null || f.node === undefined) continue;
    fallbackNodes.add(f.node);
    if (!reasons.has(f.node)) reasons.set(f.node, []);
    reasons.get(f.node).push(f);
  }
  // Switch-cases: the control edges entering each block; a block entered from a branch point is
  // one of the cases a path chooses between (drawn dashed).
  const cases = new Map();
  for (const c of graph.switch_cases || [])
    cases.set(c.block, { ...c, entering: (c.entering || []).filter((i) => edges[i]?.drawn) });
  const outDegree = new Map();
  for (const e of edges) if (e.drawn) outDegree.set(e.from, (outDegree.get(e.from) || 0) + 1);
  const choices = new Set();
  edges.forEach((e) => {
    const b = blockOf.get(e.to);
    if (e.drawn && b && outDegree.get(e.from) > 1 && b.nodes[0] === e.to) choices.add(b.id);
  });
  const maxCount = edges.reduce((m, e) => (e.drawn ? Math.max(m, e.count || 1) : m), 1);
  return { graph, nodes, blocks, blockOf, indexInBlock, edges, back, pathNodes, pathLinks,
           fallbackNodes, reasons, cases, choices, maxCount };
}

// ---- layout --------------------------------------------------------------------------------------
function layout(P, collapsed) {
  const B = P.blocks;
  const index = new Map(B.map((b, i) => [b, i]));
  const height = B.map((b) =>
    L.header + (collapsed(b) ? 1 : b.nodes.length) * L.step + L.pad);
  const succ = B.map(() => new Map());
  const pred = B.map(() => new Map());
  P.edges.forEach((e, i) => {
    if (P.back.has(i)) return;
    const a = P.blockOf.get(e.from), b = P.blockOf.get(e.to);
    if (!a || !b || a === b) return;
    const ia = index.get(a), ib = index.get(b);
    succ[ia].set(ib, (succ[ia].get(ib) || 0) + (e.count || 1));
  });
  // Leave out edges that close a cycle (depth-first from the blocks nothing enters).
  const state = new Uint8Array(B.length);
  const entered = new Set();
  succ.forEach((m) => m.forEach((_, b) => entered.add(b)));
  const roots = B.map((_, i) => i).filter((i) => !entered.has(i));
  for (const r of roots.concat(B.map((_, i) => i))) {
    if (state[r]) continue;
    state[r] = 1;
    const stack = [[r, [...succ[r].keys()], 0]];
    while (stack.length) {
      const top = stack[stack.length - 1];
      if (top[2] >= top[1].length) { state[top[0]] = 2; stack.pop(); continue; }
      const to = top[1][top[2]++];
      if (state[to] === 1) succ[top[0]].delete(to);
      else if (state[to] === 0) { state[to] = 1; stack.push([to, [...succ[to].keys()], 0]); }
    }
  }
  succ.forEach((m, a) => m.forEach((count, b) => pred[b].set(a, count)));
  // Longest-path layering in pixels: a block starts below the end of all its predecessors.
  const indeg = pred.map((m) => m.size);
  const order = [];
  const queue = B.map((_, i) => i).filter((i) => indeg[i] === 0);
  while (queue.length) {
    const a = queue.shift();
    order.push(a);
    for (const b of succ[a].keys()) if (--indeg[b] === 0) queue.push(b);
  }
  const top = new Float64Array(B.length);
  for (const a of order)
    for (const b of succ[a].keys()) top[b] = Math.max(top[b], top[a] + height[a] + L.gap);
  // Ranks: blocks that start at the same height, ordered by barycentric sweeps.
  const rankOf = new Map();
  for (const a of order) {
    if (!rankOf.has(top[a])) rankOf.set(top[a], []);
    rankOf.get(top[a]).push(a);
  }
  const ranks = [...rankOf.keys()].sort((x, y) => x - y).map((k) => rankOf.get(k));
  const col = new Float64Array(B.length);
  const place = () => {
    const used = []; // per column: [top, bottom) intervals taken
    const free = (c, a) => !(used[c] || []).some(([t, b]) => t < top[a] + height[a] && top[a] < b);
    for (const rank of ranks) {
      let last = -1;
      for (const a of rank) {
        let want = 0, best = -1;
        for (const [p, count] of pred[a]) if (count > best) { best = count; want = col[p]; }
        let c = Math.max(want, last + 1);
        while (!free(c, a)) c++;
        col[a] = c;
        last = c;
        (used[c] = used[c] || []).push([top[a], top[a] + height[a]]);
      }
    }
  };
  const barycenter = (links, a) => {
    let sum = 0, weight = 0;
    for (const [b, count] of links[a]) { sum += col[b] * count; weight += count; }
    return weight ? sum / weight : col[a];
  };
  // Ties (alternatives below one branch point) go heaviest first: the most-taken path keeps the
  // leftmost column and stays a straight line down the graph.
  const weightIn = B.map((_, a) => [...pred[a].values()].reduce((x, y) => x + y, 0));
  const byPred = (x, y) => barycenter(pred, x) - barycenter(pred, y) || weightIn[y] - weightIn[x];
  const bySucc = (x, y) => barycenter(succ, x) - barycenter(succ, y) || weightIn[y] - weightIn[x];
  for (const rank of ranks) rank.sort((x, y) => weightIn[y] - weightIn[x]);
  place();
  for (let sweep = 0; sweep < 2; sweep++) {
    for (const rank of ranks) rank.sort(byPred);
    place();
    for (const rank of [...ranks].reverse()) rank.sort(bySucc);
    place();
  }
  const boxes = new Map();
  let width = 0, bottom = 0;
  B.forEach((b, i) => {
    const box = { x: L.margin + col[i] * L.colW, y: L.margin + top[i], w: L.nodeW + 2 * L.pad,
                  h: height[i], collapsed: collapsed(b), col: col[i] };
    boxes.set(b, box);
    width = Math.max(width, box.x + box.w + L.margin + 60);
    bottom = Math.max(bottom, box.y + box.h + L.margin);
  });
  return { boxes, width, height: bottom };
}

// Where node `id` is drawn: its own slot in an expanded block, else its collapsed block's.
function slot(P, lay, id) {
  const block = P.blockOf.get(id);
  const box = lay.boxes.get(block);
  const k = box.collapsed ? 0 : P.indexInBlock.get(id);
  return { x: box.x + L.pad, y: box.y + L.header + k * L.step, w: L.nodeW, h: L.nodeH, box, block };
}

// ---- the view ------------------------------------------------------------------------------------
function render({ model, el: root }) {
  root.classList.add("terra-view", "terra-graph-view");
  const bar = el("div", { class: "terra-toolbar" }, root);
  const search = el("input", { type: "search", placeholder: "search ops (Enter: next)",
                               class: "terra-search", "aria-label": "search ops" }, bar);
  const found = el("span", { class: "terra-found" }, bar);
  const fit = el("button", { text: "Fit", title: "show the whole graph" }, bar);
  const expandAll = el("button", { text: "Expand all" }, bar);
  const collapseAll = el("button", { text: "Collapse all" }, bar);
  const summary = el("span", { class: "terra-summary" }, bar);
  const body = el("div", { class: "terra-body" }, root);
  const canvas = svg("svg", { class: "terra-canvas", width: "100%", height: "100%" }, body);
  const viewport = svg("g", { class: "terra-viewport" }, canvas);
  const details = el("div", { class: "terra-details" }, body);
  details.textContent = "Click a node for its source line.";
  const legend = el("div", { class: "terra-legend" }, root);
  legend.innerHTML =
    '<span class="k graph">graph op</span><span class="k fetch">fetch</span>' +
    '<span class="k backward">backward</span><span class="k grad">.grad read/write</span>' +
    '<span class="k iteration">iteration start</span>' +
    '<span class="k path">last path</span><span class="k fallback">fallback point</span>' +
    "<span>edge width: times taken · wheel: zoom · drag: pan · block header: collapse</span>";
  const tip = el("div", { class: "terra-tooltip", hidden: true }, root);

  let P = null, lay = null;
  let view = { x: 0, y: 0, k: 1 };
  let fitted = false;
  let selected = null;
  let matches = [];
  let matchAt = -1;
  const overrides = new Map(); // block key -> collapsed (the user's choice survives updates)
  const collapsed = (b) => {
    if (b.nodes.length < 2) return false;
    if (overrides.has(b.key)) return overrides.get(b.key);
    return P.nodes.size > (model.get("collapse_threshold") || 300);
  };

  function rebuild() {
    P = prepare(model.get("graph") || {});
    lay = layout(P, collapsed);
    const s = P.graph.stats || {};
    const blocks = P.blocks.filter((b) => !b.loose).length;
    summary.textContent = `${P.graph.cell || P.graph.name || ""} · ${P.nodes.size} nodes · ` +
      `${blocks} blocks · ${(P.graph.switch_cases || []).length} switch-cases · ` +
      `iterations: ${s.iterations_coexecuted ?? 0} co-executed, ${s.iterations_traced ?? 0} traced, ` +
      `${s.iterations_fallback ?? 0} fell back`;
    root.dataset.nodesTotal = P.nodes.size;
    root.dataset.blocksTotal = blocks;
    if (!fitted) fitView();
    draw();
    runSearch(false);
  }

  function fitView(force = false) {
    const w = canvas.clientWidth || 800, h = canvas.clientHeight || 480;
    const k = Math.min(1, w / lay.width, h / lay.height);
    // Too small to read: keep a legible scale and show the top of the graph ("Fit" shows all).
    const fitAll = k >= 0.6 || force;
    view = { k: fitAll ? k : Math.max(0.6, Math.min(1, w / lay.width)), x: 0, y: 0 };
    view.x = Math.max(0, (w - lay.width * view.k) / 2);
    fitted = true;
  }

  function visibleRect() {
    const w = canvas.clientWidth || 800, h = canvas.clientHeight || 480;
    const m = 0.5;
    return { x0: (-view.x - w * m) / view.k, y0: (-view.y - h * m) / view.k,
             x1: (w * (1 + m) - view.x) / view.k, y1: (h * (1 + m) - view.y) / view.k };
  }

  function draw() {
    viewport.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
    viewport.textContent = "";
    const edgeLayer = svg("g", { class: "terra-edges" }, viewport);
    const blockLayer = svg("g", { class: "terra-blocks" }, viewport);
    const pathLayer = svg("g", { class: "terra-edges terra-path-edges" }, viewport);
    let drawnNodes = 0;
    for (const b of P.blocks) drawnNodes += lay.boxes.get(b).collapsed ? 1 : b.nodes.length;
    const cull = drawnNodes > CULL_ABOVE;
    root.dataset.culled = cull ? "1" : "0";
    const r = visibleRect();
    const inView = (box) => !cull || (box.x < r.x1 && box.x + box.w > r.x0 &&
                                      box.y < r.y1 && box.y + box.h > r.y0);
    const detail = !cull || view.k >= 0.3; // labels only where they can be read
    const boxesOnly = cull && view.k < 0.15; // nodes too small to see: blocks only
    let nodesDrawn = 0, blocksDrawn = 0;
    for (const b of P.blocks) {
      const box = lay.boxes.get(b);
      if (!inView(box)) continue;
      if (b.loose) { // a node outside every block: drawn alone
        const g = svg("g", { class: "terra-loose" }, blockLayer);
        nodesDrawn++;
        drawNode(g, P.nodes.get(b.nodes[0]), slot(P, lay, b.nodes[0]), detail);
        continue;
      }
      blocksDrawn++;
      const g = svg("g", { class: "terra-block" + (box.collapsed ? " collapsed" : ""),
                           "data-block": b.id }, blockLayer);
      const choice = P.choices.has(b.id);
      svg("rect", { class: "terra-block-box" + (choice ? " choice" : ""), x: box.x, y: box.y,
                    width: box.w, height: box.h, rx: 6 }, g);
      const head = svg("text", { class: "terra-block-head", x: box.x + 8, y: box.y + 15 }, g);
      const entering = (P.cases.get(b.id) || {}).entering || [];
      head.textContent = (b.nodes.length > 1 ? (box.collapsed ? "▸ " : "▾ ") : "") +
        `block ${b.id} · ${b.nodes.length} op${b.nodes.length === 1 ? "" : "s"}` +
        (entering.length > 1 ? ` · joins ${entering.length} paths` : "") + (choice ? " · case" : "");
      svg("title", { text: `switch-case of block ${b.id}: entered by ` +
        (entering.length ? entering.map((i) => `${P.edges[i]?.from}→${P.edges[i]?.to}`).join(", ") :
                           "no edge (an iteration start)") +
        (choice ? "; taken when a branch point chooses it" : "") }, head);
      if (box.collapsed) {
        nodesDrawn++;
        drawCollapsed(g, b, box, detail);
      } else if (!boxesOnly) {
        for (const id of b.nodes) {
          nodesDrawn++;
          drawNode(g, P.nodes.get(id), slot(P, lay, id), detail);
        }
      }
    }
    P.edges.forEach((e, i) => {
      const a = P.blockOf.get(e.from), b = P.blockOf.get(e.to);
      if (!a || !b) return;
      const sa = slot(P, lay, e.from), sb = slot(P, lay, e.to);
      if (a === b && (sa.box.collapsed || boxesOnly)) return;
      if (!inView(sa.box) && !inView(sb.box)) return;
      const onPath = P.pathLinks.has(`${e.from}>${e.to}`);
      const width = 1 + 4 * Math.log1p(e.count || 1) / Math.log1p(P.maxCount);
      const d = edgePath(sa, sb, P.back.has(i) || sb.y <= sa.y);
      const p = svg("path", { d, class: "terra-edge" + (onPath ? " on-path" : "") +
                                (P.back.has(i) ? " back" : ""),
                              "stroke-width": width.toFixed(2), "data-count": e.count }, 
                    onPath ? pathLayer : edgeLayer);
      svg("title", { text: `${shortOp(P.nodes.get(e.from)?.op)} → ${shortOp(P.nodes.get(e.to)?.op)}: ` +
                           `taken ×${e.count}` }, p);
    });
    root.dataset.drawnNodes = nodesDrawn;
    root.dataset.drawnBlocks = blocksDrawn;
    markSearch();
    markSelected();
  }

  function drawNode(g, n, s, detail) {
    const cls = ["terra-node", `kind-${n.kind || "graph"}`];
    if (P.pathNodes.has(n.id)) cls.push("on-path");
    if (P.fallbackNodes.has(n.id)) cls.push("fallback");
    const ng = svg("g", { class: cls.join(" "), "data-node": n.id, "data-op": n.op }, g);
    svg("rect", { x: s.x, y: s.y, width: s.w, height: s.h, rx: 3 }, ng);
    if (detail) {
      svg("text", { x: s.x + 6, y: s.y + 15, text: nodeText(n) }, ng);
      if ((n.count ?? 0) > 1)
        svg("text", { class: "terra-count", x: s.x + s.w - 5, y: s.y + 15, text: `×${n.count}` }, ng);
    }
    if (P.fallbackNodes.has(n.id))
      svg("text", { class: "terra-badge", x: s.x - 6, y: s.y + 16, text: "⚠" }, ng);
  }

  function drawCollapsed(g, b, box, detail) {
    const ids = b.nodes;
    const cls = ["terra-node", "terra-collapsed"];
    if (ids.some((id) => P.pathNodes.has(id))) cls.push("on-path");
    const fell = ids.some((id) => P.fallbackNodes.has(id));
    if (fell) cls.push("fallback");
    const x = box.x + L.pad, y = box.y + L.header;
    const ng = svg("g", { class: cls.join(" "), "data-collapsed-block": b.id }, g);
    svg("rect", { x, y, width: L.nodeW, height: L.nodeH, rx: 3 }, ng);
    if (detail) {
      const first = shortOp(P.nodes.get(ids[0]).op), last = shortOp(P.nodes.get(ids[ids.length - 1]).op);
      const text = `${first} … ${last}`;
      svg("text", { x: x + 6, y: y + 15, text: text.length > 34 ? text.slice(0, 33) + "…" : text }, ng);
    }
    if (fell) svg("text", { class: "terra-badge", x: x - 6, y: y + 16, text: "⚠" }, ng);
  }

  function edgePath(sa, sb, backward) {
    const x1 = sa.x + sa.w / 2, y1 = sa.y + sa.h, x2 = sb.x + sb.w / 2, y2 = sb.y;
    if (backward) {
      // Loops back up: around the right side of both nodes.
      const side = Math.max(sa.x + sa.w, sb.x + sb.w) + 28;
      return `M${sa.x + sa.w},${sa.y + sa.h / 2} C${side},${sa.y + sa.h / 2} ${side},${sb.y + sb.h / 2} ` +
             `${sb.x + sb.w},${sb.y + sb.h / 2}`;
    }
    if (x1 === x2 && sa.box !== sb.box && y2 - y1 > L.gap + 1 && blocked(sa.box.col, y1, y2)) {
      // A straight line would run over blocks between the two: go down the column's gutter.
      const gx = sa.x + sa.w + (L.colW - L.nodeW) / 2 - 2;
      return `M${x1},${y1} C${x1},${y1 + 14} ${gx},${y1 + 4} ${gx},${y1 + 24} L${gx},${y2 - 24} ` +
             `C${gx},${y2 - 4} ${x2},${y2 - 14} ${x2},${y2}`;
    }
    const dy = Math.max(12, (y2 - y1) / 2);
    return `M${x1},${y1} C${x1},${y1 + dy} ${x2},${y2 - dy} ${x2},${y2}`;
  }

  function blocked(column, y1, y2) {
    for (const box of lay.boxes.values())
      if (box.col === column && box.y > y1 && box.y + box.h < y2) return true;
    return false;
  }

  // ---- interaction ---------------------------------------------------------------------------
  function nodeOf(target) {
    const g = target.closest && target.closest(".terra-node");
    if (!g) return null;
    if (g.dataset.node !== undefined) return { node: P.nodes.get(Number(g.dataset.node)) };
    const b = P.blocks.find((x) => String(x.id) === g.dataset.collapsedBlock);
    return b ? { block: b } : null;
  }

  function describe(hit) {
    if (hit.block) {
      const ops = new Map();
      for (const id of hit.block.nodes) {
        const op = shortOp(P.nodes.get(id).op);
        ops.set(op, (ops.get(op) || 0) + 1);
      }
      const top = [...ops].sort((a, b) => b[1] - a[1]).slice(0, 8)
        .map(([op, c]) => `${op} ×${c}`).join(", ");
      return `<b>block ${hit.block.id}</b> (collapsed): ${hit.block.nodes.length} ops<br>${esc(top)}` +
        "<br><i>click its header to expand</i>";
    }
    const n = hit.node;
    const w = n.where;
    let out = `<b>${esc(n.op)}</b> <span class="terra-kind">${esc(n.kind || "")}</span><br>` +
      `shapes: ${esc((n.shapes || []).join("; ") || "none")}<br>executed ×${n.count ?? "?"} · node ${n.id}` +
      ` · block ${P.blockOf.get(n.id)?.id}`;
    if (w) out += `<div class="terra-where">${esc(whereText(w))}</div>` +
                  (w.code ? `<pre class="terra-code">${esc(w.code)}</pre>` : "");
    else out += "<div class=\"terra-where\">no user source line (library or engine op)</div>";
    for (const f of P.reasons.get(n.id) || [])
      out += `<div class="terra-reason">fell back ×${f.count ?? 1}: ${esc(f.reason)}</div>`;
    return out;
  }

  function esc(s) {
    return String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  }

  function select(hit) {
    selected = hit;
    if (!hit) { details.textContent = "Click a node for its source line."; markSelected(); return; }
    let html = describe(hit);
    if (hit.node) {
      const stack = (hit.node.source?.frames || []).map((f) => `${f.file.split("/").slice(-2).join("/")}:${f.line} ${f.function}`);
      if (stack.length) html += `<details><summary>stack (outermost first)</summary><pre>${esc(stack.join("\n"))}</pre></details>`;
    }
    details.innerHTML = html;
    markSelected();
  }

  function markSelected() {
    viewport.querySelectorAll(".selected").forEach((x) => x.classList.remove("selected"));
    if (!selected) return;
    const q = selected.node ? `[data-node="${selected.node.id}"]` : `[data-collapsed-block="${selected.block.id}"]`;
    viewport.querySelector(q)?.classList.add("selected");
  }

  function runSearch(jump) {
    const q = search.value.trim().toLowerCase();
    matches = !q ? [] : [...P.nodes.values()].filter((n) =>
      String(n.op || "").toLowerCase().includes(q) || String(n.label || "").toLowerCase().includes(q));
    found.textContent = q ? `${matches.length} match${matches.length === 1 ? "" : "es"}` : "";
    if (jump && matches.length) {
      matchAt = (matchAt + 1) % matches.length;
      const n = matches[matchAt];
      const b = P.blockOf.get(n.id);
      if (collapsed(b)) { overrides.set(b.key, false); lay = layout(P, collapsed); }
      const s = slot(P, lay, n.id);
      const w = canvas.clientWidth || 800, h = canvas.clientHeight || 480;
      view = { k: Math.max(view.k, 0.8), x: 0, y: 0 };
      view.x = w / 2 - (s.x + s.w / 2) * view.k;
      view.y = h / 2 - (s.y + s.h / 2) * view.k;
      draw();
      select({ node: n });
    } else {
      markSearch();
    }
  }

  function markSearch() {
    const ids = new Set(matches.map((n) => n.id));
    viewport.querySelectorAll(".terra-node").forEach((g) => {
      let hit = false;
      if (g.dataset.node !== undefined) hit = ids.has(Number(g.dataset.node));
      else {
        const b = P.blocks.find((x) => String(x.id) === g.dataset.collapsedBlock);
        hit = !!b && b.nodes.some((id) => ids.has(id));
      }
      g.classList.toggle("match", hit);
    });
    root.dataset.matches = ids.size;
  }

  search.addEventListener("input", () => { matchAt = -1; runSearch(false); });
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") runSearch(true); });
  fit.addEventListener("click", () => { fitView(true); draw(); });
  const setAll = (value) => {
    for (const b of P.blocks) if (b.nodes.length > 1) overrides.set(b.key, value);
    lay = layout(P, collapsed);
    draw();
  };
  expandAll.addEventListener("click", () => setAll(false));
  collapseAll.addEventListener("click", () => setAll(true));

  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect();
    const px = e.clientX - r.left, py = e.clientY - r.top;
    const k = Math.min(4, Math.max(0.03, view.k * Math.exp(-e.deltaY * 0.0015)));
    view = { k, x: px - (px - view.x) * (k / view.k), y: py - (py - view.y) * (k / view.k) };
    schedule();
  }, { passive: false });

  let drag = null, frame = 0;
  function schedule() {
    viewport.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      if (root.dataset.culled === "1") draw(); // bring in what came into view
    });
  }
  canvas.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false };
  });
  const onMove = (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true;
    canvas.classList.add("panning");
    view = { k: view.k, x: drag.vx + dx, y: drag.vy + dy };
    schedule();
  };
  const onUp = () => {
    if (drag && drag.moved) setTimeout(() => { drag = null; }, 0); // swallow the click
    else drag = null;
    canvas.classList.remove("panning");
  };
  window.addEventListener("pointermove", onMove);
  window.addEventListener("pointerup", onUp);
  canvas.addEventListener("click", (e) => {
    if (drag && drag.moved) return;
    const head = e.target.closest && e.target.closest(".terra-block-head");
    if (head) {
      const b = P.blocks.find((x) => String(x.id) === head.parentNode.dataset.block);
      if (b && b.nodes.length > 1) {
        overrides.set(b.key, !collapsed(b));
        lay = layout(P, collapsed);
        draw();
      }
      return;
    }
    select(nodeOf(e.target));
  });
  canvas.addEventListener("mousemove", (e) => {
    const hit = nodeOf(e.target);
    if (!hit) { tip.hidden = true; return; }
    tip.innerHTML = describe(hit);
    const r = root.getBoundingClientRect();
    tip.style.left = `${e.clientX - r.left + 14}px`;
    tip.style.top = `${e.clientY - r.top + 14}px`;
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });

  model.on("change:graph", () => {
    const keep = selected && selected.node ? selected.node.id : null;
    rebuild();
    if (keep !== null && P.nodes.has(keep)) select({ node: P.nodes.get(keep) });
  });
  // The output area may get its size after the first render: fit once it has one.
  const sized = new ResizeObserver(() => {
    if (canvas.clientWidth && !root.dataset.sized) {
      root.dataset.sized = "1";
      fitView();
      draw();
    }
  });
  sized.observe(canvas);
  rebuild();
  return () => {
    sized.disconnect();
    window.removeEventListener("pointermove", onMove);
    window.removeEventListener("pointerup", onUp);
  };
}

export default { render };
