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

#include "terra/location_key.h"

namespace terra::runtime {

class PythonStack {
 public:
  // Where the walk stops: at `frame` (included; an opaque pointer from `current_frame()`), or
  // before the first frame running `stop_code` (a code object; excluded). In a notebook the
  // latter is IPython's run_code, so each cell statement's own frame is the outermost one.
  struct Root {
    const void* frame = nullptr;
    const void* stop_code = nullptr;
  };
  // Frames from the current one up to the root (the whole stack if neither is set). With
  // `innermost`, also the current frame's own part of it (its code and instruction; 0 if none).
  static uint64_t hash(const Root& root, uint64_t* innermost = nullptr);
  // The current frame's part alone: what a call's frame is, without walking its callers.
  static uint64_t innermost(const Root& root);
  // The innermost `max_frames` of the same frames as readable source positions, outermost first
  // (terra::SourceInfo's order; takes the GIL).
  static std::vector<terra::SourceFrame> describe(const Root& root, size_t max_frames = 8);
  // The calling Python frame, and the frame that called a given one.
  static const void* current_frame();
  static const void* caller(const void* frame);
  // Drops cached code hashes (GIL held).
  static void clear_cache();
};

}  // namespace terra::runtime
