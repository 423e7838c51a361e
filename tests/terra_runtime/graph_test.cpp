// The runtime's Graph (graph.h): the core's TraceGraph built op by op, a RuntimeNode per NodeId
// beside it, and the views' JSON made from that one graph.
#include "graph.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace terra::runtime {
namespace {

OpTemplate named(const char* name, OpKind kind = OpKind::Aten) {
  OpTemplate t;
  t.kind = kind;
  t.name = name;
  return t;
}

// Walks `path` (node ids) as the PythonRunner does: from the entry, each edge taken, then the end.
void walk(Graph& g, std::vector<uint32_t> path) {
  uint32_t prev = terra::kEntryNode;
  for (uint32_t id : path) {
    g.trace.take(prev, id);
    prev = id;
  }
  g.record_path(path);
}

TEST(Graph, NodeIdsAreTheTraceGraphsAndALocationsVariantsAreItsNextKeys) {
  Graph g;
  const terra::LocationKey at{7, 8, 0};
  const uint32_t a = g.add_node(named("aten::add"), /*lookup=*/100, at);
  const uint32_t b = g.add_node(named("aten::add"), /*lookup=*/100, at);  // same location, other template
  EXPECT_EQ(a, 2u);  // after the virtual entry and exit
  EXPECT_EQ(b, 3u);
  EXPECT_EQ(g.nodes.size(), g.trace.size());
  EXPECT_EQ(g.trace.node(a).key.variant, 0u);
  EXPECT_EQ(g.trace.node(b).key.variant, 1u);
  EXPECT_EQ(g.index.at(100), (std::vector<uint32_t>{a, b}));
  EXPECT_EQ(g.nodes[b].tmpl.name, "aten::add");
  EXPECT_EQ(g.op_nodes(), 2u);
}

TEST(Graph, TheViewsJsonIsTheOneGraphWithItsBlocksAndLastPath) {
  Graph g;
  const uint32_t marker = g.add_node(named("iteration 1", OpKind::Marker), 1, {90, 1, 0});
  const uint32_t x = g.add_node(named("aten::mm"), 2, {1, 2, 0});
  const uint32_t y = g.add_node(named("aten::relu"), 3, {1, 3, 0});
  const uint32_t z = g.add_node(named("aten::sum"), 4, {1, 4, 0});
  walk(g, {marker, x, y, z});
  walk(g, {marker, x, z});  // a branch at x, joining again at z
  walk(g, {marker, x, y, z});
  EXPECT_EQ(g.trace.path_count(), 2u);
  EXPECT_EQ(g.trace.node(x).count, 3u);
  EXPECT_EQ(g.trace.node(y).count, 2u);

  // The core's export schema (terra/export.h) with the runtime's fields on each node.
  const nlohmann::json j = to_json(g);
  ASSERT_EQ(j["nodes"].size(), 6u);
  EXPECT_EQ(j["nodes"][0]["kind"], "entry");
  EXPECT_EQ(j["nodes"][1]["kind"], "exit");
  EXPECT_EQ(j["nodes"][marker]["kind"], "iteration");
  EXPECT_EQ(j["nodes"][y]["count"], 2);
  EXPECT_EQ(j["nodes"][y]["op"], "aten::relu");
  EXPECT_EQ(j["nodes"][y]["fallback"], false);
  EXPECT_EQ(j["last_path"], (std::vector<uint32_t>{marker, x, y, z}));
  // entry-marker, marker-x, x-y, y-z, z-exit, x-z
  ASSERT_EQ(j["control_edges"].size(), 6u);
  for (size_t e = 0; e < j["control_edges"].size(); ++e) EXPECT_EQ(j["control_edges"][e]["id"], e);
  // Blocks: {marker, x}, {y}, {z}; z's switch-case is entered from y and from x.
  ASSERT_EQ(j["blocks"].size(), 3u);
  EXPECT_EQ(j["blocks"][0]["nodes"], (std::vector<uint32_t>{marker, x}));
  bool joined = false;
  for (const auto& c : j["switch_cases"]) {
    const auto& first = j["blocks"][c["block"].get<size_t>()]["nodes"][0];
    for (const auto& e : c["entering"]) EXPECT_EQ(j["control_edges"][e.get<size_t>()]["to"], first);
    joined = joined || (first == z && c["entering"].size() == 2);
  }
  EXPECT_TRUE(joined);
  EXPECT_EQ(j["stats"]["nodes"], 4);
  EXPECT_EQ(j["stats"]["edges"], 4);  // between op nodes, as the views draw them
}

}  // namespace
}  // namespace terra::runtime
