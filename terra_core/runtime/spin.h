// A busy-wait's pause: tells the core this thread spins (less power, the sibling hyperthread
// runs), for the spin loops of the GraphRunner and of kernel lanes.
#pragma once

namespace terra::runtime {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace terra::runtime
