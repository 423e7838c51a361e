// DOM helpers shared by the views. Not a module of its own: the kernel (views.py) and the
// standalone test page put this text in front of each view's ES module, so every view stays one
// self-contained module with no imports.

const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, parent = null, ns = null) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, String(v));
  }
  if (parent) parent.appendChild(node);
  return node;
}
const svg = (tag, attrs, parent) => el(tag, attrs, parent, SVG_NS);
