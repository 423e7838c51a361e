#include "terra_interpreter.hpp"

#include <exception>
#include <iostream>
#include <optional>
#include <utility>
#include <vector>

#include "pybind11/pybind11.h"
#include "terra/version.h"
#include "xeus-python/xeus_python_config.hpp"

#include "interrupt.hpp"

namespace py = pybind11;

// libxeus-python inlines pybind11 types in its headers: only the pybind11 it was built with works.
static_assert(PYBIND11_VERSION_MAJOR == 2 && PYBIND11_VERSION_MINOR == 10,
              "terra-kernel must be compiled with Debian's pybind11 2.10 (xeus-python's), not "
              "another copy (torch bundles pybind11 3.x): check the include path");

namespace terra::kernel {

terra_interpreter::terra_interpreter(history_manager& history) : m_history(history) {}

void terra_interpreter::configure_impl() {
  // Builds the IPython shell and releases the GIL.
  xpyt::interpreter::configure_impl();
  py::gil_scoped_acquire acquire;
  try {
    py::module_::import("terra_kernel").attr("load")(m_ipython_shell);
  } catch (const py::error_already_set& e) {
    // The kernel still runs Python without widgets or Terra's magics; the reason goes to the
    // server's log, which is where a kernel that failed to set up is looked at.
    std::cerr << "terra-kernel: terra_kernel.load() failed, widgets and %terra are unavailable:\n"
              << e.what() << std::endl;
  }
}

nl::json terra_interpreter::execute_request_impl(int execution_count, const std::string& code,
                                                 bool silent, bool store_history,
                                                 nl::json user_expressions, bool allow_stdin) {
  py::gil_scoped_acquire acquire;
  if (!silent) {
    // xeus counts every non-silent request; IPython only those stored in history. Keep In[n],
    // Out[n] and the history's line numbers equal to the [n] the frontend shows.
    m_ipython_shell.attr("execution_count") = execution_count;
  }
  nl::json reply;
  {
    interrupt_window window;
    reply = run_cell(execution_count, code, silent, store_history, std::move(user_expressions),
                     allow_stdin);
  }
  if (!silent && store_history) {
    record_history(execution_count, code);
  }
  return reply;
}

nl::json terra_interpreter::run_cell(int execution_count, const std::string& code, bool silent,
                                     bool store_history, nl::json user_expressions,
                                     bool allow_stdin) {
  std::string ename;
  std::string evalue;
  try {
    return xpyt::interpreter::execute_request_impl(execution_count, code, silent, store_history,
                                                   std::move(user_expressions), allow_stdin);
  } catch (py::error_already_set& e) {
    // For instance a KeyboardInterrupt that lands in IPython's own bookkeeping after the cell.
    ename = py::str(e.type().attr("__name__"));
    evalue = py::str(e.value());
  } catch (const std::exception& e) {
    ename = "KernelError";
    evalue = e.what();
  }
  const std::vector<std::string> traceback = {
      ename + ": " + evalue,
      "(raised by the kernel around the cell, not by the cell's own code; the kernel is fine)"};
  if (!silent) publish_execution_error(ename, evalue, traceback);
  return {{"status", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", traceback}};
}

void terra_interpreter::record_history(int execution_count, const std::string& code) {
  std::string source = code;
  std::optional<std::string> output;
  try {
    // IPython keeps the transformed cell and the result's repr of the run that just ended.
    py::object hist = m_ipython_shell.attr("history_manager");
    py::list parsed = hist.attr("input_hist_parsed");
    if (py::len(parsed) > 0) source = py::str(parsed[py::len(parsed) - 1]);
    py::object repr = hist.attr("output_hist_reprs").attr("get")(execution_count);
    if (!repr.is_none()) output = py::str(repr);
  } catch (py::error_already_set&) {
    // The raw cell is still worth storing.
  }
  m_history.record(execution_count, source, code, output);
}

nl::json terra_interpreter::kernel_info_request_impl() {
  nl::json info = xpyt::interpreter::kernel_info_request_impl();
  info["implementation"] = "terra";
  info["implementation_version"] = terra::version();
  // The Python that runs, not the headers libxeus-python was compiled with.
  const std::string full_version = Py_GetVersion();
  const std::string python_version = full_version.substr(0, full_version.find(' '));
  info["banner"] = std::string("Terra ") + terra::version() +
                   ": imperative PyTorch programs co-executed with symbolic graphs\n"
                   "Python " + python_version + ", IPython kernel by xeus-python " XPYT_VERSION;
  nl::json& language = info["language_info"];
  language["name"] = "python";
  language["version"] = python_version;
  language["pygments_lexer"] = "ipython3";
  language["codemirror_mode"] = {{"name", "ipython"}, {"version", 3}};
  language["nbconvert_exporter"] = "python";
  info["help_links"] = nl::json::array(
      {{{"text", "Python"}, {"url", "https://docs.python.org/3.11/"}},
       {{"text", "PyTorch"}, {"url", "https://pytorch.org/docs/stable/"}},
       {{"text", "xeus-python"}, {"url", "https://xeus-python.readthedocs.io"}}});
  return info;
}

void terra_interpreter::shutdown_request_impl() {
  m_history.end_session();
  xpyt::interpreter::shutdown_request_impl();
}

}  // namespace terra::kernel
