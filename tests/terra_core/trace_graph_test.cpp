#include "terra/trace_graph.h"

#include <map>
#include <stdexcept>
#include <utility>
#include <unordered_map>

#include "trace_builder.h"

namespace terra::test {
namespace {

using V = ValueRef;

Trace chain(std::vector<uint32_t> lines, TraceEnd end = TraceEnd::Normal) {
  TraceBuilder b;
  V prev = V::feed(0);
  for (uint32_t line : lines) prev = b.out(b.op("op", site(line), {prev}));
  return b.finish(end);
}

TEST(TraceGraph, StartsWithEntryAndExit) {
  TraceGraph g;
  EXPECT_EQ(g.size(), 2u);
  EXPECT_EQ(g.node(kEntryNode).key, LocationKey::entry());
  EXPECT_EQ(g.find(LocationKey::exit()), kExitNode);
  EXPECT_EQ(g.trace_count(), 0u);
}

TEST(TraceGraph, LinearTraceGivesAChainWithCounts) {
  TraceGraph g;
  MergeResult r = g.merge(chain({1, 2, 3}));
  EXPECT_EQ(r.new_nodes, 3u);
  EXPECT_EQ(r.new_control_edges, 4u);  // entry->1->2->3->exit
  EXPECT_EQ(r.new_producers, 3u);
  EXPECT_TRUE(r.new_path);
  EXPECT_EQ(r.first, MergeResult::Novelty::Node);
  EXPECT_EQ(r.first_position, 0u);
  EXPECT_EQ(g.size(), 5u);
  EXPECT_EQ(g.edges().size(), 4u);
  ASSERT_EQ(g.data_edges().size(), 2u);
  EXPECT_EQ(g.data_edges()[0].from, 2u);
  EXPECT_EQ(g.data_edges()[0].to, 3u);
  for (NodeId id = 2; id < 5; ++id) EXPECT_EQ(g.node(id).count, 1u);
}

TEST(TraceGraph, MergingTheSameTraceAgainAddsNothing) {
  TraceGraph g;
  Trace t = chain({1, 2, 3});
  g.merge(t);
  MergeResult r = g.merge(t);
  EXPECT_FALSE(r.added_anything());
  EXPECT_FALSE(r.new_path);
  EXPECT_EQ(r.first, MergeResult::Novelty::None);
  EXPECT_EQ(g.trace_count(), 2u);
  for (const ControlEdge& e : g.edges()) EXPECT_EQ(e.count, 2u);
  for (const DataEdge& e : g.data_edges()) EXPECT_EQ(e.count, 2u);
}

TEST(TraceGraph, NodeIdsAreStableAndAppendOnly) {
  TraceGraph g;
  Trace a = chain({1, 2}), b = chain({3, 1, 2});
  g.merge(a);
  NodeId one = g.find(a.ops[0].key), two = g.find(a.ops[1].key);
  g.merge(b);
  EXPECT_EQ(g.find(a.ops[0].key), one);
  EXPECT_EQ(g.find(a.ops[1].key), two);
  EXPECT_EQ(g.find(b.ops[0].key), 4u);
}

TEST(TraceGraph, DivergenceReportsTheFirstNewThing) {
  TraceGraph g;
  g.merge(chain({1, 2, 3}));
  MergeResult branch = g.merge(chain({1, 3}));  // known nodes, new edge 1->3
  EXPECT_EQ(branch.new_nodes, 0u);
  EXPECT_EQ(branch.new_control_edges, 1u);
  EXPECT_EQ(branch.first, MergeResult::Novelty::ControlEdge);
  EXPECT_EQ(branch.first_position, 1u);
  EXPECT_EQ(branch.new_producers, 1u);  // 3 now also reads 1's output
  MergeResult fresh = g.merge(chain({1, 2, 4}));
  EXPECT_EQ(fresh.first, MergeResult::Novelty::Node);
  EXPECT_EQ(fresh.first_position, 2u);
  MergeResult early = g.merge(chain({1, 2}));  // ends earlier: only the edge into exit is new
  EXPECT_EQ(early.first, MergeResult::Novelty::ControlEdge);
  EXPECT_EQ(early.first_position, 2u);
}

TEST(TraceGraph, SuccessorsAndFindSuccessor) {
  TraceGraph g;
  Trace a = chain({1, 2}), b = chain({1, 3});
  g.merge(a);
  g.merge(b);
  NodeId one = g.find(a.ops[0].key);
  ASSERT_EQ(g.successors(one).size(), 2u);
  const Successor* s = g.find_successor(one, b.ops[1].key);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->node, g.find(b.ops[1].key));
  EXPECT_EQ(g.edge(s->edge).from, one);
  EXPECT_EQ(g.find_successor(one, LocationKey{5, 5, 5}), nullptr);
  EXPECT_EQ(g.find_successor(kEntryNode, a.ops[0].key)->node, one);
}

TEST(TraceGraph, LargeFanOutStillFindsSuccessors) {
  TraceGraph g;
  std::vector<Trace> traces;
  for (uint32_t i = 0; i < 40; ++i) traces.push_back(chain({1, 100 + i}));
  for (const Trace& t : traces) g.merge(t);
  NodeId one = g.find(traces[0].ops[0].key);
  EXPECT_EQ(g.successors(one).size(), 40u);
  for (const Trace& t : traces) {
    const Successor* s = g.find_successor(one, t.ops[1].key);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->node, g.find(t.ops[1].key));
    EXPECT_FALSE(g.merge(t).added_anything());
  }
  EXPECT_EQ(g.find_successor(one, LocationKey{5, 5, 5}), nullptr);
}

TEST(TraceGraph, ProducersPerInputAreASetWithCounts) {
  TraceGraph g;
  for (uint64_t ext : {7u, 8u, 7u}) {
    TraceBuilder b;
    b.op("mul", site(1), {V::external(ext), V::constant(3)});
    g.merge(b.finish());
  }
  const Node& mul = g.node(2);
  ASSERT_EQ(mul.inputs.size(), 2u);
  ASSERT_EQ(mul.inputs[0].size(), 2u);
  EXPECT_EQ(mul.inputs[0][0].id, 7u);
  EXPECT_EQ(mul.inputs[0][0].count, 2u);
  EXPECT_EQ(mul.inputs[0][1].count, 1u);
  EXPECT_EQ(mul.inputs[1].size(), 1u);
  EXPECT_TRUE(g.data_edges().empty());
}

TEST(TraceGraph, NewShapeIsAMetaVariant) {
  TraceGraph g;
  auto one = [](int64_t batch) {
    TraceBuilder b;
    b.op("linear", site(1), {V::feed(0)}, false, {meta({batch, 10})});
    return b.finish();
  };
  g.merge(one(32));
  MergeResult r = g.merge(one(7));  // the last batch of an epoch
  EXPECT_EQ(r.new_shapes, 1u);
  EXPECT_EQ(r.first, MergeResult::Novelty::Shape);
  EXPECT_TRUE(r.added_anything());
  EXPECT_FALSE(g.merge(one(32)).added_anything());
  ASSERT_EQ(g.node(2).metas.size(), 2u);
  EXPECT_EQ(g.node(2).metas[0].outputs[0].sizes, (std::vector<int64_t>{32, 10}));
  EXPECT_EQ(g.node(2).metas[0].count, 2u);
}

TEST(TraceGraph, EndsAndPathsAreCounted) {
  TraceGraph g;
  g.merge(chain({1, 2}));
  g.merge(chain({1}, TraceEnd::Exception));
  g.merge(chain({1, 2}));
  g.merge(Trace{});  // an iteration without DL ops
  EXPECT_EQ(g.trace_count(), 4u);
  EXPECT_EQ(g.end_count(TraceEnd::Normal), 3u);
  EXPECT_EQ(g.end_count(TraceEnd::Exception), 1u);
  EXPECT_EQ(g.path_count(), 3u);
  EXPECT_NE(g.find_successor(kEntryNode, LocationKey::exit()), nullptr);
}

TEST(TraceGraph, SourceAndFetchAreKept) {
  TraceGraph g;
  auto source = std::make_shared<const SourceInfo>(SourceInfo{"aten::sum", {{"t.py", 4, "f"}}});
  Trace t;
  t.ops.push_back({LocationKey{5, 6, 0}, {}, {meta({})}, source, true});
  g.merge(t);
  t.ops[0].source = nullptr;
  t.ops[0].is_fetch = false;
  g.merge(t);
  EXPECT_EQ(g.node(2).source, source);
  EXPECT_EQ(g.node(2).fetch_count, 1u);
  EXPECT_EQ(g.node(2).count, 2u);
}

void expect_rejected_and_unchanged(TraceGraph& g, const Trace& bad, const std::string& why) {
  size_t nodes = g.size(), edges = g.edges().size();
  uint64_t traces = g.trace_count();
  EXPECT_THROW(g.merge(bad), std::invalid_argument) << why;
  EXPECT_EQ(g.size(), nodes) << why;
  EXPECT_EQ(g.edges().size(), edges) << why;
  EXPECT_EQ(g.trace_count(), traces) << why;
  EXPECT_FALSE(check_trace(bad).empty()) << why;
}

// The runtime's way: node by node as the program runs. Two paths that share a head and a tail,
// one of them taken twice, give the nodes, edges, counts, outputs and paths that merging them gives.
// An edge taken before is taken again by its id (retake), as the runtime takes its predicted one.
TEST(TraceGraph, BuildingOpByOpGivesWhatMergingTheTracesGives) {
  TraceGraph merged, walked;
  const std::vector<std::vector<uint32_t>> runs = {{1, 2, 3}, {1, 4, 3}, {1, 2, 3}};
  std::unordered_map<uint32_t, NodeId> made;  // line -> walked node
  std::map<std::pair<NodeId, NodeId>, EdgeId> taken;  // (from, to) -> the id take stored
  for (size_t run = 0; run < runs.size(); ++run) {
    const std::vector<uint32_t>& lines = runs[run];
    Trace t = chain(lines);
    merged.merge(t);
    std::vector<NodeId> path;
    NodeId prev = kEntryNode;
    for (size_t j = 0; j < lines.size(); ++j) {
      auto [it, fresh] = made.try_emplace(lines[j], kNone);
      if (fresh) it->second = walked.add(t.ops[j].key, t.ops[j].source, t.ops[j].outputs);
      if (auto edge = taken.find({prev, it->second}); edge != taken.end()) {
        walked.retake(edge->second);
      } else {
        EdgeId id = kNone;
        EXPECT_TRUE(walked.take(prev, it->second, &id));
        EXPECT_EQ(id, walked.find_edge(prev, it->second));
        taken.emplace(std::make_pair(prev, it->second), id);
      }
      path.push_back(prev = it->second);
    }
    EXPECT_EQ(walked.end_path(path), run < 2) << run;  // the third run repeats the first path
  }
  ASSERT_EQ(walked.size(), merged.size());
  for (NodeId id = 0; id < merged.size(); ++id) {
    EXPECT_EQ(walked.node(id).key, merged.node(id).key) << id;
    EXPECT_EQ(walked.node(id).count, merged.node(id).count) << id;
    EXPECT_EQ(walked.node(id).metas.size(), merged.node(id).metas.size()) << id;
    if (!merged.node(id).metas.empty()) {
      EXPECT_EQ(walked.node(id).metas[0].hash, merged.node(id).metas[0].hash) << id;
    }
  }
  ASSERT_EQ(walked.edges().size(), merged.edges().size());
  for (EdgeId e = 0; e < merged.edges().size(); ++e) {
    EXPECT_EQ(walked.edge(e).from, merged.edge(e).from);
    EXPECT_EQ(walked.edge(e).to, merged.edge(e).to);
    EXPECT_EQ(walked.edge(e).count, merged.edge(e).count);
  }
  EXPECT_EQ(walked.trace_count(), 3u);
  EXPECT_EQ(walked.path_count(), 2u);
  EXPECT_EQ(walked.end_count(TraceEnd::Normal), 3u);
  EXPECT_EQ(walked.find_edge(made[1], made[4]), merged.find_edge(made[1], made[4]));
  EXPECT_EQ(walked.find_edge(made[4], made[2]), kNone);
}

TEST(TraceGraph, AddTakesOnlyNewKeysAndVariantsAreOtherKeys) {
  TraceGraph g;
  const LocationKey key{op_identity("op"), site(1), 0};
  const NodeId a = g.add(key, nullptr);
  EXPECT_THROW(g.add(key, nullptr), std::invalid_argument);
  EXPECT_THROW(g.add(LocationKey::exit(), nullptr), std::invalid_argument);
  LocationKey other = key;
  other.variant = 1;
  const NodeId b = g.add(other, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(g.find(key), a);
  EXPECT_EQ(g.find(other), b);
  EXPECT_EQ(to_string(other), to_string(key) + "/v1");
  EXPECT_EQ(g.size(), 4u);
}

TEST(TraceGraph, MalformedTracesAreRejectedAtomically) {
  TraceGraph g;
  Trace good = chain({1, 2, 3});
  g.merge(good);

  Trace forward = chain({1, 5, 6});
  forward.ops[1].inputs[0] = V::op(2);
  expect_rejected_and_unchanged(g, forward, "input refers to a later op");

  Trace bad_output = chain({1, 7});
  bad_output.ops[1].inputs[0] = V::op(0, 3);
  expect_rejected_and_unchanged(g, bad_output, "input refers to a missing output");

  Trace repeated_known = good;
  repeated_known.ops.push_back(good.ops[0]);
  repeated_known.ops.back().inputs = {};
  expect_rejected_and_unchanged(g, repeated_known, "known key twice");

  Trace repeated_new = chain({8, 9});
  repeated_new.ops.push_back(repeated_new.ops[0]);
  expect_rejected_and_unchanged(g, repeated_new, "new key twice");
  EXPECT_EQ(g.find(repeated_new.ops[0].key), kNone);  // the claimed id was given back

  Trace reserved = chain({10});
  reserved.ops[0].key = LocationKey::exit();
  expect_rejected_and_unchanged(g, reserved, "reserved key");

  Trace arity = good;
  arity.ops[2].inputs.push_back(V::feed(1));
  EXPECT_THROW(g.merge(arity), std::invalid_argument);
  EXPECT_EQ(g.trace_count(), 1u);

  EXPECT_FALSE(g.merge(good).added_anything());  // and the graph still works
  EXPECT_TRUE(check_trace(good).empty());
}

}  // namespace
}  // namespace terra::test
