// Thread-local state that changes what an op computes, carried from the program thread to the
// GraphRunner.
//
// The PythonRunner intercepts ops above the dispatcher keys that read thread-local state, so the
// GraphRunner must run each op under the state the program thread had when it issued it. Each
// piece is recorded in the op's template (so a change between iterations is a new path, checked
// by validation) and in the work item (applied by the GraphRunner before it runs the op):
//   grad mode, inference mode     OpTemplate::grad_mode / inference_mode (AutoGradMode, InferenceMode)
//   autocast (CPU and CUDA)       AutocastState: enabled, dtype, weight cast cache enabled
//   intra-op thread count         WorkItem::num_threads, read at every issue (set_num_threads
//                                 between ops applies from the next op on, as in eager)
// Process-wide settings the kernels read when they run: recorded in the template and validated
// (GlobalState), and the Python functions that change them wait for the GraphRunner first
// (terra/_patches.py), so ops issued before a change run under the old setting:
//   default dtype                 torch.set_default_dtype / set_default_tensor_type
//   deterministic algorithms      torch.use_deterministic_algorithms
// The autocast weight cast cache is per thread: the GraphRunner's is cleared where the program's
// is (torch.autocast's exit at nesting 0, patched to issue a ClearAutocastCache item in order) and
// whenever the program leaves co-execution.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/ScalarType.h>

namespace terra::runtime {

struct AutocastState {
  bool cpu = false, cuda = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16, cuda_dtype = c10::ScalarType::Half;
  bool cache = true;

  static AutocastState current() {
    AutocastState s;
    s.cpu = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
    s.cuda = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
    s.cache = at::autocast::is_autocast_cache_enabled();
    return s;
  }
  // Makes this the calling thread's autocast state.
  void apply() const {
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, cpu);
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, cuda);
    at::autocast::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache);
  }
  // Whether this is the calling thread's state. Per validated op, so the common case (autocast
  // off here and now) costs one read of the thread's dispatch key set: autocast is enabled for a
  // device exactly when its key is not excluded.
  bool is_current() const {
    const auto excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
    const bool cpu_now = !excluded.has(c10::DispatchKey::AutocastCPU);
    const bool cuda_now = !excluded.has(c10::DispatchKey::AutocastCUDA);
    if (cpu_now != cpu || cuda_now != cuda) return false;
    return (!cpu && !cuda) || *this == current();
  }
  // The dtypes matter only where autocast is on.
  bool operator==(const AutocastState& o) const {
    return cpu == o.cpu && cuda == o.cuda && cache == o.cache &&
           (!cpu || cpu_dtype == o.cpu_dtype) && (!cuda || cuda_dtype == o.cuda_dtype);
  }
  bool operator!=(const AutocastState& o) const { return !(*this == o); }
};

struct GlobalState {
  c10::ScalarType default_dtype = c10::ScalarType::Float;
  bool deterministic = false;

  static GlobalState current() {
    return {c10::get_default_dtype_as_scalartype(), at::globalContext().deterministicAlgorithms()};
  }
  bool operator==(const GlobalState& o) const {
    return default_dtype == o.default_dtype && deterministic == o.deterministic;
  }
  bool operator!=(const GlobalState& o) const { return !(*this == o); }
};

}  // namespace terra::runtime
