// replay(): the reference walk of a trace through a SymbolicGraph, used by the property tests and
// by anyone who wants to check that a generated graph covers a trace before trusting it.
#include "terra/graph_gen.h"

namespace terra {
namespace {

constexpr uint64_t kUnwritten = ~uint64_t{0};

struct Walk {
  const SymbolicGraph& g;
  const Trace& t;
  std::vector<uint64_t> slot_position;  // trace position of the op that last wrote each slot
  uint64_t base = 0;                    // trace position of the current segment's first op

  bool reads(const Segment& seg, const SegmentInput& in, const ValueRef& ref) const {
    switch (in.kind) {
      case SegmentInput::Kind::Local:
        return ref.kind == ValueRef::Kind::Op && ref.id == base + in.id && ref.output == in.output;
      case SegmentInput::Kind::Slot:
        return ref.kind == ValueRef::Kind::Op && slot_position[in.id] != kUnwritten &&
               ref.id == slot_position[in.id] && ref.output == g.slots[in.id].output;
      case SegmentInput::Kind::External: return ref.kind == ValueRef::Kind::External && ref.id == in.id;
      case SegmentInput::Kind::Feed: return ref.kind == ValueRef::Kind::Feed && ref.id == in.id;
      case SegmentInput::Kind::Constant: return ref.kind == ValueRef::Kind::Constant && ref.id == in.id;
      case SegmentInput::Kind::Select:
        for (const SegmentInput& c : seg.selects[in.id].candidates)
          if (reads(seg, c, ref)) return true;
        return false;
    }
    return false;
  }
};

bool fetches(const Segment& seg, uint32_t op) {
  for (const FetchPoint& f : seg.fetches)
    if (f.op == op) return true;
  return false;
}

}  // namespace

ReplayResult replay(const SymbolicGraph& g, const Trace& t) {
  ReplayResult r;
  auto fail = [&](size_t pos, const std::string& what) {
    r.error = "at trace position " + std::to_string(pos) + ": " + what;
    return r;
  };
  Walk walk{g, t, std::vector<uint64_t>(g.slots.size(), kUnwritten)};
  const size_t n = t.ops.size();
  size_t pos = 0;
  const std::vector<PathTarget>* targets = &g.entry;
  uint32_t current = kNone;
  for (;;) {
    const LocationKey next = pos < n ? t.ops[pos].key : LocationKey::exit();
    const PathTarget* target = decide(*targets, next);
    if (!target) return fail(pos, "no path to " + to_string(next));
    if (target->segment == kNone) {
      if (pos != n) return fail(pos, "the graph ends the iteration before the trace does");
      break;
    }
    if (current == kNone || target->segment <= current) r.passes++;
    current = target->segment;
    r.segments.push_back(current);
    const Segment& seg = g.segments[current];
    walk.base = pos;
    for (uint32_t k = 0; k < seg.ops.size(); ++k, ++pos) {
      if (pos >= n) return fail(pos, "the trace ends inside segment " + std::to_string(current));
      const OpRecord& rec = t.ops[pos];
      const SegmentOp& op = seg.ops[k];
      if (rec.key != op.key) return fail(pos, "segment expects " + to_string(op.key) + ", trace has " + to_string(rec.key));
      if (rec.inputs.size() != op.inputs.size()) return fail(pos, "input count differs");
      for (size_t i = 0; i < op.inputs.size(); ++i)
        if (!walk.reads(seg, op.inputs[i], rec.inputs[i]))
          return fail(pos, "input " + std::to_string(i) + " would read " + to_string(op.inputs[i].kind) +
                               " " + std::to_string(op.inputs[i].id) + ", not what the trace recorded");
      if (rec.is_fetch && !fetches(seg, k)) return fail(pos, "fetched op without a fetch point");
      r.ops.push_back(rec.key);
    }
    for (const SlotWrite& w : seg.writes) walk.slot_position[w.slot] = walk.base + w.op;
    targets = &seg.next;
  }
  r.ok = true;
  return r;
}

}  // namespace terra
