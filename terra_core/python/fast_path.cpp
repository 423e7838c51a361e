// The C fast path of the program thread (issue 14): while a session is open, the hottest Python
// entry points of PyTorch (Tensor arithmetic and a few functions) are replaced by C functions
// that, during co-execution, build the operator's argument stack themselves and hand it straight
// to the PythonRunner, skipping PyTorch's argument parser, its GIL release and the dispatcher's
// trip to Terra's fallback. Whatever they do not recognise exactly (keywords they do not parse,
// other argument types, subclasses with __torch_function__, modes, profiler callbacks, keys above Terra's, a
// thread or a moment Terra does not intercept) they pass to the original function, untouched,
// which takes the dispatcher route: the fast path changes where an op enters the engine, never
// what the engine does with it.
#include "fast_path.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/utils/python_numbers.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>

#include "python_runner.h"

namespace terra::python {

namespace {

using terra::runtime::PythonRunner;

// How an entry point's Python arguments map onto its operator's schema (methods take the first
// tensor as self).
enum class Form {
  Unary,         // (input)
  UnaryNone,     // (input), then the schema's one keyword-only argument left None (dtype=, memory_format=)
  Binary,        // (input, other)
  BinaryAlpha,   // (input, other, *, alpha=1): add, sub
  BinaryWeight,  // (input, end, weight): lerp with a Python number as the weight
  Ternary,       // (input, tensor1, tensor2, *, value=1): addcmul, addcdiv
  Linear,        // (input, weight, bias=None)
  Item,          // (input) -> a Python number: Tensor.item
  Index,         // (input, i) with i a Python int in range: Tensor.__getitem__ as select(0, i)
  // Arguments in the schema's order or by their schema names, each a plain tensor, None for an
  // optional argument, a Python int, float or bool of the schema's type, a Python number for a
  // Scalar, a tuple or list of Python ints for an int list (or, where the entry takes `varargs`,
  // the ints themselves: `x.view(b, t, -1)`), a torch.dtype, a str; the schema's defaults for the
  // rest (schema_args). Every other type goes to the original.
  Schema,
  // Tensor.to(dtype) and Tensor.to(device), as the binding's dispatch_to calls them: aten::to.dtype,
  // and aten::to.dtype_layout with the tensor's own dtype and layout. Other forms: the original.
  To,
  // Tensor.float(): to.dtype(self, float32), as the binding calls it.
  Float,
  // Tensor.contiguous() of a tensor that is not contiguous, as Schema. The binding returns a
  // contiguous tensor itself without an op, so the original takes those (and every call with
  // arguments): issuing aten::contiguous there was an op the trace had not seen, a fallback in
  // Hugging Face attention at every one-token step (`o.transpose(1, 2).contiguous()` of shape
  // [2, 1, 4, 16]).
  Contiguous,
  // `~tensor` of a bool or integer tensor, as Unary (bitwise_not). The binding raises TypeError
  // for the others before any op; the original takes them (the kernel raised
  // NotImplementedError instead).
  Invert,
};

// Nn: torch._C._nn; VF: torch._VF (what F.* and the nn modules call: an object whose attributes
// it looks up in torch._C._VariableFunctions, so one set on it comes first).
enum class Owner { Tensor, Torch, Functional, Nn, VF };

struct Entry {
  Owner owner;
  const char* name;      // attribute replaced on the owner
  const char* op;        // aten operator and overload it calls
  const char* overload;
  Form form;
  bool numbers = false;  // Python numbers are accepted where a tensor goes (as PyTorch's parser does)
  bool dunder = false;   // a binary operator: TypeError becomes NotImplemented
  // Form::Schema: an int list that is the only positional argument may come as the ints
  // themselves, as PyTorch's parser takes `view(*size)`.
  bool varargs = false;
  // Form::UnaryNone: the overload that takes arguments (sum.dim_IntList), called by the schema form
  // when any are given (`x.sum(-1, keepdim=True)`).
  const char* with_arguments = nullptr;
  const c10::OperatorHandle* with_arguments_handle = nullptr;
  PyObject* original = nullptr;
  const c10::OperatorHandle* handle = nullptr;
  PyMethodDef def{};  // Tensor methods: the replacement's
  // Functions: the original's own vectorcall (null for METH_VARARGS, PyTorch's bindings) and
  // whether this entry is the one that swaps it (F.conv2d is torch.conv2d: two entries, one object).
  vectorcallfunc original_vectorcall = nullptr;
  bool swaps = false;
};

#define TERRA_METHOD(name, op, ov, form, numbers, dunder) \
  Entry{Owner::Tensor, name, op, ov, Form::form, numbers, dunder}
#define TERRA_FUNCTION(owner, name, op, ov, form, numbers) \
  Entry{Owner::owner, name, op, ov, Form::form, numbers, false}
#define TERRA_SIZES_METHOD(name, op) Entry{Owner::Tensor, name, op, "", Form::Schema, false, false, true}
#define TERRA_REDUCTION(owner, name, op, dims) Entry{Owner::owner, name, op, "", Form::UnaryNone, false, false, false, dims}

Entry entries[] = {
    TERRA_METHOD("__add__", "aten::add", "Tensor", BinaryAlpha, true, true),
    TERRA_METHOD("__radd__", "aten::add", "Tensor", BinaryAlpha, true, true),
    TERRA_METHOD("add", "aten::add", "Tensor", BinaryAlpha, true, false),
    TERRA_METHOD("__iadd__", "aten::add_", "Tensor", BinaryAlpha, true, true),
    TERRA_METHOD("add_", "aten::add_", "Tensor", BinaryAlpha, true, false),
    TERRA_METHOD("__sub__", "aten::sub", "Tensor", BinaryAlpha, true, true),
    TERRA_METHOD("sub", "aten::sub", "Tensor", BinaryAlpha, true, false),
    TERRA_METHOD("__isub__", "aten::sub_", "Tensor", BinaryAlpha, true, true),
    TERRA_METHOD("sub_", "aten::sub_", "Tensor", BinaryAlpha, true, false),
    TERRA_METHOD("__mul__", "aten::mul", "Tensor", Binary, true, true),
    TERRA_METHOD("__rmul__", "aten::mul", "Tensor", Binary, true, true),
    TERRA_METHOD("mul", "aten::mul", "Tensor", Binary, true, false),
    TERRA_METHOD("__imul__", "aten::mul_", "Tensor", Binary, true, true),
    TERRA_METHOD("mul_", "aten::mul_", "Tensor", Binary, true, false),
    TERRA_METHOD("__truediv__", "aten::div", "Tensor", Binary, true, true),
    TERRA_METHOD("div", "aten::div", "Tensor", Binary, true, false),
    TERRA_METHOD("__itruediv__", "aten::div_", "Tensor", Binary, true, true),
    TERRA_METHOD("div_", "aten::div_", "Tensor", Binary, true, false),
    TERRA_METHOD("__matmul__", "aten::matmul", "", Binary, false, true),
    TERRA_METHOD("matmul", "aten::matmul", "", Binary, false, false),
    TERRA_METHOD("relu", "aten::relu", "", Unary, false, false),
    TERRA_METHOD("relu_", "aten::relu_", "", Unary, false, false),
    TERRA_METHOD("tanh", "aten::tanh", "", Unary, false, false),
    TERRA_METHOD("sigmoid", "aten::sigmoid", "", Unary, false, false),
    TERRA_METHOD("exp", "aten::exp", "", Unary, false, false),
    TERRA_METHOD("sqrt", "aten::sqrt", "", Unary, false, false),
    TERRA_METHOD("abs", "aten::abs", "", Unary, false, false),
    TERRA_METHOD("neg", "aten::neg", "", Unary, false, false),
    TERRA_METHOD("__neg__", "aten::neg", "", Unary, false, false),
    TERRA_METHOD("t", "aten::t", "", Unary, false, false),
    TERRA_METHOD("detach", "aten::detach", "", Unary, false, false),
    TERRA_METHOD("zero_", "aten::zero_", "", Unary, false, false),
    TERRA_REDUCTION(Tensor, "sum", "aten::sum", "dim_IntList"),
    TERRA_REDUCTION(Tensor, "mean", "aten::mean", "dim"),
    TERRA_METHOD("clone", "aten::clone", "", UnaryNone, false, false),
    TERRA_METHOD("lerp", "aten::lerp", "Scalar", BinaryWeight, false, false),
    TERRA_METHOD("lerp_", "aten::lerp_", "Scalar", BinaryWeight, false, false),
    TERRA_METHOD("addcmul", "aten::addcmul", "", Ternary, false, false),
    TERRA_METHOD("addcmul_", "aten::addcmul_", "", Ternary, false, false),
    TERRA_METHOD("addcdiv", "aten::addcdiv", "", Ternary, false, false),
    TERRA_METHOD("addcdiv_", "aten::addcdiv_", "", Ternary, false, false),
    TERRA_METHOD("item", "aten::item", "", Item, false, false),
    TERRA_METHOD("__getitem__", "aten::select", "int", Index, false, false),
    TERRA_FUNCTION(Torch, "relu", "aten::relu", "", Unary, false),
    TERRA_FUNCTION(Torch, "tanh", "aten::tanh", "", Unary, false),
    TERRA_FUNCTION(Torch, "sigmoid", "aten::sigmoid", "", Unary, false),
    TERRA_FUNCTION(Torch, "exp", "aten::exp", "", Unary, false),
    TERRA_FUNCTION(Torch, "sqrt", "aten::sqrt", "", Unary, false),
    TERRA_FUNCTION(Torch, "abs", "aten::abs", "", Unary, false),
    TERRA_FUNCTION(Torch, "neg", "aten::neg", "", Unary, false),
    TERRA_REDUCTION(Torch, "sum", "aten::sum", "dim_IntList"),
    TERRA_REDUCTION(Torch, "mean", "aten::mean", "dim"),
    TERRA_FUNCTION(Torch, "add", "aten::add", "Tensor", BinaryAlpha, true),
    TERRA_FUNCTION(Torch, "sub", "aten::sub", "Tensor", BinaryAlpha, true),
    TERRA_FUNCTION(Torch, "mul", "aten::mul", "Tensor", Binary, true),
    TERRA_FUNCTION(Torch, "div", "aten::div", "Tensor", Binary, true),
    TERRA_FUNCTION(Torch, "matmul", "aten::matmul", "", Binary, false),
    TERRA_FUNCTION(Functional, "linear", "aten::linear", "", Linear, false),
    // The dispatcher route's most frequent entries in the benchmarks' steps (session 42:
    // rnn_lengths' embedding and cross entropy per time step; softmax, transpose, unsqueeze and
    // gelu in the transformers).
    TERRA_FUNCTION(Torch, "embedding", "aten::embedding", "", Schema, false),       // F.embedding
    TERRA_FUNCTION(Nn, "cross_entropy_loss", "aten::cross_entropy_loss", "", Schema, false),  // F.cross_entropy
    TERRA_FUNCTION(Functional, "gelu", "aten::gelu", "", Schema, false),
    TERRA_METHOD("softmax", "aten::softmax", "int", Schema, false, false),           // F.softmax
    TERRA_METHOD("log_softmax", "aten::log_softmax", "int", Schema, false, false),   // F.log_softmax
    TERRA_METHOD("transpose", "aten::transpose", "int", Schema, false, false),
    TERRA_METHOD("unsqueeze", "aten::unsqueeze", "", Schema, false, false),
    TERRA_FUNCTION(VF, "dropout", "aten::dropout", "", Schema, false),     // F.dropout, nn.Dropout
    TERRA_FUNCTION(VF, "gru_cell", "aten::gru_cell", "", Schema, false),   // nn.GRUCell
    // Session 43: the dispatcher route's most frequent entries in the transformers' steps
    // (clip_grad_norm_'s `norm.to(device)` per parameter; Hugging Face's `.to(dtype)`, views and
    // reshapes by sizes, layer norms, causal masks).
    TERRA_METHOD("to", "aten::to", "dtype_layout", To, false, false),
    TERRA_METHOD("float", "aten::to", "dtype", Float, false, false),
    TERRA_SIZES_METHOD("view", "aten::view"),
    TERRA_SIZES_METHOD("reshape", "aten::reshape"),
    TERRA_SIZES_METHOD("permute", "aten::permute"),
    TERRA_SIZES_METHOD("expand", "aten::expand"),
    TERRA_METHOD("contiguous", "aten::contiguous", "", Contiguous, false, false),
    TERRA_METHOD("masked_fill", "aten::masked_fill", "Scalar", Schema, false, false),
    TERRA_METHOD("__invert__", "aten::bitwise_not", "", Invert, false, false),
    TERRA_FUNCTION(Torch, "layer_norm", "aten::layer_norm", "", Schema, false),  // F.layer_norm
    TERRA_METHOD("pow", "aten::pow", "Tensor_Scalar", Schema, false, false),   // RMSNorm's x.pow(2)
    TERRA_METHOD("rsqrt", "aten::rsqrt", "", Unary, false, false),
    TERRA_FUNCTION(Torch, "rsqrt", "aten::rsqrt", "", Unary, false),
    TERRA_FUNCTION(Torch, "cat", "aten::cat", "", Schema, false),             // rotary embeddings, caches
    TERRA_FUNCTION(Torch, "addmm", "aten::addmm", "", Schema, false),         // GPT-2's Conv1D
    // and the convolution programs' (nn.Conv2d, nn.BatchNorm2d, pooling, flatten).
    TERRA_FUNCTION(Functional, "conv2d", "aten::conv2d", "", Schema, false),  // F.conv2d is torch.conv2d
    TERRA_FUNCTION(Torch, "conv2d", "aten::conv2d", "", Schema, false),
    TERRA_FUNCTION(Torch, "batch_norm", "aten::batch_norm", "", Schema, false),  // F.batch_norm
    TERRA_FUNCTION(Torch, "max_pool2d", "aten::max_pool2d", "", Schema, false),  // F.max_pool2d
    TERRA_FUNCTION(Nn, "adaptive_avg_pool2d", "aten::adaptive_avg_pool2d", "", Schema, false),
    TERRA_FUNCTION(Torch, "flatten", "aten::flatten", "using_ints", Schema, false),
    TERRA_METHOD("flatten", "aten::flatten", "using_ints", Schema, false, false),
};

#undef TERRA_METHOD
#undef TERRA_FUNCTION
#undef TERRA_SIZES_METHOD
#undef TERRA_REDUCTION

// Tensor.to(dtype)'s operator (the entry's own is to.dtype_layout, what to(device) calls).
const c10::OperatorHandle* to_dtype = nullptr;

// torch.Tensor and torch.nn.Parameter: the tensor types without a __torch_function__ of their
// own (Parameter's is PyTorch's disabled one). Instances of other subclasses take the original.
PyTypeObject* plain_types[2] = {nullptr, nullptr};

// A Python int as PyTorch's parser takes one for an int argument (not a bool), or nothing.
std::optional<int64_t> python_int(PyObject* obj) {
  if (!PyLong_CheckExact(obj)) return std::nullopt;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return std::nullopt;
  }
  return static_cast<int64_t>(v);
}

// A Python number as PyTorch's parser reads one (bool, int, float), or nothing for anything else
// (an int beyond 64 bits, a 0-dim tensor, which the parser would read with .item()).
std::optional<at::Scalar> python_number(PyObject* obj) {
  if (PyBool_Check(obj)) return at::Scalar(obj == Py_True);
  if (PyFloat_CheckExact(obj)) return at::Scalar(PyFloat_AS_DOUBLE(obj));
  if (const std::optional<int64_t> v = python_int(obj)) return at::Scalar(*v);
  return std::nullopt;
}

// A tensor argument as PyTorch's parser would take it, or false where the parser would do
// something this path does not (a __torch_function__ to call, another type).
// A torch.Tensor or nn.Parameter (no __torch_function__ of its own), or null.
const at::Tensor* plain_tensor(PyObject* obj, c10::DispatchKeySet* keys) {
  if (Py_TYPE(obj) != plain_types[0] && Py_TYPE(obj) != plain_types[1]) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  *keys = *keys | t.key_set();
  return &t;
}

bool tensor_arg(PyObject* obj, bool numbers, torch::jit::Stack* stack, c10::DispatchKeySet* keys) {
  if (const at::Tensor* t = plain_tensor(obj, keys)) {
    stack->emplace_back(*t);
    return true;
  }
  const std::optional<at::Scalar> number = numbers ? python_number(obj) : std::nullopt;
  if (!number) return false;
  // A Python number becomes a wrapped 0-dim tensor, as PythonArgs::tensor makes it.
  at::AutoDispatchBelowADInplaceOrView guard;
  at::Tensor t = at::scalar_to_tensor(*number);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  stack->emplace_back(std::move(t));
  return true;
}

// A Scalar argument: a Python number, as the parser takes it.
bool scalar_arg(PyObject* obj, torch::jit::Stack* stack) {
  const std::optional<at::Scalar> number = python_number(obj);
  if (number) stack->emplace_back(*number);
  return number.has_value();
}

// An int list argument: a tuple (torch.Size too) or list of Python ints, or, for an `int[N]`
// argument, one Python int standing for N of them, as PyTorch's parser takes it.
bool int_list_arg(PyObject* obj, const c10::Argument& a, torch::jit::Stack* stack) {
  if (const std::optional<int64_t> v = a.N() ? python_int(obj) : std::nullopt) {
    stack->emplace_back(c10::List<int64_t>(std::vector<int64_t>(*a.N(), *v)));
    return true;
  }
  if (!PyTuple_Check(obj) && !PyList_Check(obj)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  PyObject** items = PySequence_Fast_ITEMS(obj);
  c10::List<int64_t> list;
  list.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const std::optional<int64_t> v = python_int(items[i]);
    if (!v) return false;
    list.push_back(*v);
  }
  stack->emplace_back(std::move(list));
  return true;
}

// A Tensor[] argument: a tuple or list of plain tensors.
bool tensor_list_arg(PyObject* obj, torch::jit::Stack* stack, c10::DispatchKeySet* keys) {
  if (!PyTuple_Check(obj) && !PyList_Check(obj)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  PyObject** items = PySequence_Fast_ITEMS(obj);
  c10::List<at::Tensor> list;
  list.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const at::Tensor* t = plain_tensor(items[i], keys);
    if (!t) return false;
    list.push_back(*t);
  }
  stack->emplace_back(std::move(list));
  return true;
}

// One Python argument of a schema argument's type, or false.
bool schema_arg(PyObject* obj, const c10::Argument& a, torch::jit::Stack* stack, c10::DispatchKeySet* keys) {
  c10::TypePtr type = a.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    if (obj == Py_None) {
      stack->emplace_back();
      return true;
    }
    type = optional->getElementType();
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType: return tensor_arg(obj, false, stack, keys);
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: {
      const std::optional<int64_t> v = python_int(obj);
      if (v) stack->emplace_back(*v);
      return v.has_value();
    }
    case c10::TypeKind::FloatType:
      if (PyFloat_CheckExact(obj)) {
        stack->emplace_back(PyFloat_AS_DOUBLE(obj));
      } else if (const std::optional<int64_t> v = python_int(obj)) {
        stack->emplace_back(static_cast<double>(*v));  // as the parser reads an int for a float
      } else {
        return false;
      }
      return true;
    case c10::TypeKind::BoolType:
      if (!PyBool_Check(obj)) return false;
      stack->emplace_back(obj == Py_True);
      return true;
    case c10::TypeKind::NumberType: return scalar_arg(obj, stack);  // a Scalar
    case c10::TypeKind::ScalarTypeType:
      if (!THPDtype_Check(obj)) return false;
      stack->emplace_back(reinterpret_cast<THPDtype*>(obj)->scalar_type);
      return true;
    case c10::TypeKind::StringType:
      if (!PyUnicode_CheckExact(obj)) return false;
      stack->emplace_back(std::string(PyUnicode_AsUTF8(obj)));
      return true;
    case c10::TypeKind::ListType: {
      const c10::TypeKind element = type->castRaw<c10::ListType>()->getElementType()->kind();
      if (element == c10::TypeKind::TensorType) return tensor_list_arg(obj, stack, keys);
      return (element == c10::TypeKind::IntType || element == c10::TypeKind::SymIntType) &&
             int_list_arg(obj, a, stack);
    }
    default: return false;
  }
}

// Form::Schema: the Python arguments after self (`first` schema arguments are on the stack),
// positional ones in the schema's order, keywords by schema name, each of its argument's type,
// then the defaults of those not given. `varargs`: the ints of an int list that is the only
// positional argument may come as positional arguments themselves.
bool schema_args(const c10::FunctionSchema& schema, size_t first, PyObject* const* args, Py_ssize_t nargs,
                 PyObject* kwnames, bool varargs, torch::jit::Stack* stack, c10::DispatchKeySet* keys) {
  const auto& formal = schema.arguments();
  if (first >= formal.size() && nargs > 0) return false;
  if (varargs && nargs >= 1 && python_int(args[0]) && formal[first].real_type()->kind() == c10::TypeKind::ListType) {
    PyObject* sizes = PyTuple_New(nargs);  // the ints as the tuple PyTorch's parser makes of them
    if (!sizes) {
      PyErr_Clear();
      return false;
    }
    for (Py_ssize_t k = 0; k < nargs; ++k) {
      Py_INCREF(args[k]);
      PyTuple_SET_ITEM(sizes, k, args[k]);
    }
    PyObject* const one[] = {sizes};
    const bool ok = schema_args(schema, first, one, 1, kwnames, false, stack, keys);
    Py_DECREF(sizes);
    return ok;
  }
  if (first + static_cast<size_t>(nargs) > formal.size()) return false;
  // Keywords by the schema's names (the parser's too, but `input` for a function's self, which is
  // positional here anyway); a name the schema lacks or one given twice goes to the original.
  std::array<PyObject*, 16> given{};
  if (formal.size() > given.size()) return false;
  for (Py_ssize_t k = 0; k < nargs; ++k) given[first + static_cast<size_t>(k)] = args[k];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
    if (!name) {
      PyErr_Clear();
      return false;
    }
    size_t i = first;
    while (i < formal.size() && formal[i].name() != name) ++i;
    if (i == formal.size() || given[i]) return false;
    given[i] = args[nargs + k];
  }
  for (size_t i = first; i < formal.size(); ++i) {
    const c10::Argument& a = formal[i];
    if (!given[i]) {
      if (!a.default_value()) return false;
      stack->push_back(*a.default_value());
    } else if ((i - first < static_cast<size_t>(nargs) && a.kwarg_only()) || !schema_arg(given[i], a, stack, keys)) {
      return false;
    }
  }
  return true;
}

// to.dtype(self, dtype, non_blocking=False, copy=False, memory_format=None), self on the stack.
const c10::OperatorHandle* to_dtype_args(c10::ScalarType dtype, torch::jit::Stack* stack) {
  stack->emplace_back(dtype);
  stack->emplace_back(false);
  stack->emplace_back(false);
  stack->emplace_back();
  return to_dtype;
}

// Form::To: `self.to(dtype)` or `self.to(device)` (self is on the stack), as the binding's
// dispatch_to calls the operator; the operator, or null for every other form.
const c10::OperatorHandle* to_args(const Entry& e, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                                   torch::jit::Stack* stack) {
  if (kwnames || nargs != 1) return nullptr;
  PyObject* a = args[0];
  if (THPDtype_Check(a)) return to_dtype_args(reinterpret_cast<THPDtype*>(a)->scalar_type, stack);
  if (!THPDevice_Check(a)) return nullptr;
  const c10::Device device = reinterpret_cast<THPDevice*>(a)->device;
  if (!device.is_cpu()) return nullptr;  // the binding initializes an accelerator first
  // to.dtype_layout with self.options().device(device): the tensor's dtype and layout, no
  // pinned-memory choice, no memory format.
  const at::Tensor& self = stack->back().toTensor();
  stack->emplace_back(self.scalar_type());
  stack->emplace_back(self.layout());
  stack->emplace_back(device);
  stack->emplace_back();
  stack->emplace_back(false);
  stack->emplace_back(false);
  stack->emplace_back();
  return e.handle;
}

size_t tensors_of(Form form) {
  switch (form) {
    case Form::Unary:
    case Form::Invert:
    case Form::UnaryNone:
    case Form::Item:
    case Form::Index: return 1;
    case Form::Ternary: return 3;
    default: return 2;
  }
}

// The operator and its stack for these Python arguments, or null: the original function takes them.
const c10::OperatorHandle* build(const Entry& e, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                 PyObject* kwnames, torch::jit::Stack* stack) {
  if (!PythonRunner::instance().fast_ready() || at::impl::torch_function_mode_enabled()) return nullptr;
  // The one keyword-only Scalar some schemas take after their tensors.
  const char* keyword = e.form == Form::BinaryAlpha ? "alpha" : e.form == Form::Ternary ? "value" : nullptr;
  PyObject* keyword_value = nullptr;
  const c10::OperatorHandle* op = e.handle;
  if (kwnames && e.form != Form::Schema && !e.with_arguments_handle) {
    if (!keyword || e.dunder || PyTuple_GET_SIZE(kwnames) != 1 ||
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), keyword) != 0)
      return nullptr;
    keyword_value = args[nargs];
  }
  if (e.form == Form::Contiguous && (nargs != 0 || kwnames || THPVariable_Unpack(self).is_contiguous()))
    return nullptr;
  if (e.form == Form::Invert && !at::isIntegralType(THPVariable_Unpack(self).scalar_type(), /*includeBool=*/true))
    return nullptr;
  c10::DispatchKeySet keys;
  const bool method = e.owner == Owner::Tensor;
  if (method && !tensor_arg(self, false, stack, &keys)) return nullptr;
  if (e.form == Form::Linear) {
    if (nargs != 2 && nargs != 3) return nullptr;
    for (Py_ssize_t i = 0; i < 2; ++i)
      if (!tensor_arg(args[i], false, stack, &keys)) return nullptr;
    if (nargs == 2 || args[2] == Py_None) {
      stack->emplace_back();
    } else if (!tensor_arg(args[2], false, stack, &keys)) {
      return nullptr;
    }
  } else if (e.form == Form::Schema || e.form == Form::Contiguous ||
             (e.with_arguments_handle && (nargs > (method ? 0 : 1) || kwnames))) {
    if (e.form != Form::Schema && e.form != Form::Contiguous) op = e.with_arguments_handle;
    if (!schema_args(op->schema(), method ? 1 : 0, args, nargs, kwnames, e.varargs, stack, &keys)) return nullptr;
  } else if (e.form == Form::To) {
    op = to_args(e, args, nargs, kwnames, stack);
    if (!op) return nullptr;
  } else if (e.form == Form::Float) {
    if (nargs != 0) return nullptr;
    op = to_dtype_args(c10::ScalarType::Float, stack);
  } else if (e.form == Form::Index) {
    // `x[i]` as PyTorch's indexing takes a plain int: select(0, i). Anything else (slices,
    // tuples, tensors, bools, NumPy integers, an index out of range, whose error PyTorch words
    // itself, a 0-dim tensor) goes to the original.
    if (nargs != 1 || !PyLong_CheckExact(args[0])) return nullptr;
    const std::optional<at::Scalar> index = python_number(args[0]);  // none beyond 64 bits
    const at::Tensor& self_tensor = stack->back().toTensor();
    if (!index || self_tensor.dim() == 0) return nullptr;
    const int64_t i = index->toLong();
    const int64_t size = self_tensor.size(0);
    if (i < -size || i >= size) return nullptr;
    stack->emplace_back(static_cast<int64_t>(0));
    stack->emplace_back(i);
  } else {
    const auto tensors = static_cast<Py_ssize_t>(tensors_of(e.form)) - (method ? 1 : 0);
    const Py_ssize_t positional = tensors + (e.form == Form::BinaryWeight ? 1 : 0);
    if (nargs != positional) return nullptr;
    for (Py_ssize_t i = 0; i < tensors; ++i)
      if (!tensor_arg(args[i], e.numbers && (method || i > 0), stack, &keys)) return nullptr;
    if (e.form == Form::BinaryWeight && !scalar_arg(args[tensors], stack)) return nullptr;
    if (e.form == Form::UnaryNone) stack->emplace_back();
    if (keyword) {
      if (!keyword_value) {
        stack->emplace_back(int64_t{1});  // the IValue a Scalar 1 makes, without the Scalar
      } else if (!scalar_arg(keyword_value, stack)) {
        return nullptr;
      }
    }
  }
  // The dispatcher would go to Terra's fallback first: nothing above it (a Python dispatcher,
  // pre-dispatch tracing), Terra included on this thread and not excluded, no profiler callbacks
  // for this call. Asked as the dispatcher asks (a thread-local copy of the global callbacks,
  // checked against an atomic version): at::hasCallbacks() locks the global callbacks' mutex, two
  // futex-free but contended-line calls per op, about 3% of the program thread on a 1x1 chain.
  const auto local = c10::impl::tls_local_dispatch_key_set();
  const c10::DispatchKeySet effective = (keys | local.included_) - local.excluded_;
  const bool ours = effective.highestPriorityTypeId() == PythonRunner::kHookKey &&
                    !at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value();
  return ours ? op : nullptr;
}

PyObject* call_original(const Entry& e, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                        PyObject* kwnames) {
  if (e.owner != Owner::Tensor) {
    // The function object itself now calls the entry point (its vectorcall slot is swapped): its
    // original behaviour is its own vectorcall, or for PyTorch's METH_VARARGS bindings (which have
    // none) the type's tp_call, which calls the method definition without looking at the slot.
    if (e.original_vectorcall) return e.original_vectorcall(e.original, args, static_cast<size_t>(nargs), kwnames);
    return _PyObject_MakeTpCall(PyThreadState_Get(), e.original, args, nargs, kwnames);
  }
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject* small[8];
  std::vector<PyObject*> large;
  PyObject** all = small;
  if (nargs + nkw + 1 > 8) {
    large.resize(static_cast<size_t>(nargs + nkw + 1));
    all = large.data();
  }
  all[0] = self;
  for (Py_ssize_t i = 0; i < nargs + nkw; ++i) all[i + 1] = args[i];
  return PyObject_Vectorcall(e.original, all, static_cast<size_t>(nargs + 1), kwnames);
}

// The op through the engine, its result as PyTorch's binding returns it (a tensor, or item's
// Scalar as a Python number: torch::jit::toPyObject); errors raised as the binding raises them.
PyObject* run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  HANDLE_TH_ERRORS
  PythonRunner& runner = PythonRunner::instance();
  runner.on_fast(op, stack);
  c10::IValue& result = stack->at(0);
  if (!result.isTensor()) return torch::jit::toPyObject(result).release().ptr();
  PyObject* wrapped = THPVariable_Wrap(result.toTensor());
  runner.keep_returned(std::move(result).toTensor());  // not dropped now: keep_returned says why
  return wrapped;
  END_HANDLE_TH_ERRORS
}

template <size_t I>
PyObject* entry_point(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const Entry& e = entries[I];
  // The engine swaps argument and return vectors with the caller's (PythonRunner::issue), so one
  // spare vector circulates: building the stack allocates nothing in steady state.
  torch::jit::Stack* spare = PythonRunner::instance().fast_stack();
  torch::jit::Stack stack = spare ? std::move(*spare) : torch::jit::Stack();  // a nested call finds it empty
  stack.clear();
  stack.reserve(4);
  const c10::OperatorHandle* op = build(e, self, args, nargs, kwnames, &stack);
  PyObject* result = op ? run(*op, &stack) : call_original(e, self, args, nargs, kwnames);
  stack.clear();
  if (spare) *spare = std::move(stack);
  if (!result && e.dunder && PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();  // as PyTorch's binary operators do: Python then tries the reflected one
    Py_RETURN_NOTIMPLEMENTED;
  }
  return result;
}

// A function's entry point as its vectorcall slot calls it (the function object is `callable`).
template <size_t I>
PyObject* function_entry_point(PyObject* /*callable*/, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return entry_point<I>(nullptr, args, PyVectorcall_NARGS(nargsf), kwnames);
}

template <size_t... I>
constexpr std::array<PyCFunction, sizeof...(I)> make_entry_points(std::index_sequence<I...>) {
  return {reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&entry_point<I>))...};
}

template <size_t... I>
constexpr std::array<vectorcallfunc, sizeof...(I)> make_function_entry_points(std::index_sequence<I...>) {
  return {&function_entry_point<I>...};
}

constexpr auto kEntryIndices = std::make_index_sequence<std::extent_v<decltype(entries)>>();
const auto entry_points = make_entry_points(kEntryIndices);
const auto function_entry_points = make_function_entry_points(kEntryIndices);
bool entries_made = false;

}  // namespace

pybind11::list fast_path_entries(pybind11::handle tensor, pybind11::handle torch_module,
                                 pybind11::handle functional) {
  static auto& made = *new pybind11::list();  // never destroyed: it outlives the interpreter
  if (entries_made) return made;
  plain_types[0] = reinterpret_cast<PyTypeObject*>(tensor.ptr());
  plain_types[1] = reinterpret_cast<PyTypeObject*>(
      pybind11::object(pybind11::module_::import("torch.nn").attr("Parameter")).release().ptr());
  PyObject* nn = pybind11::module_::import("torch._C._nn").release().ptr();  // kept: so are the originals
  PyObject* vf = pybind11::object(pybind11::module_::import("torch").attr("_VF")).release().ptr();
  to_dtype = new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow("aten::to", "dtype"));
  for (size_t i = 0; i < std::size(entries); ++i) {
    Entry& e = entries[i];
    PyObject* owner = e.owner == Owner::Tensor       ? tensor.ptr()
                      : e.owner == Owner::Torch      ? torch_module.ptr()
                      : e.owner == Owner::Functional ? functional.ptr()
                      : e.owner == Owner::Nn         ? nn
                                                     : vf;
    e.original = PyObject_GetAttrString(owner, e.name);  // kept for the process's lifetime
    if (!e.original) throw pybind11::error_already_set();
    e.handle = new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow(e.op, e.overload));
    if (e.with_arguments)
      e.with_arguments_handle =
          new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow(e.op, e.with_arguments));
    if (e.owner != Owner::Tensor) {
      if (!PyCFunction_Check(e.original))
        throw std::runtime_error(std::string("fast path: ") + e.name + " is not a builtin function");
      e.original_vectorcall = reinterpret_cast<PyCFunctionObject*>(e.original)->vectorcall;
      e.swaps = std::none_of(entries, entries + i, [&](const Entry& o) { return o.swaps && o.original == e.original; });
      continue;
    }
    e.def = PyMethodDef{e.name, entry_points[i], METH_FASTCALL | METH_KEYWORDS, nullptr};
    PyObject* doc = PyObject_GetAttrString(e.original, "__doc__");
    if (doc && PyUnicode_Check(doc)) e.def.ml_doc = PyUnicode_AsUTF8(doc);  // kept alive below
    PyObject* fn = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(tensor.ptr()), &e.def);
    if (!fn) throw pybind11::error_already_set();
    made.append(pybind11::make_tuple(pybind11::handle(owner), e.name,
                                     pybind11::reinterpret_steal<pybind11::object>(fn)));
  }
  entries_made = true;
  return made;
}

void set_fast_path_functions(bool on) {
  if (!entries_made) throw std::logic_error("set_fast_path_functions before fast_path_entries");
  for (size_t i = 0; i < std::size(entries); ++i) {
    const Entry& e = entries[i];
    if (!e.swaps) continue;
    reinterpret_cast<PyCFunctionObject*>(e.original)->vectorcall =
        on ? function_entry_points[i] : e.original_vectorcall;
  }
}

bool fast_path_functions_on() {
  for (size_t i = 0; i < std::size(entries); ++i)
    if (entries[i].swaps)
      return reinterpret_cast<PyCFunctionObject*>(entries[i].original)->vectorcall == function_entry_points[i];
  return false;
}

}  // namespace terra::python
