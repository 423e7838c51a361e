#include "python_stack.h"

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

#include <unordered_map>

namespace terra::runtime {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64-style combine: cheap and well distributed.
  v += 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (v ^ (v >> 31));
}

uint64_t hash_bytes(const char* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ULL;
  return h;
}

uint64_t hash_object(PyObject* o, uint64_t h, int depth = 0) {
  // Content hash of the constants and names of a code object (deterministic across runs, unlike
  // PyObject_Hash for strings, which is salted).
  if (depth > 4) return mix(h, 1);
  if (PyUnicode_Check(o)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s) { PyErr_Clear(); return mix(h, 2); }
    return hash_bytes(s, static_cast<size_t>(n), mix(h, 3));
  }
  if (PyBytes_Check(o)) return hash_bytes(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o), mix(h, 4));
  if (PyTuple_Check(o)) {
    h = mix(h, 5 + static_cast<uint64_t>(PyTuple_GET_SIZE(o)));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i)
      h = hash_object(PyTuple_GET_ITEM(o, i), h, depth + 1);
    return h;
  }
  if (PyCode_Check(o)) {
    auto* c = reinterpret_cast<PyCodeObject*>(o);
    PyObject* code = PyCode_GetCode(c);
    if (code) { h = hash_object(code, h, depth + 1); Py_DECREF(code); } else { PyErr_Clear(); }
    h = hash_object(c->co_qualname, h, depth + 1);
    h = hash_object(c->co_names, h, depth + 1);
    return hash_object(c->co_consts, h, depth + 1);
  }
  PyObject* r = PyObject_Repr(o);  // numbers, None, frozensets of constants
  if (!r) { PyErr_Clear(); return mix(h, 6); }
  h = hash_object(r, mix(h, 7), depth + 1);
  Py_DECREF(r);
  return h;
}

// Code object -> content hash, per thread (only the thread that runs the program under Terra walks
// its stack, so no lock is needed). Entries hold a strong reference so an address is never reused
// while cached; the map is never destroyed, since that would need the GIL at thread exit.
std::unordered_map<const PyCodeObject*, uint64_t>& cache() {
  thread_local auto* m = new std::unordered_map<const PyCodeObject*, uint64_t>();
  return *m;
}

uint64_t code_hash(PyCodeObject* code) {
  auto it = cache().find(code);
  if (it != cache().end()) return it->second;
  PyGILState_STATE gil = PyGILState_Ensure();
  uint64_t h = hash_object(reinterpret_cast<PyObject*>(code), 0xcbf29ce484222325ULL);
  if (cache().emplace(code, h).second) Py_INCREF(code);
  PyGILState_Release(gil);
  return h;
}

_PyInterpreterFrame* top_frame() {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts || !ts->cframe) return nullptr;
  return ts->cframe->current_frame;
}

bool skip(const _PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030C0000
  if (f->owner == FRAME_OWNED_BY_CSTACK) return true;
#endif
  return _PyFrame_IsIncomplete(const_cast<_PyInterpreterFrame*>(f));
}

int offset_of(const _PyInterpreterFrame* f) {
  return static_cast<int>(f->prev_instr - _PyCode_CODE(f->f_code));
}

}  // namespace

uint64_t PythonStack::hash(const void* root) {
  uint64_t h = 0x84222325cbf29ce4ULL;
  for (_PyInterpreterFrame* f = top_frame(); f; f = f->previous) {
    if (skip(f)) continue;
    h = mix(mix(h, code_hash(f->f_code)), static_cast<uint64_t>(offset_of(f)));
    if (f == root) break;
  }
  return h;
}

std::vector<SourceFrame> PythonStack::describe(const void* root, size_t max_frames) {
  std::vector<SourceFrame> out;
  PyGILState_STATE gil = PyGILState_Ensure();
  for (_PyInterpreterFrame* f = top_frame(); f && out.size() < max_frames; f = f->previous) {
    if (skip(f)) continue;
    SourceFrame s;
    const char* file = PyUnicode_AsUTF8(f->f_code->co_filename);
    const char* fn = PyUnicode_AsUTF8(f->f_code->co_qualname);
    if (!file || !fn) PyErr_Clear();
    s.file = file ? file : "?";
    s.function = fn ? fn : "?";
    s.line = PyCode_Addr2Line(f->f_code, offset_of(f) * static_cast<int>(sizeof(_Py_CODEUNIT)));
    out.push_back(std::move(s));
    if (f == root) break;
  }
  PyGILState_Release(gil);
  return out;
}

const void* PythonStack::current_frame() { return top_frame(); }

const void* PythonStack::caller(const void* frame) {
  auto* f = static_cast<const _PyInterpreterFrame*>(frame)->previous;
  while (f && skip(f)) f = f->previous;
  return f;
}

void PythonStack::clear_cache() {
  for (auto& [code, h] : cache()) Py_DECREF(const_cast<PyCodeObject*>(code));
  cache().clear();
}

}  // namespace terra::runtime
