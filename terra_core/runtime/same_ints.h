// Two sizes or strides lists are equal. ArrayRef's operator== calls memcmp, whose call and set-up
// cost more than the compare itself for the few dimensions tensors have (about 37 instructions a
// call, four to six calls per replayed elementwise kernel and per template check).
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <cstdint>

namespace terra::runtime {

inline bool same_ints(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace terra::runtime
