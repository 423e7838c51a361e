#include "openmp_team.h"

#include <dlfcn.h>

namespace terra::runtime {

namespace {

using PauseAll = int (*)(int kind);
constexpr int kPauseSoft = 1;  // omp_pause_soft: free the threads, keep the settings

// The runtime PyTorch loaded (the wheel bundles its own libgomp), found by the symbol it exports;
// Terra is not linked against OpenMP itself.
PauseAll find_pause() {
  if (void* lib = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
    if (void* f = dlsym(lib, "omp_pause_resource_all")) return reinterpret_cast<PauseAll>(f);
  }
  return reinterpret_cast<PauseAll>(dlsym(RTLD_DEFAULT, "omp_pause_resource_all"));
}

}  // namespace

void release_openmp_team() {
  static const PauseAll pause = find_pause();
  if (pause) pause(kPauseSoft);
}

}  // namespace terra::runtime
