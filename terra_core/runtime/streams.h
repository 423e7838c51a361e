// Accelerator streams in co-execution.
//
// An op the program issues on a CUDA (or other accelerator) tensor would, eagerly, be enqueued on
// the program thread's current stream for that device. The GraphRunner enqueues it on that same
// stream (captured when the op is issued), so:
//   - the order of device work is the program's order, whatever streams the program switches to;
//   - a fetch needs no event: once the GraphRunner has *launched* the producing op, the program
//     thread's own read (`.item()` copies on its current stream) is ordered after it by the stream;
//   - the caching allocator sees every allocation and free on the stream the program would have
//     used, so memory is reused exactly as in eager execution (no record_stream needed).
// Only the CPU-side cost of launching (dispatch, autograd, shape checks) moves to the GraphRunner,
// which is the point for launch-bound programs. Device-generic (c10's DeviceGuardImpl registry):
// nothing here needs CUDA headers, and on a CPU-only build it is never reached.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <optional>

namespace terra::runtime {

// The calling thread's current stream on `device`; none for CPU.
std::optional<c10::Stream> current_stream(c10::Device device);

// The GraphRunner's side: makes `stream` (and its device) current on the calling thread, doing
// nothing when it already is.
class StreamSwitcher {
 public:
  void use(const std::optional<c10::Stream>& stream);

 private:
  std::optional<c10::Stream> current_;
};

}  // namespace terra::runtime
