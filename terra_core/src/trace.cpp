#include "terra/trace.h"

#include <unordered_set>

namespace terra {

uint64_t meta_hash(const std::vector<TensorMeta>& outputs) {
  uint64_t h = outputs.size();
  for (const TensorMeta& m : outputs) {
    h = hash_combine(h, m.sizes.size());
    for (int64_t s : m.sizes) h = hash_combine(h, static_cast<uint64_t>(s));
    for (int64_t s : m.strides) h = hash_combine(h, static_cast<uint64_t>(s));
    h = hash_combine(h, static_cast<uint64_t>(m.storage_offset));
    uint64_t scalars = static_cast<uint8_t>(m.dtype) | static_cast<uint64_t>(static_cast<uint8_t>(m.device_type)) << 8 |
                       static_cast<uint64_t>(static_cast<uint8_t>(m.device_index)) << 16 |
                       static_cast<uint64_t>(m.requires_grad) << 24;
    h = hash_combine(h, scalars);
  }
  return h;
}

const char* to_string(ValueRef::Kind kind) {
  switch (kind) {
    case ValueRef::Kind::Op: return "op";
    case ValueRef::Kind::External: return "external";
    case ValueRef::Kind::Feed: return "feed";
    case ValueRef::Kind::Constant: return "constant";
  }
  return "?";
}

const char* to_string(TraceEnd end) {
  switch (end) {
    case TraceEnd::Normal: return "normal";
    case TraceEnd::Exception: return "exception";
    case TraceEnd::Break: return "break";
  }
  return "?";
}

std::string check_inputs(const Trace& trace, size_t j) {
  const OpRecord& op = trace.ops[j];
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const ValueRef& in = op.inputs[i];
    if (in.kind != ValueRef::Kind::Op) continue;
    if (in.id >= j)
      return "op " + std::to_string(j) + " input " + std::to_string(i) + " refers to position " +
             std::to_string(in.id) + ", which is not earlier";
    if (in.output >= trace.ops[in.id].outputs.size())
      return "op " + std::to_string(j) + " input " + std::to_string(i) + " refers to output " +
             std::to_string(in.output) + " of an op with fewer outputs";
  }
  return {};
}

std::string check_trace(const Trace& trace) {
  std::unordered_set<LocationKey, LocationKeyHash> seen;
  for (size_t j = 0; j < trace.ops.size(); ++j) {
    const OpRecord& op = trace.ops[j];
    if (op.key.op == kReservedOp) return "op " + std::to_string(j) + " uses the reserved op identity";
    if (!seen.insert(op.key).second)
      return "op " + std::to_string(j) + " repeats key " + to_string(op.key) + " within one trace";
    if (std::string error = check_inputs(trace, j); !error.empty()) return error;
  }
  return {};
}

}  // namespace terra
