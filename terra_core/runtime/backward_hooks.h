// Whether a backward pass would run Python code: a custom autograd.Function's backward, a tensor
// hook (`register_hook`, `register_post_accumulate_grad_hook`) or a module's backward hook. Such
// code has side effects the program may observe (appending to a list, printing), so a backward
// that runs it must run in the program's own thread at the point the program called it, never
// on the GraphRunner. Checked when a backward is traced (its autograd graph exists then); the
// walk visits each autograd node once.
#pragma once

#include <ATen/core/stack.h>

#include <functional>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace terra::runtime {

// `args`: the backward pseudo-op's arguments (root tensors first).
bool backward_runs_python(const torch::jit::Stack& args);

// Whether running node `n` may run Python: a custom Function's backward, or a hook on it.
bool node_runs_python(torch::autograd::Node& n);

// Visits every autograd node reachable from `starts` once, depth first; `visit` returns false to
// stop the walk (which then returns false).
bool walk_autograd_graph(std::vector<torch::autograd::Node*> starts,
                         const std::function<bool(torch::autograd::Node&)>& visit);

}  // namespace terra::runtime
