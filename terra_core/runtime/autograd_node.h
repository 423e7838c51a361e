#pragma once
// How autograd's graph owns a Node: c10::intrusive_ptr from torch 2.12 on, std::shared_ptr before
// (the lent GPU machine has torch 2.11). Everything Terra does with node pointers goes through
// these three names, so the engine builds against both.

#include <torch/csrc/autograd/edge.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace terra::runtime {

using NodePtr = decltype(torch::autograd::Edge::function);

constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>;

// An owning pointer to a node the graph already owns (a tensor's grad_fn).
template <typename N, typename P = NodePtr>
P node_ptr(N* fn) {
  if constexpr (kSharedNodes) {
    return fn->shared_from_this();
  } else {
    return P::reclaim_copy(fn);
  }
}

template <typename N, typename... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (kSharedNodes) {
    return std::make_shared<N>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  }
}

}  // namespace terra::runtime
