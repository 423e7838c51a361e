#include "terra/export.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace terra {
namespace {

using nlohmann::json;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

json frame_json(const SourceFrame& f) { return {{"file", f.file}, {"line", f.line}, {"function", f.function}}; }

json node_json(const TraceGraph& g, NodeId id) {
  const Node& n = g.node(id);
  json j = {{"id", id}, {"key", to_string(n.key)}, {"label", label(g, id)}, {"count", n.count},
            {"fetch_count", n.fetch_count}};
  j["op"] = n.source ? json(n.source->op_name) : json(nullptr);
  j["source"] = source_json(n.source.get());
  j["where"] = where_json(n.source.get());
  json outputs = json::array();
  for (const MetaVariant& v : n.metas) {
    json tensors = json::array();
    for (const TensorMeta& m : v.outputs)
      tensors.push_back({{"sizes", m.sizes}, {"strides", m.strides}, {"dtype", m.dtype},
                         {"device_type", m.device_type}, {"device_index", m.device_index},
                         {"requires_grad", m.requires_grad}});
    outputs.push_back({{"count", v.count}, {"tensors", tensors}});
  }
  j["outputs"] = outputs;
  json inputs = json::array();
  for (const std::vector<Producer>& producers : n.inputs) {
    json sources = json::array();
    for (const Producer& p : producers) {
      json s = {{"kind", to_string(p.kind)}, {"output", p.output}, {"count", p.count}};
      if (p.kind == ValueRef::Kind::Op)
        s["node"] = p.id;
      else
        s["id"] = hex(p.id);
      sources.push_back(s);
    }
    inputs.push_back(sources);
  }
  j["inputs"] = inputs;
  return j;
}

json input_json(const SegmentInput& in) {
  json j = {{"kind", to_string(in.kind)}, {"output", in.output}};
  bool engine_id = in.kind == SegmentInput::Kind::Local || in.kind == SegmentInput::Kind::Slot ||
                   in.kind == SegmentInput::Kind::Select;
  j["id"] = engine_id ? json(in.id) : json(hex(in.id));
  return j;
}

json targets_json(const std::vector<PathTarget>& targets) {
  json out = json::array();
  for (const PathTarget& t : targets)
    out.push_back({{"key", to_string(t.key)},
                   {"segment", t.segment == kNone ? json(nullptr) : json(t.segment)},
                   {"edge", t.edge}});
  return out;
}

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

json source_json(const SourceInfo* source) {
  if (!source) return nullptr;
  json frames = json::array();
  for (const SourceFrame& f : source->frames) frames.push_back(frame_json(f));
  return {{"op", source->op_name}, {"frames", frames}};
}

json where_json(const SourceInfo* source) {
  const SourceFrame* f = source ? user_frame(*source) : nullptr;
  return f ? frame_json(*f) : json(nullptr);
}

std::string label(const TraceGraph& g, NodeId id) {
  if (id == kEntryNode) return "entry";
  if (id == kExitNode) return "exit";
  const Node& n = g.node(id);
  std::string where = n.source ? describe(*n.source) : to_string(n.key);
  return n.key.occurrence ? where + " #" + std::to_string(n.key.occurrence) : where;
}

json to_json(const TraceGraph& g) {
  json nodes = json::array();
  for (NodeId id = 0; id < g.size(); ++id) nodes.push_back(node_json(g, id));
  json control = json::array();
  for (EdgeId e = 0; e < g.edges().size(); ++e)
    control.push_back({{"id", e}, {"from", g.edge(e).from}, {"to", g.edge(e).to}, {"count", g.edge(e).count}});
  json data = json::array();
  for (const DataEdge& d : g.data_edges())
    data.push_back({{"from", d.from}, {"output", d.output}, {"to", d.to}, {"input", d.input}, {"count", d.count}});
  return {{"traces", g.trace_count()},
          {"paths", g.path_count()},
          {"ends",
           {{"normal", g.end_count(TraceEnd::Normal)},
            {"exception", g.end_count(TraceEnd::Exception)},
            {"break", g.end_count(TraceEnd::Break)}}},
          {"nodes", nodes},
          {"control_edges", control},
          {"data_edges", data}};
}

json to_json(const TraceGraph& g, const CaseAssignment& c) {
  json j = to_json(g);
  json blocks = json::array();
  json cases = json::array();
  for (BlockId b = 0; b < c.cases.size(); ++b) {
    blocks.push_back({{"id", b}, {"nodes", c.cases[b].block.nodes}});
    cases.push_back({{"block", b}, {"entering", c.cases[b].entering}});
  }
  j["blocks"] = blocks;
  j["switch_cases"] = cases;
  j["back_edges"] = c.back_edges;
  return j;
}

json to_json(const SymbolicGraph& g) {
  json slots = json::array();
  for (const Slot& s : g.slots) slots.push_back({{"node", s.node}, {"output", s.output}, {"segment", s.segment}});
  json segments = json::array();
  for (uint32_t i = 0; i < g.segments.size(); ++i) {
    const Segment& s = g.segments[i];
    json ops = json::array();
    for (const SegmentOp& op : s.ops) {
      json inputs = json::array();
      for (const SegmentInput& in : op.inputs) inputs.push_back(input_json(in));
      ops.push_back({{"node", op.node}, {"key", to_string(op.key)}, {"inputs", inputs}, {"outputs", op.num_outputs}});
    }
    json selects = json::array();
    for (const Select& sel : s.selects) {
      json candidates = json::array();
      for (const SegmentInput& in : sel.candidates) candidates.push_back(input_json(in));
      selects.push_back({{"op", sel.op}, {"input", sel.input}, {"candidates", candidates}});
    }
    json writes = json::array();
    for (const SlotWrite& w : s.writes) writes.push_back({{"op", w.op}, {"output", w.output}, {"slot", w.slot}});
    json feeds = json::array();
    for (const FeedPoint& f : s.feeds) feeds.push_back({{"op", f.op}, {"input", f.input}, {"feed", hex(f.feed)}});
    json fetches = json::array();
    for (const FetchPoint& f : s.fetches) fetches.push_back({{"op", f.op}, {"node", f.node}});
    segments.push_back({{"id", i},
                        {"entering", s.entering},
                        {"ops", ops},
                        {"selects", selects},
                        {"writes", writes},
                        {"feeds", feeds},
                        {"fetches", fetches},
                        {"next", targets_json(s.next)}});
  }
  return {{"single_pass", g.single_pass}, {"slots", slots}, {"entry", targets_json(g.entry)}, {"segments", segments}};
}

std::string to_dot(const TraceGraph& g, const CaseAssignment& c) {
  auto node_line = [&](NodeId id, const char* extra) {
    return "  n" + std::to_string(id) + " [label=\"" + dot_escape(label(g, id)) + "\\n" +
           std::to_string(g.node(id).count) + "x\"" + extra + "];\n";
  };
  std::string out = "digraph trace_graph {\n  node [shape=box, fontname=\"monospace\"];\n";
  out += node_line(kEntryNode, ", shape=oval");
  out += node_line(kExitNode, ", shape=oval");
  for (BlockId b = 0; b < c.cases.size(); ++b) {
    out += " subgraph cluster_" + std::to_string(b) + " {\n  label=\"case " + std::to_string(b) + "\";\n";
    for (NodeId id : c.cases[b].block.nodes)
      out += node_line(id, g.node(id).fetch_count ? ", style=bold" : "");
    out += " }\n";
  }
  for (const ControlEdge& e : g.edges())
    out += "  n" + std::to_string(e.from) + " -> n" + std::to_string(e.to) + " [label=\"" + std::to_string(e.count) + "\"];\n";
  for (const DataEdge& d : g.data_edges())
    out += "  n" + std::to_string(d.from) + " -> n" + std::to_string(d.to) +
           " [style=dashed, color=gray, constraint=false];\n";
  out += "}\n";
  return out;
}

}  // namespace terra
