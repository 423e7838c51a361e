// The `terra._C` extension module: the engine's entry points for Python.
#include <pybind11/pybind11.h>

#include "terra/version.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "Terra engine (imperative-symbolic co-execution for PyTorch)";
  m.attr("__version__") = terra::version();
}
