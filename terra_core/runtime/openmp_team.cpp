#include "openmp_team.h"

#include <dlfcn.h>

namespace terra::runtime {

namespace {

using PauseAll = int (*)(int kind);
constexpr int kPauseSoft = 1;  // omp_pause_soft: free the threads, keep the settings

// A function of the OpenMP runtime PyTorch loaded (the wheel bundles its own libgomp), or of the
// MKL its library links in, found by the symbol they export: Terra is linked against neither.
template <typename F>
F find(const char* name, const char* library) {
  if (library) {
    if (void* lib = dlopen(library, RTLD_LAZY | RTLD_NOLOAD)) {
      if (void* f = dlsym(lib, name)) return reinterpret_cast<F>(f);
    }
  }
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

void set_intraop_threads(int n) {
  static const auto omp = find<void (*)(int)>("omp_set_num_threads", "libgomp.so.1");
  // What mkl.h maps mkl_set_num_threads_local to (the lower-case symbol is the Fortran
  // interface, which takes a pointer); it returns the previous count.
  static const auto mkl = find<int (*)(int)>("MKL_Set_Num_Threads_Local", "libtorch_cpu.so");
  if (omp) omp(n);
  if (mkl) mkl(n);
}

void release_openmp_team() {
  static const PauseAll pause = find<PauseAll>("omp_pause_resource_all", "libgomp.so.1");
  if (pause) pause(kPauseSoft);
}

}  // namespace terra::runtime
