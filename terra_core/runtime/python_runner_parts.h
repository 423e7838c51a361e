// What the PythonRunner's stage files share (python_runner.cpp and python_runner_*.cpp): the
// dispatch key, how far the program thread may run ahead, the OpenMP team's move rate, and small
// helpers on ops and tensors. Private to the runtime.
#pragma once

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <string>

#include "op_template.h"
#include "placeholder.h"
#include "python_runner.h"

namespace terra::runtime::runner_parts {

// The dispatch key Terra's fallback is registered on. It sits above autograd, autocast and the
// Python modes, so the fallback sees each call exactly as the program issued it (before
// composite ops decompose), and it is only ever active through thread-local inclusion.
inline constexpr c10::DispatchKey kTerraKey = PythonRunner::kHookKey;

inline constexpr uint32_t kNoNode = UINT32_MAX;

// Iteration boundaries that no loop mark makes: the session's entry, and the cut after each
// backward of a training loop no AST pass marked (a library's: PythonRunner::after_backward).
// Loop ids are even and their exits odd (terra/_loops.py); this one is even and no loop's.
inline constexpr uint64_t kEntryBoundary = 1;
inline constexpr uint64_t kBackwardBoundary = 0x7E77'BAC4'0000'0002ULL;


// How far (in issued ops) the program thread may run ahead of the GraphRunner before it sleeps,
// and how far the GraphRunner must catch up before it wakes. Far enough for a whole forward and
// backward: a replayed block runs the items that went through autograd when it was recorded (the
// forward) only once the backward that consumes them is issued (block_replay.h); a program thread
// held 64 ops ahead made the GraphRunner wait for it, or run the forward through autograd, at the
// start of every iteration, so the two threads took turns instead of overlapping (forced
// co-execution, 3 interleaved rounds of fresh processes, ms per step at 64 -> 1024 ops: resnet
// 15.6 -> 12.7, dcgan 16.4 -> 11.8, gpt 20.9 -> 13.4; eager 11.2, 11.1, 9.6). Not much more: each
// pending item keeps its outputs' Python objects alive (torch keeps a tensor's object while C++
// holds the tensor), which wakes Python's cyclic collector (at 2048-4000 ops, a 256x256 add chain
// ran one full collection of 90 ms on the program thread within its first 10,000 ops).
inline constexpr uint64_t kAheadHigh = 1024, kAheadLow = 512;
// And at most this many bytes of outputs ahead: a value the program dropped after the last item
// reading it was issued (an iteration's result, replaced by the next one's) lives until the
// program thread, awake again, drops the executed items that made it; 1024 ops of a 2048x2048
// add chain left 300 MB more resident than 64 ops did, 32 MB with a 64 MiB bound; with 64 MiB a
// chain of 4 MB values (test_values_dropped_before_their_last_reader_ran_are_freed_right_after_it)
// grew 78-184 MB over eager's, 66-114 with 32 (forced co-execution of resnet, gpt and dcgan
// within noise of each other).
inline constexpr uint64_t kAheadBytes = 32ull << 20;

// The OpenMP team moves between the threads (openmp_team.h) at most this often within a session:
// a move costs 0.2-0.5 ms (the pool's workers exit, the next region makes new ones), and a program
// that diverges every iteration would pay it twice per iteration. Held back too long, the program
// traces with two teams, every parallel region a futex hand-off: corpus p08 (convolutions, a
// random path that diverges) traced at 10-13 ms per iteration after co-executing against 3.5
// before. Whole program, 3 x 5 runs, medians: 100 ms: p08 161-173 ms, p22 47-85; 20 ms: p08
// 129-134, p22 35-43 (eager: 65-79 and 40). A session's first move into co-execution and
// leaving a session always move it.
inline constexpr int64_t kTeamMoveNs = 20'000'000;

inline void set_hook(bool on) { c10::impl::tls_set_dispatch_key_included(kTerraKey, on); }

// An ATen op's name from its handle, else the pseudo-op's own name.
inline std::string op_name(const c10::OperatorHandle* op, const char* name) {
  if (!op) return std::string(name ? name : "?");
  // c10::toString's "name.overload", without its ostringstream (0.3-0.4 us a new node paid).
  const c10::OperatorName& n = op->operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

inline void call_below(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(kTerraKey);
  op.callBoxed(stack);
}

// A real 0-d CPU tensor outside autograd: a host scalar candidate.
inline bool host_scalar(const at::Tensor& t) {
  return t.defined() && t.dim() == 0 && t.device().is_cpu() && !t.requires_grad() &&
         !as_placeholder(t) && !t.unsafeGetTensorImpl()->is_wrapped_number();
}

// Argument `i`'s alias annotation in the op's schema (written, or returned as a view); nullptr
// for none, or for a pseudo-op (no schema).
inline const c10::AliasInfo* alias_info(const OpTemplate& t, size_t i) {
  if (!t.op) return nullptr;
  const auto& args = t.op->schema().arguments();
  return i < args.size() ? args[i].alias_info() : nullptr;
}

// Releases the GIL for its scope where this thread holds it: a wait for the GraphRunner must not
// hold up its Python work (warnings, hooks).
class GilReleased {
 public:
  GilReleased() : state_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~GilReleased() {
    if (state_) PyEval_RestoreThread(state_);
  }

 private:
  PyThreadState* state_;
};

}  // namespace terra::runtime::runner_parts
