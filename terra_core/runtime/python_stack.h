// The user-visible Python call stack of an op, as a hash: part of its LocationKey.
//
// Each frame contributes (code identity, instruction offset). Code identity is a hash of the code
// object's content (bytecode, names, constants, qualified name) rather than its address, so a
// function redefined with the same code in a later cell keeps its nodes. The walk reads the
// interpreter's frame chain directly and needs no GIL (the PyTorch bindings release the GIL before
// an op reaches the dispatcher); only the first sight of a code object takes the GIL.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

namespace terra::runtime {

struct SourceFrame {
  std::string file;
  std::string function;
  int line = 0;
};

class PythonStack {
 public:
  // Frames from the current one up to and including `root` (or the whole stack if root is null).
  // `root` is an opaque frame pointer obtained from `current_frame()`.
  static uint64_t hash(const void* root);
  // The same frames as readable source positions, innermost first (takes the GIL).
  static std::vector<SourceFrame> describe(const void* root, size_t max_frames = 8);
  // The calling Python frame, and the frame that called a given one.
  static const void* current_frame();
  static const void* caller(const void* frame);
  // Drops cached code hashes (GIL held).
  static void clear_cache();
};

}  // namespace terra::runtime
