#pragma once
// The program thread's C fast path (fast_path.cpp): C replacements for the hottest PyTorch entry
// points, which the `terra` package installs while a session is open (terra/_patches.py).
#include <pybind11/pybind11.h>

namespace terra::python {

// (owner, attribute name, replacement) for every Tensor method entry point, made once: `tensor`
// is torch.Tensor, `torch_module` torch, `functional` torch.nn.functional. The replacements call
// the attributes found there now whenever they do not take the fast path. Also finds the
// functions' entries (torch.relu, F.linear...), which are not replaced: see set_fast_path_functions.
pybind11::list fast_path_entries(pybind11::handle tensor, pybind11::handle torch_module,
                                 pybind11::handle functional);

// Puts the functions' fast path in (or takes it out) without replacing the functions: each
// function object keeps its identity and its vectorcall slot is pointed at the entry point (back
// at its own on `false`). TorchScript's builtin table and TorchDynamo's rules know PyTorch's
// functions by identity: a replacement object made `torch.jit.script` raise "Python builtin
// <built-in function linear> is currently not supported" inside a session, and `torch.compile`
// break its graph at every replaced function. After fast_path_entries.
void set_fast_path_functions(bool on);
bool fast_path_functions_on();

}  // namespace terra::python
