// The median of a range of numbers, sorting the range in place (callers pass a copy). Used by the
// payoff check's sample windows and by PairedTrial's pair ratios.
#pragma once

#include <iterator>
#include <utility>

namespace terra {

// The ranges are a few samples: an insertion sort (std::sort on a 6-element std::array trips
// GCC 12's -Warray-bounds, an error under TERRA_WERROR).
template <typename It>
double median_in_place(It first, It last) {
  const auto n = std::distance(first, last);
  for (auto i = 1; i < n; ++i)
    for (auto j = i; j > 0 && first[j - 1] > first[j]; --j) std::swap(first[j - 1], first[j]);
  if (n == 0) return 0.0;
  return n % 2 ? static_cast<double>(first[n / 2]) : 0.5 * (first[n / 2 - 1] + first[n / 2]);
}

}  // namespace terra
