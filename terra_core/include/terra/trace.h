// Trace: the DL ops of one iteration, in the order the PythonRunner met them.
//
// Each `OpRecord` says which op ran (its LocationKey), where each input came from (`ValueRef`:
// an output of an earlier op of this same trace, an external tensor such as a parameter or an
// optimizer state referenced by identity, a value fed from Python, or a constant) and what its
// outputs look like (`TensorMeta`). Provenance is positional, so a trace is self-contained: merging
// it never needs the tensors themselves. A trace also says how the iteration ended, because an
// exception or a `break` cuts it short and the TraceGraph must know that this is a place where an
// iteration may stop.
//
// Requirements on a well-formed trace (checked by `check_trace`, enforced by TraceGraph::merge):
// an op input of kind Op refers to an earlier position, and no key repeats within one trace
// (OccurrenceCounter guarantees the latter).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "terra/location_key.h"

namespace terra {

// A tensor's metadata as traced: what the runtime validates later calls against and makes
// placeholders from (runtime/placeholder.h reads and writes it from ATen tensors).
struct TensorMeta {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  int8_t dtype = 6;         // the caller's dtype code (c10::ScalarType's value; 6: Float)
  int8_t device_type = 0;   // the caller's device type code (c10::DeviceType's value; 0: CPU)
  int8_t device_index = -1;
  bool requires_grad = false;

  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.dtype == b.dtype && a.device_type == b.device_type &&
           a.device_index == b.device_index && a.requires_grad == b.requires_grad &&
           a.storage_offset == b.storage_offset && a.sizes == b.sizes && a.strides == b.strides;
  }
  friend bool operator!=(const TensorMeta& a, const TensorMeta& b) { return !(a == b); }
};

// Hash of all outputs' metadata of one op: equal metas give equal hashes.
uint64_t meta_hash(const std::vector<TensorMeta>& outputs);

// Provenance of one op input.
struct ValueRef {
  enum class Kind : uint8_t {
    Op,        // output `output` of the op at position `id` of the same trace
    External,  // a tensor that outlives the iteration (parameter, buffer, optimizer state); `id` is its identity
    Feed,      // a value Python hands in at run time; `id` is the caller's feed index
    Constant,  // a value baked into the graph; `id` is the caller's constant identity (e.g. a value hash)
  };
  Kind kind = Kind::Constant;
  uint32_t output = 0;
  uint64_t id = 0;

  static ValueRef op(uint64_t position, uint32_t output = 0) { return {Kind::Op, output, position}; }
  static ValueRef external(uint64_t identity) { return {Kind::External, 0, identity}; }
  static ValueRef feed(uint64_t index) { return {Kind::Feed, 0, index}; }
  static ValueRef constant(uint64_t identity) { return {Kind::Constant, 0, identity}; }

  friend bool operator==(const ValueRef& a, const ValueRef& b) {
    return a.kind == b.kind && a.output == b.output && a.id == b.id;
  }
};

const char* to_string(ValueRef::Kind kind);

struct OpRecord {
  LocationKey key;
  std::vector<ValueRef> inputs;
  std::vector<TensorMeta> outputs;
  std::shared_ptr<const SourceInfo> source;  // optional; shared so recording costs no string copies
  bool is_fetch = false;                     // Python asked for this op's value (.item(), print, if)
};

enum class TraceEnd : uint8_t { Normal, Exception, Break };
inline constexpr int kTraceEndKinds = 3;
const char* to_string(TraceEnd end);

struct Trace {
  std::vector<OpRecord> ops;
  TraceEnd end = TraceEnd::Normal;
};

// Empty when `trace` is well-formed, else what is wrong and at which position.
std::string check_trace(const Trace& trace);
// The part of check_trace about op `j`'s inputs alone (TraceGraph::merge checks repeats its own way).
std::string check_inputs(const Trace& trace, size_t j);

}  // namespace terra
