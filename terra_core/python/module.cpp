// The `terra._C` extension module: the engine's entry points for the `terra` Python package.
// Only glue lives here: argument conversion and the Python side of the pseudo-ops (backward,
// .grad); the engine is in terra_core/runtime.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "fast_path.h"
#include "graph.h"
#include "out_form.h"
#include "python_runner.h"
#include "runner_allocator.h"
#include "timeline.h"
#include "payoff_memory.h"
#include "verdicts.h"
#include "python_stack.h"
#include "terra/version.h"

namespace py = pybind11;
using terra::runtime::Graph;
using terra::runtime::OpKind;
using terra::runtime::PythonRunner;

namespace {

// What block replay did (block_replay.h), for one graph or the whole process.
nlohmann::json replay_json(const terra::runtime::GraphRunner::ReplayCounts& c) {
  return {{"iterations_replayed", c.iterations}, {"items_replayed", c.items},
          {"kernels_replayed", c.run.kernels},       {"blocks_recorded", c.recorded},
          {"blocks_chosen_by_path", c.chosen},
          {"blocks_one_thread", c.one_thread},   {"blocks_refused", c.refused},
          {"replay_refusal", c.last_refusal},    {"items_bound", c.bound},
          {"replays_left", c.left},              {"replay_left_why", c.last_left},
          {"grad_reads_between_replayed_items", c.extra_reads},
          {"bound_kernels_one_thread", c.run.bound_one_thread},
          {"kernels_spread_while_waited", c.run.spread},
          {"kernels_spread_elementwise", c.run.spread_elementwise},
          {"random_fills_inlined", c.run.random_fills},
          {"results_reused", c.run.results_reused},
          {"kernels_into_kept_outputs", c.run.outputs_kept},
          {"views_remade", c.run.views_remade},
          {"kernels_run_by_waiting_program", c.run.helped},
          {"kernels_checked", c.checked},        {"kernel_verdicts_reused", c.verdicts_reused},
          {"not_one_thread_kernel", c.not_one_thread},
          {"program_count_kernels", c.program_count_kernels},
          {"parallel_kernels_large", c.parallel_large},
          {"parallel_kernels_small", c.parallel_small},
          {"items_one_thread_per_op", c.one_thread_per_op}};
}

// A graph's counters (stats_json) with what block replay did with its iterations.
nlohmann::json stats_with_replay(const terra::runtime::Graph& g) {
  nlohmann::json j = terra::runtime::stats_json(g);
  j.update(replay_json(terra::runtime::PythonRunner::instance().runner().replay_counts(g.serial)));
  return j;
}


PythonRunner& R() { return PythonRunner::instance(); }

Graph* graph_named(const std::string& name) {
  auto& g = R().graphs()[name];
  if (!g) {
    g = std::make_unique<Graph>();
    g->name = name;
  }
  return g.get();
}

c10::List<at::Tensor> tensor_list(const py::handle& seq) {
  c10::List<at::Tensor> out;
  for (const py::handle& h : seq) out.push_back(THPVariable_Unpack(h.ptr()));
  return out;
}

c10::impl::GenericList optional_tensor_list(const py::handle& seq) {
  c10::impl::GenericList out(c10::OptionalType::create(c10::TensorType::get()));
  for (const py::handle& h : seq) {
    if (h.is_none()) {
      out.push_back(c10::IValue());
    } else {
      out.push_back(THPVariable_Unpack(h.ptr()));
    }
  }
  return out;
}

// torch.autograd's engine entry, intercepted: `original` is torch's own function.
// torch.autograd's _engine_run_backward(t_outputs, grad_tensors, retain_graph, create_graph,
// inputs, allow_unreachable, accumulate_grad), positional or keyword after the outputs:
// `backward()` passes the last two as keywords, `torch.autograd.grad` passes allow_unreachable
// positionally.
py::object backward(py::object original, py::tuple t_outputs, py::args args, py::kwargs kwargs) {
  auto arg = [&](size_t i, const char* name, py::object fallback) -> py::object {
    if (i < args.size()) return args[i];
    return kwargs.contains(name) ? py::object(kwargs[name]) : fallback;
  };
  const py::object inputs = arg(3, "inputs", py::none());
  const bool plain = args.size() >= 3 && args.size() <= 5 &&
                     (inputs.is_none() || py::len(inputs) == 0) &&
                     arg(5, "accumulate_grad", py::bool_(true)).cast<bool>();
  if (!plain) {
    R().barrier("torch.autograd.grad and backward(inputs=...) run eagerly", "autograd.grad");
    return original(t_outputs, *args, **kwargs);
  }
  const py::tuple grad_tensors = args[0];
  torch::jit::Stack stack{tensor_list(t_outputs), optional_tensor_list(grad_tensors),
                          c10::IValue(args[1].cast<bool>()), c10::IValue(args[2].cast<bool>())};
  py::object result = py::tuple();
  R().on_pseudo(OpKind::Backward, "backward", &stack, [&](torch::jit::Stack* s) {
    result = original(t_outputs, *args, **kwargs);
    s->clear();
  });
  R().after_backward();
  return result;
}

PyObject* mark_as(PyObject* boundary, bool helper) {
  const unsigned long long id = PyLong_AsUnsignedLongLongMask(boundary);
  if (id == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  HANDLE_TH_ERRORS
  R().mark(id, helper);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* mark(PyObject*, PyObject* boundary) { return mark_as(boundary, false); }
PyObject* mark_helper(PyObject*, PyObject* boundary) { return mark_as(boundary, true); }

// `Tensor.grad`'s getter while a session is open: a plain METH_O function, the property's fget
// itself, without a Python function or pybind11's argument conversion around it (an optimizer
// step reads every gradient two or three times).
PyObject* grad_get(PyObject*, PyObject* self) {
  HANDLE_TH_ERRORS
  if (!THPVariable_Check(self)) {
    PyErr_Format(PyExc_TypeError, "grad: expected a Tensor, got %s", Py_TYPE(self)->tp_name);
    return nullptr;
  }
  torch::jit::Stack stack{THPVariable_Unpack(self)};
  R().on_pseudo(OpKind::GradRead, ".grad", &stack, [](torch::jit::Stack* s) {
    at::Tensor t = s->at(0).toTensor();
    s->clear();
    const at::Tensor& g = t.grad();
    s->emplace_back(g.defined() ? c10::IValue(g) : c10::IValue());
  });
  if (stack.empty() || !stack[0].isTensor() || !stack[0].toTensor().defined()) Py_RETURN_NONE;
  return THPVariable_Wrap(stack[0].toTensor());
  END_HANDLE_TH_ERRORS
}

// `Tensor.grad_fn` and `Tensor.is_leaf` while a session is open (plain METH_O functions, the
// properties' fgets: `zero_grad(set_to_none=False)` asks every gradient for its grad_fn). A
// placeholder's autograd history is made by the GraphRunner: one that requires grad is filled
// first (unfilled, it shows no node, and a leaf, where eager shows its op's node). One that does
// not is a leaf without a node either way.
PyObject* history_get(PyObject* self, PyObject* descriptor) {
  HANDLE_TH_ERRORS
  if (THPVariable_Check(self)) {
    const at::Tensor& t = THPVariable_Unpack(self);
    if (t.requires_grad()) R().fill_history(t);
  }
  return Py_TYPE(descriptor)->tp_descr_get(descriptor, self, reinterpret_cast<PyObject*>(Py_TYPE(self)));
  END_HANDLE_TH_ERRORS
}

PyObject* grad_fn_descriptor = nullptr;  // TensorBase's own, looked up once
PyObject* is_leaf_descriptor = nullptr;
PyObject* base_descriptor = nullptr;
PyObject* grad_fn_get(PyObject*, PyObject* self) { return history_get(self, grad_fn_descriptor); }
// `Tensor._base` and `Tensor._is_view()`: a placeholder made by a view op is no autograd view
// (the GraphRunner makes the view); it holds the base eager's view would name.
const at::Tensor* placeholder_view_base(PyObject* self) {
  if (!THPVariable_Check(self)) return nullptr;
  const auto* p = terra::runtime::placeholder_impl(THPVariable_Unpack(self));
  return p && p->view_base().defined() ? &p->view_base() : nullptr;
}
PyObject* base_get(PyObject*, PyObject* self) {
  HANDLE_TH_ERRORS
  if (const at::Tensor* base = placeholder_view_base(self)) return THPVariable_Wrap(*base);
  return Py_TYPE(base_descriptor)->tp_descr_get(base_descriptor, self, reinterpret_cast<PyObject*>(Py_TYPE(self)));
  END_HANDLE_TH_ERRORS
}
PyObject* is_leaf_get(PyObject*, PyObject* self) { return history_get(self, is_leaf_descriptor); }

void grad_set(py::object self, py::object value, py::object setter) {
  torch::jit::Stack stack{THPVariable_Unpack(self.ptr()),
                          value.is_none() ? c10::IValue() : c10::IValue(THPVariable_Unpack(value.ptr()))};
  R().on_pseudo(OpKind::GradWrite, ".grad =", &stack, [&](torch::jit::Stack* s) {
    setter(self, value);
    s->clear();
  });
}

// The engine's JSON (stats, graphs, fallbacks) as Python objects, built directly (not dumped to
// text and parsed again).
py::object to_python(const nlohmann::json& j) {
  using T = nlohmann::json::value_t;
  switch (j.type()) {
    case T::null: return py::none();
    case T::boolean: return py::bool_(j.get<bool>());
    case T::number_integer: return py::int_(j.get<int64_t>());
    case T::number_unsigned: return py::int_(j.get<uint64_t>());
    case T::number_float: return py::float_(j.get<double>());
    case T::string: return py::str(j.get_ref<const std::string&>());
    case T::array: {
      py::list out;
      for (const auto& e : j) out.append(to_python(e));
      return std::move(out);
    }
    case T::object: {
      py::dict out;
      for (const auto& [k, v] : j.items()) out[py::str(k)] = to_python(v);
      return std::move(out);
    }
    default: throw py::type_error("Terra: no Python value for this JSON");
  }
}

Graph& graph_at(const std::string& name) {
  auto& graphs = R().graphs();
  auto it = graphs.find(name);
  if (it == graphs.end()) throw py::key_error("no Terra graph named " + name);
  return *it->second;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Terra engine (imperative-symbolic co-execution for PyTorch)";
  m.attr("__version__") = terra::version();
  PythonRunner::install_dispatch_hook();

  m.def("enter", [](const std::string& name, int depth, py::object stop_code) {
    terra::runtime::PythonStack::Root root;
    if (stop_code.is_none()) {
      root.frame = terra::runtime::PythonStack::current_frame();
      for (int i = 0; i < depth && root.frame; ++i)
        root.frame = terra::runtime::PythonStack::caller(root.frame);
    } else {
      root.stop_code = stop_code.ptr();  // the caller keeps the code object alive
    }
    R().enter(graph_named(name), root);
  }, py::arg("name"), py::arg("depth") = 0, py::arg("stop_code") = py::none(),
        "Starts co-execution on this thread. Ops are keyed by the call stack up to the frame "
        "`depth` levels above the caller's, or, with `stop_code`, up to (not including) the "
        "first frame running that code object.");
  m.def("exit", [] { R().exit(); }, "Ends co-execution: waits for the GraphRunner, makes every "
        "placeholder a real tensor, raises a pending GraphRunner error.");
  // Called at every loop iteration boundary (terra/_loops.py marks): a plain METH_O function, not
  // a pybind11 one, whose argument parsing cost as much as a small op's.
  static PyMethodDef mark_def{"mark", &mark, METH_O, "An iteration boundary (a loop's id)."};
  m.add_object("mark", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&mark_def, nullptr, m.ptr())));
  static PyMethodDef mark_helper_def{"mark_helper", &mark_helper, METH_O,
                                     "An iteration boundary of a helper function's loop."};
  m.add_object("mark_helper",
               py::reinterpret_steal<py::object>(PyCFunction_NewEx(&mark_helper_def, nullptr, m.ptr())));
  m.def("active", [] { return R().active(); });
  m.def("set_type_attribute", [](py::type type, const std::string& name, py::object value) {
    // An attribute of a type Python refuses to change (a C type marked immutable, such as
    // torch.Generator): put into its dictionary directly, the method cache told.
    auto* t = reinterpret_cast<PyTypeObject*>(type.ptr());
    if (PyDict_SetItemString(t->tp_dict, name.c_str(), value.ptr()) != 0) throw py::error_already_set();
    PyType_Modified(t);
  }, "Sets `type.name = value` where Python refuses to (an immutable C type).");
  m.def("mode", [] { return std::string(R().mode_name()); });
  m.def("sync", [] { R().sync(); }, "Waits until the GraphRunner has executed every issued op.");
  m.def("kept_result_bytes", [] { return terra::runtime::KeptResults::total_bytes(); },
        "Bytes of the results replayed kernels keep to write into again, the process's (runtime/out_form.h).");
  m.def("runner_counts", [] {
    auto& r = R().runner();
    nlohmann::json j = replay_json(r.replay_counts());
    j["ops_autograd"] = r.ops_autograd();
    j["ops_below_autograd"] = r.ops_below_autograd();
    j["values_released_early"] = r.values_released_early();
    j["verdict_cache"] = terra::runtime::Verdicts::process().path();
    j["verdicts_loaded"] = terra::runtime::Verdicts::process().loaded();
    j["payoff_cache"] = terra::runtime::PayoffMemory::process().path();
    j["payoff_choices_loaded"] = terra::runtime::PayoffMemory::process().loaded();
    return to_python(j);
  }, "ATen ops the GraphRunner executed through autograd and below it, what block replay did "
        "(iterations, items and kernels replayed, blocks recorded and refused), and how many values "
        "it dropped right after their last reader ran, since the process started; the one-thread "
        "verdict cache file (verdict_cache, \"\" when off) and how many verdicts it held when read; "
        "the payoff check's choices' cache file (payoff_cache) and how many choices it held.");
  m.def("allocator_counts", [] {
    if (!terra::runtime::RunnerAllocator::installed()) return py::dict();
    const auto st = terra::runtime::RunnerAllocator::install().stats();
    py::dict d;
    d["hits"] = st.hits;
    d["misses"] = st.misses;
    d["cached_bytes"] = st.cached_bytes;
    d["cached_sizes"] = st.cached_sizes;
    d["program_min_bytes"] = terra::runtime::RunnerAllocator::kProgramMinBytes;
    d["idle_budget_bytes"] = terra::runtime::RunnerAllocator::kIdleCachedBytes;
    return d;
  }, "Terra's caching CPU allocator (runner_allocator.h): blocks handed out from its cache (hits) "
        "and freshly allocated (misses) since the process started, the bytes it caches now and "
        "their size classes, the smallest block the program thread takes from it and what it "
        "keeps between sessions at most; empty before it is installed.");
  m.def("materialize", [](py::object t) {
    R().materialize(t.ptr());
    if (PyErr_Occurred()) throw py::error_already_set();
  },
        "Makes a placeholder an ordinary tensor (waits for its value).");
  m.def("version", [](const at::Tensor& t) {
    R().await_writes(t);
    return t._version();
  }, "`t._version` while Terra is active: an ordinary tensor's once the in-place ops issued to it "
     "have run (the GraphRunner bumps its counter), as eager execution shows it.");
  m.def("placeholder_state", [](const at::Tensor& t) -> std::string {
    const auto* p = terra::runtime::as_placeholder(t);
    if (!p) return "tensor";
    return p->slot() ? "placeholder" : "kept";
  }, "What a tensor is to Terra: an ordinary 'tensor', a 'placeholder' the GraphRunner fills, or a "
     "dropped placeholder 'kept' to be handed out again (placeholder.h: PlaceholderPool), which the "
     "program can never reach.");
  m.def("expose", [](const at::Tensor& t) { return R().expose(t); },
        "A NumPy array now shares t's memory: ops read it when issued until unexpose(key).");
  m.def("unexpose", [](uintptr_t key) { R().unexpose(key); });
  m.def("clear_autocast_cache", [] { R().clear_autocast_cache(); },
        "torch.clear_autocast_cache while Terra is active: also the GraphRunner's, in order.");
  m.def("set_file_label", [](py::object fn) {
    if (fn.is_none()) {
      R().set_file_label({});
      return;
    }
    // One holder for the process's life (the runner is never destroyed, and no Python object
    // may be released at exit without the GIL); a new function replaces the one it holds.
    static auto* held = new py::object();
    *held = std::move(fn);
    R().set_file_label([](const std::string& file) -> std::string {
      py::object r = (*held)(file);
      return r.is_none() ? std::string() : r.cast<std::string>();
    });
  }, "How GraphRunner errors name a source file: fn(filename) -> label or None.");
  m.def("pause", [] { R().pause(); });
  m.def("resume", [] { R().resume(); });
  m.def("barrier", [](const std::string& reason, const std::string& what) { R().barrier(reason, what); });
  m.def("opaque_begin", [](const std::string& reason, const std::string& what) { R().opaque_begin(reason, what); });
  m.def("opaque_end", [] { R().opaque_end(); });
  m.def("backward", &backward);
  static PyMethodDef grad_get_def{"grad_get", &grad_get, METH_O, "Tensor.grad while co-executing."};
  m.add_object("grad_get", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&grad_get_def, nullptr, m.ptr())));
  m.def("grad_set", &grad_set);
  {
    py::dict base = py::module_::import("torch").attr("_C").attr("TensorBase").attr("__dict__");
    grad_fn_descriptor = py::object(base["grad_fn"]).release().ptr();
    is_leaf_descriptor = py::object(base["is_leaf"]).release().ptr();
    base_descriptor = py::object(base["_base"]).release().ptr();
    static PyMethodDef base_def{"base_get", &base_get, METH_O, "Tensor._base while a session is open."};
    m.add_object("base_get", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&base_def, nullptr, m.ptr())));
    m.def("is_placeholder_view", [](py::handle t) { return placeholder_view_base(t.ptr()) != nullptr; },
          "Whether a tensor is a placeholder made by a view op that eager makes an autograd view.");
    static PyMethodDef grad_fn_def{"grad_fn_get", &grad_fn_get, METH_O, "Tensor.grad_fn while a session is open."};
    static PyMethodDef is_leaf_def{"is_leaf_get", &is_leaf_get, METH_O, "Tensor.is_leaf while a session is open."};
    m.add_object("grad_fn_get", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&grad_fn_def, nullptr, m.ptr())));
    m.add_object("is_leaf_get", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&is_leaf_def, nullptr, m.ptr())));
  }
  m.def("settings", [] {
    py::list out;
    for (const terra::Policy::Setting& s : R().policy().settings()) {
      py::dict d;
      d["key"] = s.key;
      d["kind"] = terra::Policy::name(s.kind);
      d["value"] = s.value;
      d["help"] = s.help;
      d["env"] = s.env;
      out.append(std::move(d));
    }
    return out;
  }, "Every engine setting (terra/policy.h): key, kind, value as text, help, the variable that sets its default.");
  m.def("configure", [](const std::string& text) {
    if (std::string error = R().policy().configure(text); !error.empty()) throw py::value_error(error);
    R().settings_changed();
  }, "Applies 'key=value ...' settings, all or none; ValueError says what was wrong.");
  m.def("set_eager_hold_switch", [](py::function hold) {
    R().set_eager_hold_switch([hold](bool held) { hold(held); });
  }, "The function that takes the session's pass-through entry points out while a loop runs "
     "eagerly (True) and puts them back (False): terra/_patches.py eager_hold.");
  m.def("set_fast_path_functions", &terra::python::set_fast_path_functions,
        "Puts the fast path of torch functions in (True) or takes it out, keeping every function "
        "object as it is (python/fast_path.h); after fast_path_entries.");
  m.def("fast_path_functions_on", &terra::python::fast_path_functions_on,
        "Whether the torch functions' fast path is in.");
  m.def("fast_path_entries", &terra::python::fast_path_entries,
        "(owner, name, replacement) for each Tensor method of the C fast path (python/fast_path.cpp).");
  m.def("graphs", [] {
    py::list names;
    for (auto& [name, g] : R().graphs()) names.append(name);
    return names;
  });
  m.def("stats", [](const std::string& name) { return to_python(stats_with_replay(graph_at(name))); });
  m.def("graph_json", [](const std::string& name) {
    const Graph& g = graph_at(name);
    nlohmann::json j = to_json(g);
    j["stats"] = stats_with_replay(g);
    return to_python(j);
  },
        "The graph for viewers: nodes, edges, blocks, switch-cases, last path, fallbacks, stats.");
  m.def("timeline", [](uint64_t last) {
    py::list out;
    auto spans = terra::runtime::Timeline::instance().spans();
    uint64_t newest = 0;
    for (const auto& s : spans) newest = std::max(newest, s.iteration);
    const uint64_t oldest = last && newest > last ? newest - last + 1 : 0;
    for (const terra::runtime::Span& s : spans) {
      if (s.iteration < oldest) continue;
      py::dict d;
      d["lane"] = terra::runtime::to_string(s.lane);
      d["kind"] = terra::runtime::to_string(s.kind);
      d["start_ns"] = s.start_ns;
      d["end_ns"] = s.end_ns;
      d["iteration"] = s.iteration;
      d["boundary"] = s.boundary;
      const auto& timeline = terra::runtime::Timeline::instance();
      d["graph"] = timeline.name(s.graph);
      d["detail"] = s.lane == terra::runtime::Lane::Graph
                        ? std::to_string(s.ops) + " ops, " + std::to_string(s.busy_ns / 1000) + " us executing"
                        : timeline.detail(s.detail);
      if (s.lane == terra::runtime::Lane::Graph) {
        d["ops"] = s.ops;
        d["busy_ns"] = s.busy_ns;
      }
      out.append(d);
    }
    return out;
  }, py::arg("last") = 0,
     "Recent timeline spans of both lanes by start time (steady-clock ns); with `last`, only those "
     "of the newest `last` iterations.");
  m.def("runner_busy_ns", [] { return R().runner_busy_ns(); },
        "Nanoseconds the GraphRunner has spent executing items since it started (idle spinning "
        "not included).");
  m.def("clear_timeline", [] { terra::runtime::Timeline::instance().clear(); });
  m.def("fallbacks", [](const std::string& name) {
    auto& graphs = R().graphs();
    auto it = graphs.find(name);
    return it == graphs.end() ? py::object(py::list()) : to_python(fallbacks_json(*it->second));
  });
  m.def("reset", [](py::object name) {
    R().drop_graphs(name.is_none() ? std::nullopt : std::optional<std::string>(name.cast<std::string>()));
  }, py::arg("name") = py::none());
}
