// What replayed kernels did: counted by the BlockReplayer as they run (block_replay.h) and per
// graph by the GraphRunner (GraphRunner::ReplayCounts), which `terra.stats` reports.
#pragma once

#include <cstdint>

namespace terra::runtime {

// One field per kind of kernel run; a BlockReplayer counts its own, flush_counts adds differences.
struct KernelCounts {
  uint64_t kernels = 0;  // kernels replayed
  // Kernels of bound items (BlockReplayer::bind) run with one thread where their recording found
  // the same bits.
  uint64_t bound_one_thread = 0;
  // Kernels replayed with the program's intra-op threads while it waited (RecordedKernel::spread),
  // and of those, elementwise kernels run through their kept iterator (ElementwiseReplay).
  uint64_t spread = 0, spread_elementwise = 0;
  uint64_t random_fills = 0;    // random kernels replayed with their draws made in batches (RandomFill)
  uint64_t results_reused = 0;  // elementwise results written into their kernel's kept last one
  uint64_t outputs_kept = 0;    // other kernels run in their out= form into their kept results (out_form.h)
  uint64_t views_remade = 0;    // view kernels' results made directly (BlockReplayer::run_alias)
  uint64_t helped = 0;          // kernels a waiting program thread ran (kernel_lanes.h)

  // Each field, in order: the += and - below, and any().
  template <typename F>
  static void each(F&& f) {
    f(&KernelCounts::kernels), f(&KernelCounts::bound_one_thread), f(&KernelCounts::spread);
    f(&KernelCounts::spread_elementwise), f(&KernelCounts::random_fills), f(&KernelCounts::results_reused);
    f(&KernelCounts::outputs_kept), f(&KernelCounts::views_remade), f(&KernelCounts::helped);
  }
  KernelCounts& operator+=(const KernelCounts& o) {
    each([&](uint64_t KernelCounts::*f) { this->*f += o.*f; });
    return *this;
  }
  KernelCounts operator-(const KernelCounts& o) const {
    KernelCounts d;
    each([&](uint64_t KernelCounts::*f) { d.*f = this->*f - o.*f; });
    return d;
  }
  bool any() const {
    bool any = false;
    each([&](uint64_t KernelCounts::*f) { any = any || this->*f != 0; });
    return any;
  }
};

}  // namespace terra::runtime
