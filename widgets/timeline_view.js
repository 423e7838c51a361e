// Terra timeline view: an anywidget ES module (plain JavaScript, no build step, no imports;
// the kernel puts widgets/dom.js in front of it).
//
// Draws the `timeline` the kernel syncs (terra.timeline: spans of recent iterations in
// steady-clock ns, see kernel/python/terra_kernel/viewdata.py) as two SVG charts:
// - lanes "Python thread" and "GraphRunner", one bar per span coloured by its kind (an iteration
//   traced, co-executed, fallen back or eager; waits for a fetch or a divergence drawn thinner
//   inside the iteration they interrupt; GraphRunner busy); it opens on the last run (after the
//   last idle gap, as between two cells; "Whole window" shows every span), the wheel zooms the
//   time axis, dragging pans it, hovering shows a span's details;
// - the step time of each iteration in order, coloured by how it ran; clicking a bar zooms the
//   lanes to that iteration.

const COLORS = { tracing: "#e8a33d", coexec: "#4c9f70", fallback: "#d9534f", eager: "#9e9e9e",
                 fetch_wait: "#7b61c4", diverge: "#a93226", busy: "#3b7dd8" };
const MODE_KIND = { traced: "tracing", coexec: "coexec", fallback: "fallback", eager: "eager" };
const NESTED = new Set(["fetch_wait", "diverge"]);
const LANE_ORDER = ["python", "graph"];
const IDLE_GAP_NS = 250e6; // no Python-lane span for this long: the program was idle (between cells)
const M = { left: 104, right: 16, top: 26, lane: 34, laneGap: 10, axis: 26, steps: 150 };

const color = (kind) => COLORS[kind] || "#bbbbbb";

// Round tick steps (1, 2, 5 × 10^n) for an axis spanning `span` units over `pixels`.
function ticks(lo, hi, pixels) {
  const span = Math.max(hi - lo, 1e-9);
  const raw = span / Math.max(2, pixels / 90);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) out.push(+t.toFixed(9));
  return out;
}

const fmtTick = (t) => String(+t.toFixed(6)); // ticks are round numbers: no padding zeros

function fmtMs(ms) {
  if (ms === 0) return "0";
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms >= 1 ? ms.toFixed(2) : ms.toFixed(3);
}

function render({ model, el: root }) {
  root.classList.add("terra-view", "terra-timeline-view");
  const bar = el("div", { class: "terra-toolbar" }, root);
  const reset = el("button", { text: "Whole window", title: "show every recorded span" }, bar);
  const summary = el("span", { class: "terra-summary" }, bar);
  const lanesChart = svg("svg", { class: "terra-chart terra-lanes" }, root);
  const stepsChart = svg("svg", { class: "terra-chart terra-steps" }, root);
  const legend = el("div", { class: "terra-legend" }, root);
  legend.innerHTML = Object.keys(COLORS).map((k) =>
    `<span class="k ${k === "fallback" ? "fallback-kind" : k}">${k.replace("_", " ")}</span>`).join("") +
    "<span>wheel: zoom time · drag: pan · click a step bar: zoom to it</span>";
  const tip = el("div", { class: "terra-tooltip", hidden: true }, root);

  // Time shown (ms): `domain` once the user zoomed or panned, else the last run (the spans after
  // the last idle gap, as between two cells), and everything after "Whole window".
  let data = null, origin = 0, full = [0, 1], lastRun = [0, 1], domain = null, whole = false;

  function rebuild() {
    const t = model.get("timeline") || {};
    const events = t.events || [];
    const iterations = t.iterations || [];
    const starts = events.map((e) => e.start_ns).concat(iterations.map((i) => i.start_ns));
    const ends = events.map((e) => e.end_ns).concat(iterations.map((i) => i.end_ns));
    // (reduce, not Math.min(...xs): no argument-count limit however many spans come)
    origin = starts.length ? starts.reduce((a, b) => Math.min(a, b)) : 0;
    const end = ends.length ? ends.reduce((a, b) => Math.max(a, b)) : origin + 1e6;
    full = [0, Math.max((end - origin) / 1e6, 1e-3)];
    lastRun = full;
    const spans = events.filter((e) => e.lane === "python").sort((a, b) => a.start_ns - b.start_ns);
    let reach = -Infinity;
    for (const e of spans) {
      if (e.start_ns - reach > IDLE_GAP_NS) lastRun = [(e.start_ns - origin) / 1e6, full[1]];
      reach = Math.max(reach, e.end_ns);
    }
    const pad = (lastRun[1] - lastRun[0]) * 0.01;
    lastRun = [Math.max(0, lastRun[0] - pad), lastRun[1] + pad];
    data = { t, events, iterations };
    const modes = {};
    for (const it of iterations) modes[it.mode] = (modes[it.mode] || 0) + 1;
    summary.textContent = `${t.graph ? t.graph + " · " : ""}${iterations.length} iterations · ` +
      `${events.length} spans` + (Object.keys(modes).length ? " · " +
      Object.entries(modes).map(([m, n]) => `${n} ${m}`).join(", ") : "");
    draw();
  }

  function draw() {
    drawLanes();
    drawSteps();
  }

  function width() {
    return Math.max(320, root.clientWidth || 800);
  }

  function drawLanes() {
    const W = width();
    const lanes = LANE_ORDER.concat(Object.keys(data.t.lanes || {}).filter((l) => !LANE_ORDER.includes(l)));
    const H = M.top + lanes.length * (M.lane + M.laneGap) + M.axis;
    lanesChart.setAttribute("viewBox", `0 0 ${W} ${H}`);
    lanesChart.setAttribute("height", H);
    lanesChart.textContent = "";
    const [lo, hi] = domain || (whole ? full : lastRun);
    const plotW = W - M.left - M.right;
    const x = (ms) => M.left + ((ms - lo) / (hi - lo)) * plotW;
    svg("text", { class: "terra-chart-title", x: 8, y: 16,
                  text: "Python thread and GraphRunner over time (ms)" +
                        (!domain && !whole && lastRun[0] > 0 ? ": the last run" : "") }, lanesChart);
    const clip = svg("clipPath", { id: `terra-clip-${model.cid || "t"}` }, svg("defs", {}, lanesChart));
    svg("rect", { x: M.left, y: 0, width: plotW, height: H }, clip);
    const plot = svg("g", { "clip-path": `url(#terra-clip-${model.cid || "t"})` }, lanesChart);
    const counts = {};
    lanes.forEach((lane, i) => {
      const y = M.top + i * (M.lane + M.laneGap);
      svg("text", { class: "terra-lane-title", x: 8, y: y + M.lane / 2 + 4,
                    text: (data.t.lanes || {})[lane] || lane }, lanesChart);
      svg("rect", { x: M.left, y, width: plotW, height: M.lane, fill: "rgba(127,127,127,0.07)" }, plot);
      const spans = data.events.filter((e) => e.lane === lane);
      counts[lane] = 0;
      // Whole spans first, nested waits on top of them.
      for (const nested of [false, true]) {
        for (const e of spans) {
          if (NESTED.has(e.kind) !== nested) continue;
          const s = (e.start_ns - origin) / 1e6, t = (e.end_ns - origin) / 1e6;
          if (t < lo || s > hi) continue;
          const x0 = x(s), w = Math.max(0.6, x(t) - x0);
          const r = svg("rect", { class: "terra-span" + (nested ? " nested" : ""), x: x0,
                                  y: nested ? y + M.lane * 0.3 : y, width: w,
                                  height: nested ? M.lane * 0.4 : M.lane, fill: color(e.kind),
                                  "data-kind": e.kind, "data-lane": lane }, plot);
          r.__span = e;
          counts[lane]++;
        }
      }
    });
    const axisY = M.top + lanes.length * (M.lane + M.laneGap);
    const axis = svg("g", { class: "terra-axis" }, lanesChart);
    svg("line", { x1: M.left, x2: W - M.right, y1: axisY, y2: axisY }, axis);
    for (const t of ticks(lo, hi, plotW)) {
      svg("line", { x1: x(t), x2: x(t), y1: axisY, y2: axisY + 4 }, axis);
      svg("text", { x: x(t), y: axisY + 16, "text-anchor": "middle", text: fmtTick(t) }, axis);
    }
    root.dataset.spansPython = counts.python || 0;
    root.dataset.spansGraph = counts.graph || 0;
    lanesChart.__x = { lo, hi, plotW };
  }

  function drawSteps() {
    const W = width(), H = M.steps + M.top + M.axis;
    stepsChart.setAttribute("viewBox", `0 0 ${W} ${H}`);
    stepsChart.setAttribute("height", H);
    stepsChart.textContent = "";
    svg("text", { class: "terra-chart-title", x: 8, y: 16,
                  text: "Step time per iteration (ms), by how it ran" }, stepsChart);
    const its = data.iterations;
    const plotW = W - M.left - M.right;
    const top = 1.08 * its.reduce((m, it) => Math.max(m, (it.end_ns - it.start_ns) / 1e6), 1e-3);
    const y = (ms) => M.top + M.steps - (ms / top) * M.steps;
    const axis = svg("g", { class: "terra-axis" }, stepsChart);
    svg("line", { x1: M.left, x2: M.left, y1: M.top, y2: M.top + M.steps }, axis);
    svg("line", { x1: M.left, x2: W - M.right, y1: M.top + M.steps, y2: M.top + M.steps }, axis);
    for (const t of ticks(0, top, M.steps * 2).filter((_, i, a) => a.length < 8 || i % 2 === 0)) {
      svg("line", { x1: M.left - 4, x2: M.left, y1: y(t), y2: y(t) }, axis);
      svg("text", { x: M.left - 7, y: y(t) + 4, "text-anchor": "end", text: fmtTick(t) }, axis);
    }
    svg("text", { class: "terra-lane-title", x: M.left, y: M.top + M.steps + 18,
                  text: its.length ? `${its.length} recent iterations, oldest first` :
                                     "no iterations recorded yet" }, stepsChart);
    const bw = plotW / Math.max(1, its.length);
    its.forEach((it, i) => {
      const ms = (it.end_ns - it.start_ns) / 1e6;
      const r = svg("rect", { class: "terra-bar", x: M.left + i * bw + (bw > 3 ? 0.5 : 0),
                              y: y(ms), width: Math.max(0.5, bw > 3 ? bw - 1 : bw),
                              height: Math.max(0.5, M.top + M.steps - y(ms)),
                              fill: color(MODE_KIND[it.mode] || it.mode), "data-mode": it.mode }, stepsChart);
      r.__iteration = it;
    });
    root.dataset.bars = its.length;
  }

  function esc(s) {
    return String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  }

  function showTip(e, html) {
    const r = root.getBoundingClientRect();
    tip.innerHTML = html;
    tip.style.left = `${e.clientX - r.left + 14}px`;
    tip.style.top = `${e.clientY - r.top + 14}px`;
    tip.hidden = false;
  }

  root.addEventListener("mousemove", (e) => {
    const span = e.target.__span, it = e.target.__iteration;
    if (span) {
      const ms = (span.end_ns - span.start_ns) / 1e6;
      showTip(e, `<b>${esc(span.kind)}</b> · ${esc((data.t.lanes || {})[span.lane] || span.lane)}<br>` +
        `${fmtMs(ms)} ms · iteration ${esc(span.iteration)}` + (span.graph ? ` · ${esc(span.graph)}` : "") +
        (span.detail ? `<br>${esc(span.detail)}` : ""));
    } else if (it) {
      showTip(e, `<b>iteration ${esc(it.index)}</b> · ${esc(it.mode)}<br>` +
        `${fmtMs((it.end_ns - it.start_ns) / 1e6)} ms · ${esc(it.graph)}`);
    } else tip.hidden = true;
  });
  root.addEventListener("mouseleave", () => { tip.hidden = true; });

  stepsChart.addEventListener("click", (e) => {
    const it = e.target.__iteration;
    if (!it) return;
    const s = (it.start_ns - origin) / 1e6, t = (it.end_ns - origin) / 1e6;
    const pad = (t - s) * 0.1;
    domain = [s - pad, t + pad];
    drawLanes();
  });
  reset.addEventListener("click", () => { domain = null; whole = true; drawLanes(); });

  lanesChart.addEventListener("wheel", (e) => {
    e.preventDefault();
    const { lo, hi, plotW } = lanesChart.__x;
    const r = lanesChart.getBoundingClientRect();
    const f = Math.min(1, Math.max(0, (e.clientX - r.left - M.left) / plotW));
    const at = lo + f * (hi - lo);
    const k = Math.exp(e.deltaY * 0.0015);
    const span = Math.min(full[1] - full[0], Math.max(1e-4, (hi - lo) * k));
    domain = [at - f * span, at - f * span + span];
    drawLanes();
  }, { passive: false });
  let drag = null;
  lanesChart.addEventListener("pointerdown", (e) => {
    if (e.button === 0) drag = { x: e.clientX, d: (domain || (whole ? full : lastRun)).slice() };
  });
  const onMove = (e) => {
    if (!drag) return;
    const { plotW } = lanesChart.__x;
    const dms = ((e.clientX - drag.x) / plotW) * (drag.d[1] - drag.d[0]);
    domain = [drag.d[0] - dms, drag.d[1] - dms];
    drawLanes();
  };
  const onUp = () => { drag = null; };
  window.addEventListener("pointermove", onMove);
  window.addEventListener("pointerup", onUp);

  model.on("change:timeline", rebuild);
  const resized = new ResizeObserver(() => { if (data) draw(); });
  resized.observe(root);
  rebuild();
  return () => {
    resized.disconnect();
    window.removeEventListener("pointermove", onMove);
    window.removeEventListener("pointerup", onUp);
  };
}

export default { render };
