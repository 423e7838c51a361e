#include "backward_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <cstring>
#include <typeinfo>
#include <unordered_set>
#include <vector>

namespace terra::runtime {

namespace {

// A custom Function's node (torch::autograd::PyNode), or TorchScript's backward of a graph it
// differentiated (torch::jit's DifferentiableGraphBackward, in an anonymous namespace: its graph
// may call Python, `@torch.jit.ignore`d functions). Neither class's type_info is exported, so
// they are recognised by the (Itanium-mangled) name of the dynamic type.
bool is_python_function(const torch::autograd::Node& n) {
  const char* name = typeid(n).name();
  return std::strcmp(name, "N5torch8autograd6PyNodeE") == 0 ||
         std::strstr(name, "DifferentiableGraphBackward") != nullptr;
}

}  // namespace

bool node_runs_python(torch::autograd::Node& n) {
  // Hooks are opaque callables; any of them may be Python. Retain-grad hooks are kept apart by
  // autograd and are not counted (they only store the gradient).
  return is_python_function(n) || !n.pre_hooks().empty() ||
         !n.post_hooks().empty() || !n.tensor_pre_hooks().empty() ||
         n.tensor_post_acc_grad_hooks() != nullptr;
}

bool walk_autograd_graph(std::vector<torch::autograd::Node*> todo,
                         const std::function<bool(torch::autograd::Node&)>& visit) {
  std::unordered_set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (!visit(*n)) return false;
    for (const torch::autograd::Edge& e : n->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return true;
}

bool backward_runs_python(const torch::jit::Stack& args) {
  if (args.empty() || !args[0].isTensorList()) return false;
  std::vector<torch::autograd::Node*> todo;
  for (const at::Tensor& root : args[0].toTensorList()) {
    if (!root.defined()) continue;
    if (!torch::autograd::impl::hooks(root).empty()) return true;  // a hook on the root itself
    if (auto fn = root.grad_fn()) todo.push_back(fn.get());
  }
  return !walk_autograd_graph(std::move(todo), [](torch::autograd::Node& n) { return !node_runs_python(n); });
}

}  // namespace terra::runtime
