#include "python_stack.h"

#include <algorithm>

#include "terra/location_key.h"

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

#include <array>
#include <unordered_map>

namespace terra::runtime {

namespace {

uint64_t hash_bytes(const char* p, size_t n, uint64_t h) {
  return terra::hash_combine(h, terra::hash_bytes(std::string_view(p, n)));
}

uint64_t hash_object(PyObject* o, uint64_t h, int depth = 0) {
  // Content hash of the constants and names of a code object (deterministic across runs, unlike
  // PyObject_Hash for strings, which is salted).
  if (depth > 4) return terra::hash_combine(h, 1);
  if (PyUnicode_Check(o)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s) { PyErr_Clear(); return terra::hash_combine(h, 2); }
    return hash_bytes(s, static_cast<size_t>(n), terra::hash_combine(h, 3));
  }
  if (PyBytes_Check(o)) return hash_bytes(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o), terra::hash_combine(h, 4));
  if (PyTuple_Check(o)) {
    h = terra::hash_combine(h, 5 + static_cast<uint64_t>(PyTuple_GET_SIZE(o)));
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
  if (PyFrozenSet_Check(o)) {
    // `x in {"a", "b"}` compiles to a frozenset, whose order (and repr) follows the salted string
    // hashes: its members' hashes are summed, in any order (rl_cartpole's Adam step had one of two
    // keys from one process to the next).
    uint64_t sum = 0;
    PyObject* it = PyObject_GetIter(o);
    if (!it) { PyErr_Clear(); return terra::hash_combine(h, 8); }
    while (PyObject* member = PyIter_Next(it)) {
      sum += hash_object(member, 9, depth + 1);
      Py_DECREF(member);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) PyErr_Clear();
    return terra::hash_combine(terra::hash_combine(h, 10 + static_cast<uint64_t>(PySet_GET_SIZE(o))), sum);
  }
  PyObject* r = PyObject_Repr(o);  // numbers, None, Ellipsis
  if (!r) { PyErr_Clear(); return terra::hash_combine(h, 6); }
  h = hash_object(r, terra::hash_combine(h, 7), depth + 1);
  Py_DECREF(r);
  return h;
}

struct CodeInfo {
  uint64_t hash = 0;
  // Code unit index -> index of the instruction it belongs to. The interpreter's frame points at
  // the unit before the next instruction, which moves into inline caches once a call site is
  // specialised; normalising to the instruction keeps a call site's position stable.
  std::vector<uint32_t> start;
  // For describe: the code's file and qualified name, and the source line of each code-unit
  // offset asked for. PyCode_Addr2Line walks the line table from its start at every call: with
  // up to 8 frames per new node, 4% of a first traced iteration's time (bench/first_trace.py).
  std::string file, function;
  mutable std::unordered_map<int, int> lines;
};

// Number of inline cache units after each opcode, from the interpreter's own `opcode` module, and
// the opcode of PRECALL (Python 3.11 only; -1 elsewhere): a specialised PRECALL makes the call
// itself, an unspecialised one leaves it to the CALL that follows, so the two are one position.
int precall_opcode = -1;

const std::vector<int>& cache_entries() {
  static std::vector<int> entries = [] {
    std::vector<int> out(256, 0);
    PyObject* mod = PyImport_ImportModule("opcode");
    PyObject* opmap = mod ? PyObject_GetAttrString(mod, "opmap") : nullptr;
    PyObject* precall = opmap ? PyDict_GetItemString(opmap, "PRECALL") : nullptr;
    if (precall) precall_opcode = static_cast<int>(PyLong_AsLong(precall));
    Py_XDECREF(opmap);
    PyObject* list = mod ? PyObject_GetAttrString(mod, "_inline_cache_entries") : nullptr;
    if (list && PySequence_Check(list)) {
      for (Py_ssize_t i = 0; i < PySequence_Size(list) && i < 256; ++i) {
        PyObject* v = PySequence_GetItem(list, i);
        out[static_cast<size_t>(i)] = v ? static_cast<int>(PyLong_AsLong(v)) : 0;
        Py_XDECREF(v);
      }
    }
    Py_XDECREF(list);
    Py_XDECREF(mod);
    PyErr_Clear();
    return out;
  }();
  return entries;
}

std::vector<uint32_t> instruction_starts(PyCodeObject* code) {
  std::vector<uint32_t> start;
  PyObject* bytes = PyCode_GetCode(code);  // de-specialised bytecode
  if (!bytes) {
    PyErr_Clear();
    return start;
  }
  const auto* units = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(bytes));
  const size_t n = static_cast<size_t>(PyBytes_GET_SIZE(bytes)) / 2;
  start.resize(n);
  const int extended_arg = 144;
  size_t i = 0;
  while (i < n) {
    size_t first = i;
    while (i < n && units[2 * i] == extended_arg) ++i;
    size_t end = i + 1 + (i < n ? static_cast<size_t>(cache_entries()[units[2 * i]]) : 0);
    if (i < n && units[2 * i] == precall_opcode && end < n)  // and the CALL after it
      end += 1 + static_cast<size_t>(cache_entries()[units[2 * end]]);
    for (size_t k = first; k < end && k < n; ++k) start[k] = static_cast<uint32_t>(first);
    i = end;
  }
  Py_DECREF(bytes);
  return start;
}

// Code object -> content hash, per thread (only the thread that runs the program under Terra walks
// its stack, so no lock is needed). Entries hold a strong reference so an address is never reused
// while cached; the map is never destroyed, since that would need the GIL at thread exit.
std::unordered_map<const PyCodeObject*, CodeInfo>& cache() {
  thread_local auto* m = new std::unordered_map<const PyCodeObject*, CodeInfo>();
  return *m;
}

// In front of the map, per thread: a direct-mapped table of the code objects met last, so a
// frame costs a load and a compare rather than a hash-table lookup (two per frame of every op:
// 4% of the program thread's time on a 1x1 add chain, more with a model's deep stacks). Entries
// point into the map, whose nodes never move; cleared with it (clear_cache).
struct RecentCode {
  const PyCodeObject* code = nullptr;
  const CodeInfo* info = nullptr;
};
constexpr size_t kRecentCodes = 256;
std::array<RecentCode, kRecentCodes>& recent() {
  thread_local std::array<RecentCode, kRecentCodes> table{};
  return table;
}

const CodeInfo& code_info_slow(PyCodeObject* code);

const CodeInfo& code_info(PyCodeObject* code) {
  // Code objects are at least 16-byte aligned; the bits above that pick the entry.
  RecentCode& r = recent()[(reinterpret_cast<uintptr_t>(code) >> 4) % kRecentCodes];
  if (r.code == code) return *r.info;
  const CodeInfo& info = code_info_slow(code);
  r = RecentCode{code, &info};
  return info;
}

const CodeInfo& code_info_slow(PyCodeObject* code) {
  auto it = cache().find(code);
  if (it != cache().end()) return it->second;
  PyGILState_STATE gil = PyGILState_Ensure();
  CodeInfo info;
  info.hash = hash_object(reinterpret_cast<PyObject*>(code), 0xcbf29ce484222325ULL);
  info.start = instruction_starts(code);
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* function = PyUnicode_AsUTF8(code->co_qualname);
  if (!file || !function) PyErr_Clear();
  info.file = file ? file : "?";
  info.function = function ? function : "?";
  auto [pos, added] = cache().emplace(code, std::move(info));
  if (added) Py_INCREF(code);
  PyGILState_Release(gil);
  return pos->second;
}

uint32_t instruction_of(const CodeInfo& info, int offset) {
  if (offset < 0) return 0;
  auto k = static_cast<size_t>(offset);
  return k < info.start.size() ? info.start[k] : static_cast<uint32_t>(k);
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

// A frame alone, as PythonStack::innermost keys it: its code's content and its instruction.
uint64_t frame_key(const CodeInfo& info, uint32_t instruction) {
  return terra::hash_combine(info.hash, instruction);
}

}  // namespace

uint64_t PythonStack::hash(const Root& root, uint64_t* innermost) {
  uint64_t h = 0x84222325cbf29ce4ULL;
  if (innermost) *innermost = 0;
  for (_PyInterpreterFrame* f = top_frame(); f; f = f->previous) {
    if (skip(f)) continue;
    if (f->f_code == root.stop_code) break;
    const CodeInfo& info = code_info(f->f_code);
    const uint32_t instruction = instruction_of(info, offset_of(f));
    if (innermost && *innermost == 0) *innermost = frame_key(info, instruction);
    h = terra::hash_combine(terra::hash_combine(h, info.hash), instruction);
    if (f == root.frame) break;
  }
  return h;
}

uint64_t PythonStack::innermost(const Root& root) {
  for (_PyInterpreterFrame* f = top_frame(); f; f = f->previous) {
    if (skip(f)) continue;
    if (f->f_code == root.stop_code) return 0;
    const CodeInfo& info = code_info(f->f_code);
    return frame_key(info, instruction_of(info, offset_of(f)));
  }
  return 0;
}

std::vector<terra::SourceFrame> PythonStack::describe(const Root& root, size_t max_frames) {
  std::vector<terra::SourceFrame> out;
  out.reserve(max_frames);
  PyGILState_STATE gil = PyGILState_Ensure();
  for (_PyInterpreterFrame* f = top_frame(); f && out.size() < max_frames; f = f->previous) {
    if (skip(f)) continue;
    if (f->f_code == root.stop_code) break;
    const CodeInfo& info = code_info(f->f_code);
    const int offset = offset_of(f);
    auto [line, added] = info.lines.try_emplace(offset, 0);
    if (added) line->second = PyCode_Addr2Line(f->f_code, offset * static_cast<int>(sizeof(_Py_CODEUNIT)));
    out.push_back(terra::SourceFrame{info.file, line->second, info.function});
    if (f == root.frame) break;
  }
  PyGILState_Release(gil);
  std::reverse(out.begin(), out.end());
  return out;
}

const void* PythonStack::current_frame() { return top_frame(); }

const void* PythonStack::caller(const void* frame) {
  auto* f = static_cast<const _PyInterpreterFrame*>(frame)->previous;
  while (f && skip(f)) f = f->previous;
  return f;
}

void PythonStack::clear_cache() {
  for (auto& [code, info] : cache()) Py_DECREF(const_cast<PyCodeObject*>(code));
  cache().clear();
  recent().fill(RecentCode{});
}

}  // namespace terra::runtime
