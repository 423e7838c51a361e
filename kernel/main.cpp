// terra-kernel: starts the embedded Python of the venv the kernel is installed in, then serves the
// Jupyter protocol with xeus until a shutdown_request.
//
// Usage (from the kernel spec): terra-kernel -f CONNECTION_FILE
#include <Python.h>  // first: it sets feature macros the system headers must see

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "pybind11/embed.h"
#include "terra/version.h"
#include "xeus-python/xdebugger.hpp"
#include "xeus-python/xutils.hpp"
#include "xeus/xeus_context.hpp"
#include "xeus/xhelper.hpp"
#include "xeus/xkernel.hpp"
#include "xeus/xkernel_configuration.hpp"
#include "zmq.hpp"

#include "history_manager.hpp"
#include "interrupt.hpp"
#include "server.hpp"
#include "terra_interpreter.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace {

// The interpreter is Debian's Python 3.11, but sys.prefix must be the venv's so its site-packages
// (torch, ipywidgets, terra) are found: Python derives the prefix from program_name through the
// venv's pyvenv.cfg. The venv's `python` sits beside the installed executable.
std::string venv_python() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path beside = self.parent_path() / "python";
    if (fs::exists(beside, error)) return beside.string();
  }
  return TERRA_KERNEL_DEFAULT_PYTHON;
}

void start_python(const std::string& program, char* argv0) {
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.parse_argv = 0;               // argv is not a Python command line
  config.install_signal_handlers = 1;  // PyErr_SetInterrupt needs Python's SIGINT handler
  PyConfig_SetBytesString(&config, &config.program_name, program.c_str());
  // sys.argv is just the executable: IPython's application would read "-f FILE" as its own.
  const char* const python_argv[] = {argv0};
  // Deliberately leaked: the server ends the process with std::exit, and finalising Python while
  // other threads still run would be worse than not finalising it.
  new py::scoped_interpreter(&config, 1, python_argv, /*add_program_dir_to_path=*/false);
}

}  // namespace

int main(int argc, char* argv[]) {
  // Before any thread or ZeroMQ context exists, so that all of them inherit the mask.
  terra::kernel::block_interrupts();

  if (xeus::should_print_version(argc, argv)) {
    std::cout << "terra-kernel " << terra::version() << std::endl;
    return 0;
  }
  const std::string connection_file = xpyt::extract_parameter("-f", argc, argv);
  if (connection_file.empty()) {
    std::cerr << "usage: terra-kernel -f CONNECTION_FILE (Jupyter passes it through the terra "
                 "kernel spec)"
              << std::endl;
    return 2;
  }
  // Launched by Jupyter: stay quiet, the server may have dropped our std streams.
  if (std::getenv("JPY_PARENT_PID") != nullptr) std::clog.setstate(std::ios_base::failbit);

  const std::string python = venv_python();
  start_python(python, argv[0]);
  terra::kernel::start_interrupt_watcher();

  const char* history_file = std::getenv("TERRA_HISTORY_FILE");
  auto history = std::make_unique<terra::kernel::history_manager>(
      history_file && *history_file ? history_file
                                    : terra::kernel::history_manager::default_path());
  auto interpreter = std::make_unique<terra::kernel::terra_interpreter>(*history);

  try {
    // The debugger (debugpy) runs in the kernel's own Python.
    const nl::json debugger_config = {{"python", python}};
    xeus::xkernel kernel(xeus::load_configuration(connection_file), xeus::get_user_name(),
                         xeus::make_context<zmq::context_t>(), std::move(interpreter),
                         terra::kernel::make_server, std::move(history), nullptr,
                         xpyt::make_python_debugger, debugger_config);
    std::clog << "terra-kernel " << terra::version() << " started (" << python << ", "
              << connection_file << ")" << std::endl;
    kernel.start();  // returns only through std::exit
  } catch (const std::exception& e) {
    std::cerr << "terra-kernel: cannot start with " << connection_file << ": " << e.what()
              << std::endl;
    return 1;
  }
  return 0;
}
