#include "terra/export.h"

#include <nlohmann/json.hpp>

#include "trace_builder.h"

namespace terra::test {
namespace {

using V = ValueRef;

std::vector<Trace> sample() {
  std::vector<Trace> out;
  auto source = std::make_shared<const SourceInfo>(SourceInfo{"aten::relu", {{"net \"v2\".py", 8, "fwd"}}});
  for (bool c : {true, false, true}) {
    TraceBuilder b;
    auto h = b.op("linear", site(1), {V::feed(0), V::external(0xdeadbeefcafef00dull)});
    if (c) h = b.op("relu", site(2), {b.out(h)});
    b.op("sum", site(3), {b.out(h)}, true, {meta({})});
    Trace t = b.finish();
    if (c) t.ops[1].source = source;
    out.push_back(std::move(t));
  }
  return out;
}

TEST(Export, TraceGraphJsonHasCountsAndStructure) {
  TraceGraph g;
  for (const Trace& t : sample()) g.merge(t);
  CaseAssignment c = assign_cases(g);
  nlohmann::json j = nlohmann::json::parse(to_json(g, c).dump());
  EXPECT_EQ(j["traces"], 3);
  EXPECT_EQ(j["ends"]["normal"], 3);
  ASSERT_EQ(j["nodes"].size(), g.size());
  EXPECT_EQ(j["nodes"][0]["label"], "entry");
  const nlohmann::json& relu = j["nodes"][3];
  EXPECT_EQ(relu["op"], "aten::relu");
  EXPECT_EQ(relu["label"], "aten::relu at net \"v2\".py:8 in fwd");
  EXPECT_EQ(relu["source"]["frames"][0]["line"], 8);
  EXPECT_EQ(j["nodes"][2]["inputs"][1][0]["id"], "deadbeefcafef00d");
  EXPECT_EQ(j["nodes"][4]["fetch_count"], 3);
  EXPECT_EQ(j["nodes"][4]["outputs"][0]["tensors"][0]["sizes"].size(), 0u);
  for (NodeId id = 0; id < g.size(); ++id) EXPECT_EQ(j["nodes"][id]["count"], g.node(id).count);
  ASSERT_EQ(j["control_edges"].size(), g.edges().size());
  for (EdgeId e = 0; e < g.edges().size(); ++e) EXPECT_EQ(j["control_edges"][e]["count"], g.edge(e).count);
  EXPECT_EQ(j["data_edges"].size(), g.data_edges().size());
  EXPECT_EQ(j["blocks"].size(), c.cases.size());
  EXPECT_EQ(j["switch_cases"][c.cases.size() - 1]["entering"].size(), 2u);
}

TEST(Export, SymbolicGraphJson) {
  TraceGraph g;
  for (const Trace& t : sample()) g.merge(t);
  SymbolicGraph sg = generate(g, assign_cases(g));
  nlohmann::json j = to_json(sg);
  EXPECT_EQ(j["single_pass"], true);
  ASSERT_EQ(j["segments"].size(), sg.segments.size());
  const nlohmann::json& tail = j["segments"][2];
  EXPECT_EQ(tail["ops"][0]["inputs"][0]["kind"], "select");
  EXPECT_EQ(tail["selects"][0]["candidates"].size(), 2u);
  EXPECT_TRUE(tail["next"][0]["segment"].is_null());
  EXPECT_EQ(j["segments"][0]["feeds"][0]["feed"], "0000000000000000");
  EXPECT_EQ(j["slots"].size(), sg.slots.size());
}

TEST(Export, DotDrawsBlocksAsClusters) {
  TraceGraph g;
  for (const Trace& t : sample()) g.merge(t);
  CaseAssignment c = assign_cases(g);
  std::string dot = to_dot(g, c);
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  for (size_t b = 0; b < c.cases.size(); ++b)
    EXPECT_NE(dot.find("subgraph cluster_" + std::to_string(b) + " "), std::string::npos);
  EXPECT_NE(dot.find("net \\\"v2\\\".py:8"), std::string::npos);  // quotes escaped
  EXPECT_NE(dot.find("style=dashed"), std::string::npos);
  EXPECT_EQ(dot.back(), '\n');
}

}  // namespace
}  // namespace terra::test
