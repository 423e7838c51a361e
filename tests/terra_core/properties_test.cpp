// Property tests: random programs (nested ifs, loops with random trip counts, breaks, calls of
// shared functions from several sites, exceptions, early ends of the iteration) are run a few times
// each to give a trace set; every set must satisfy the guarantees of the core passes.
#include <algorithm>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "terra/export.h"
#include "trace_builder.h"

namespace terra::test {
namespace {

struct Stmt {
  enum class Kind { Op, If, Loop, Call, Break, Raise, EndIteration } kind = Kind::Op;
  uint32_t site = 0;
  double p = 0;           // If: chance of the then-branch; Break/Raise/EndIteration: chance to fire
  uint32_t max_trip = 0;  // Loop
  uint32_t fn = 0;        // Call
  std::vector<Stmt> body, orelse;
};

struct Program {
  std::vector<std::vector<Stmt>> functions;  // 0 is the loop body the iterations run
};

class ProgramMaker {
 public:
  explicit ProgramMaker(std::mt19937_64& rng) : rng_(rng) {}

  Program make() {
    Program p;
    const uint32_t n = 1 + rng_() % 3;
    p.functions.resize(n);
    for (uint32_t f = n; f-- > 0;) p.functions[f] = block(f, n, 0, false);
    return p;
  }

 private:
  std::vector<Stmt> block(uint32_t fn, uint32_t nfn, int depth, bool in_loop) {
    std::vector<Stmt> out;
    const int len = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < len; ++i) {
      Stmt s;
      s.site = next_site_++;
      const int roll = depth >= 3 ? 0 : static_cast<int>(rng_() % 100);
      if (roll < 50) {
        s.kind = Stmt::Kind::Op;
      } else if (roll < 65) {
        s.kind = Stmt::Kind::If;
        s.p = chance();
        s.body = block(fn, nfn, depth + 1, in_loop);
        if (rng_() % 2) s.orelse = block(fn, nfn, depth + 1, in_loop);
      } else if (roll < 80) {
        s.kind = Stmt::Kind::Loop;
        s.max_trip = 1 + rng_() % 4;
        s.body = block(fn, nfn, depth + 1, true);
      } else if (roll < 88 && fn + 1 < nfn) {
        s.kind = Stmt::Kind::Call;
        s.fn = fn + 1 + static_cast<uint32_t>(rng_() % (nfn - fn - 1));
      } else if (roll < 94 && in_loop) {
        s.kind = Stmt::Kind::Break;
        s.p = chance() / 2;
      } else if (roll < 97) {
        s.kind = Stmt::Kind::Raise;
        s.p = chance() / 8;
      } else {
        s.kind = Stmt::Kind::EndIteration;
        s.p = chance() / 8;
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  double chance() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  std::mt19937_64& rng_;
  uint32_t next_site_ = 1;
};

// Runs one iteration of a program as the PythonRunner would record it.
class Runner {
 public:
  Runner(const Program& p, std::mt19937_64& rng) : prog_(p), rng_(rng) {}

  Trace iteration() {
    trace_ = Trace{};
    counter_.reset();
    frames_.clear();
    Flow f = exec(prog_.functions[0], 0);
    trace_.end = f == Flow::Raise ? TraceEnd::Exception : f == Flow::Stop ? TraceEnd::Break : TraceEnd::Normal;
    return std::move(trace_);
  }

 private:
  enum class Flow { Normal, Break, Raise, Stop };
  static constexpr size_t kMaxOps = 300;

  bool roll(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  ValueRef input() {
    const size_t n = trace_.ops.size();
    const uint32_t r = rng_() % 100;
    auto output_of = [&](size_t pos) {
      return ValueRef::op(pos, static_cast<uint32_t>(rng_() % trace_.ops[pos].outputs.size()));
    };
    if (n && r < 60) return output_of(n - 1);
    if (n && r < 75) return output_of(rng_() % n);
    if (r < 87) return ValueRef::external(100 + rng_() % 4);
    if (r < 96) return ValueRef::feed(rng_() % 3);
    return ValueRef::constant(rng_() % 2);
  }

  void op(uint32_t fn, uint32_t site) {
    std::vector<FrameId> frames = frames_;
    frames.push_back({fn, site});
    OpRecord r;
    r.key = counter_.key(op_identity("op", std::to_string(site % 7)), stack_hash(frames));
    for (uint32_t i = 0; i < 1 + site % 3; ++i) r.inputs.push_back(input());
    const int64_t batch = roll(0.03) ? 3 : 8;  // now and then a short last batch
    for (uint32_t k = 0; k < 1 + site % 2; ++k) r.outputs.push_back(meta({batch, 4}));
    r.is_fetch = roll(0.1);
    trace_.ops.push_back(std::move(r));
  }

  Flow exec(const std::vector<Stmt>& body, uint32_t fn) {
    for (const Stmt& s : body) {
      if (trace_.ops.size() >= kMaxOps) return Flow::Stop;
      Flow f = Flow::Normal;
      switch (s.kind) {
        case Stmt::Kind::Op: op(fn, s.site); break;
        case Stmt::Kind::If: f = exec(roll(s.p) ? s.body : s.orelse, fn); break;
        case Stmt::Kind::Loop: {
          const uint32_t trips = rng_() % (s.max_trip + 1);
          for (uint32_t i = 0; i < trips; ++i) {
            f = exec(s.body, fn);
            if (f != Flow::Normal) break;
          }
          if (f == Flow::Break) f = Flow::Normal;
          break;
        }
        case Stmt::Kind::Call:
          frames_.push_back({fn, s.site});
          f = exec(prog_.functions[s.fn], s.fn);
          frames_.pop_back();
          break;
        case Stmt::Kind::Break: f = roll(s.p) ? Flow::Break : Flow::Normal; break;
        case Stmt::Kind::Raise: f = roll(s.p) ? Flow::Raise : Flow::Normal; break;
        case Stmt::Kind::EndIteration: f = roll(s.p) ? Flow::Stop : Flow::Normal; break;
      }
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  const Program& prog_;
  std::mt19937_64& rng_;
  OccurrenceCounter counter_;
  std::vector<FrameId> frames_;
  Trace trace_;
};

// The graph with node ids replaced by keys, in a fixed order: equal iff equal up to numbering.
std::vector<std::string> canonical(const TraceGraph& g) {
  std::vector<std::string> out;
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    std::string s = to_string(n.key) + " count=" + std::to_string(n.count) + " fetch=" + std::to_string(n.fetch_count);
    std::vector<std::string> parts;
    for (const Successor& succ : n.successors)
      parts.push_back(to_string(succ.key) + "x" + std::to_string(g.edge(succ.edge).count));
    std::sort(parts.begin(), parts.end());
    for (const std::string& p : parts) s += " ->" + p;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      parts.clear();
      for (const Producer& p : n.inputs[i]) {
        std::string src = p.kind == ValueRef::Kind::Op ? to_string(g.node(static_cast<NodeId>(p.id)).key) : std::to_string(p.id);
        parts.push_back(std::string(to_string(p.kind)) + ":" + src + ":" + std::to_string(p.output) + "x" + std::to_string(p.count));
      }
      std::sort(parts.begin(), parts.end());
      s += " in" + std::to_string(i);
      for (const std::string& p : parts) s += " " + p;
    }
    parts.clear();
    for (const MetaVariant& v : n.metas) parts.push_back(std::to_string(v.hash) + "x" + std::to_string(v.count));
    std::sort(parts.begin(), parts.end());
    for (const std::string& p : parts) s += " meta " + p;
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<LocationKey>> canonical_blocks(const TraceGraph& g, const CaseAssignment& c) {
  std::vector<std::vector<LocationKey>> out;
  for (const SwitchCase& sc : c.cases) {
    out.emplace_back();
    for (NodeId id : sc.block.nodes) out.back().push_back(g.node(id).key);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void expect_json_counts(const TraceGraph& g) {
  nlohmann::json j = nlohmann::json::parse(to_json(g).dump());
  ASSERT_EQ(j["nodes"].size(), g.size());
  std::map<std::string, uint64_t> counts;
  for (const auto& n : j["nodes"]) counts[n["key"].get<std::string>()] = n["count"].get<uint64_t>();
  for (const Node& n : g.nodes()) EXPECT_EQ(counts[to_string(n.key)], n.count);
  ASSERT_EQ(j["control_edges"].size(), g.edges().size());
  for (const auto& e : j["control_edges"]) {
    const ControlEdge& edge = g.edge(e["id"].get<EdgeId>());
    EXPECT_EQ(e["from"].get<NodeId>(), edge.from);
    EXPECT_EQ(e["to"].get<NodeId>(), edge.to);
    EXPECT_EQ(e["count"].get<uint64_t>(), edge.count);
  }
  std::vector<DataEdge> data = g.data_edges();
  ASSERT_EQ(j["data_edges"].size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(j["data_edges"][i]["count"].get<uint64_t>(), data[i].count);
  EXPECT_EQ(j["traces"].get<uint64_t>(), g.trace_count());
}

TEST(Properties, RandomTraceSets) {
  constexpr int kSets = 3000;
  std::mt19937_64 rng(20210123);
  int multi_pass_sets = 0, branching_sets = 0, exceptions = 0;
  size_t total_ops = 0;
  for (int set = 0; set < kSets; ++set) {
    SCOPED_TRACE("set " + std::to_string(set));
    Program prog = ProgramMaker(rng).make();
    Runner runner(prog, rng);
    std::vector<Trace> traces(2 + rng() % 10);
    size_t ops = 0;
    for (Trace& t : traces) {
      t = runner.iteration();
      ops += t.ops.size();
      exceptions += t.end == TraceEnd::Exception;
      ASSERT_EQ(check_trace(t), "");
    }
    total_ops += ops;

    TraceGraph g;
    for (const Trace& t : traces) g.merge(t);
    EXPECT_EQ(g.trace_count(), traces.size());
    uint64_t counted = 0;
    for (NodeId id = 2; id < g.size(); ++id) counted += g.node(id).count;
    EXPECT_EQ(counted, ops);

    // Blocks do not overlap and cover every node.
    CaseAssignment cases = assign_cases(g);
    std::vector<int> covered(g.size(), 0);
    for (const SwitchCase& c : cases.cases)
      for (NodeId id : c.block.nodes) covered[id]++;
    for (NodeId id = 2; id < g.size(); ++id) ASSERT_EQ(covered[id], 1) << "node " << id;
    multi_pass_sets += !cases.single_pass();
    branching_sets += cases.cases.size() > 1;

    // Every trace replays through the switch-cases: exactly its ops, in order, reading its values.
    SymbolicGraph sg = generate(g, cases);
    for (const Trace& t : traces) {
      ReplayResult r = replay(sg, t);
      ASSERT_TRUE(r.ok) << r.error;
      ASSERT_EQ(r.ops, keys_of(t));
      if (cases.single_pass()) {
        EXPECT_LE(r.passes, 1u);
      }
    }

    // Merge order does not matter, up to node numbering.
    std::vector<Trace> shuffled = traces;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    TraceGraph h;
    for (const Trace& t : shuffled) h.merge(t);
    ASSERT_EQ(canonical(g), canonical(h));
    EXPECT_EQ(canonical_blocks(g, cases), canonical_blocks(h, assign_cases(h)));
    EXPECT_EQ(g.path_count(), h.path_count());

    if (set % 10 == 0) expect_json_counts(g);

    // A trace already merged adds nothing.
    for (const Trace& t : traces) {
      MergeResult r = g.merge(t);
      EXPECT_FALSE(r.added_anything());
      EXPECT_FALSE(r.new_path);
    }
  }
  // The generator must exercise what the properties are about.
  EXPECT_GT(multi_pass_sets, kSets / 100);
  EXPECT_GT(branching_sets, kSets / 2);
  EXPECT_GT(exceptions, 10);
  EXPECT_GT(total_ops, size_t{50000});
  std::printf("[ properties ] %d sets, %zu ops, %d branching, %d multi-pass, %d exceptions\n", kSets, total_ops,
              branching_sets, multi_pass_sets, exceptions);
}

}  // namespace
}  // namespace terra::test
