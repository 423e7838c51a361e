// Test helper: builds traces the way the runtime records them. A call site is a list of
// (code, line) frames; keys come from an OccurrenceCounter, so an op met again at the same site in
// one iteration (a loop) gets the next occurrence.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "terra/case_assignment.h"
#include "terra/graph_gen.h"
#include "terra/trace.h"
#include "terra/trace_graph.h"

namespace terra::test {

inline TensorMeta meta(std::vector<int64_t> sizes, int8_t dtype = 6) {
  TensorMeta m;
  m.strides.assign(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) m.strides[i - 1] = m.strides[i] * sizes[i];
  m.sizes = std::move(sizes);
  m.dtype = dtype;
  m.device_type = 0;
  return m;
}

inline uint64_t site(std::vector<FrameId> frames) { return stack_hash(frames); }
inline uint64_t site(uint32_t line) { return site({{1, line}}); }

class TraceBuilder {
 public:
  // Records op `name` at stack `stack`; returns its position (use out(pos) as a later input).
  uint64_t op(const std::string& name, uint64_t stack, std::vector<ValueRef> inputs = {}, bool fetch = false,
              std::vector<TensorMeta> outputs = {meta({4, 4})}) {
    OpRecord r;
    r.key = counter_.key(op_identity(name), stack);
    r.inputs = std::move(inputs);
    r.outputs = std::move(outputs);
    r.is_fetch = fetch;
    trace_.ops.push_back(std::move(r));
    return trace_.ops.size() - 1;
  }
  static ValueRef out(uint64_t position, uint32_t output = 0) { return ValueRef::op(position, output); }
  uint64_t last() const { return trace_.ops.size() - 1; }
  size_t size() const { return trace_.ops.size(); }

  Trace finish(TraceEnd end = TraceEnd::Normal) {
    trace_.end = end;
    Trace t = std::move(trace_);
    trace_ = Trace{};
    counter_.reset();
    return t;
  }

 private:
  OccurrenceCounter counter_;
  Trace trace_;
};

inline std::vector<LocationKey> keys_of(const Trace& t) {
  std::vector<LocationKey> keys;
  for (const OpRecord& op : t.ops) keys.push_back(op.key);
  return keys;
}

// Merges `traces`, generates, and checks that every trace replays exactly. Returns the pieces.
struct Pipeline {
  TraceGraph graph;
  CaseAssignment cases;
  SymbolicGraph symbolic;
};

inline void expect_replays(const SymbolicGraph& sg, const std::vector<Trace>& traces) {
  for (size_t i = 0; i < traces.size(); ++i) {
    ReplayResult r = replay(sg, traces[i]);
    EXPECT_TRUE(r.ok) << "trace " << i << ": " << r.error;
    EXPECT_EQ(r.ops, keys_of(traces[i])) << "trace " << i;
  }
}

inline Pipeline run_pipeline(const std::vector<Trace>& traces) {
  Pipeline p;
  for (const Trace& t : traces) p.graph.merge(t);
  p.cases = assign_cases(p.graph);
  p.symbolic = generate(p.graph, p.cases);
  expect_replays(p.symbolic, traces);
  return p;
}

inline NodeId node_of(const TraceGraph& g, const Trace& t, size_t position) { return g.find(t.ops[position].key); }

}  // namespace terra::test
