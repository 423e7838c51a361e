#pragma once
// The program thread's C fast path (fast_path.cpp): C replacements for the hottest PyTorch entry
// points, which the `terra` package installs while a session is open (terra/_patches.py).
#include <pybind11/pybind11.h>

namespace terra::python {

// (owner, attribute name, replacement) for every entry point, made once: `tensor` is
// torch.Tensor, `torch_module` torch, `functional` torch.nn.functional. The replacements call
// the attributes found there now whenever they do not take the fast path.
pybind11::list fast_path_entries(pybind11::handle tensor, pybind11::handle torch_module,
                                 pybind11::handle functional);

}  // namespace terra::python
