// The Terra interpreter: xeus-python's IPython-based interpreter with what this kernel adds.
//   - configure: loads the `terra_kernel` Python package (comm wiring for ipywidgets 8 and
//     anywidget, Terra's magics) into the shell;
//   - execute: runs each cell inside an interrupt_window, keeps IPython's execution count equal to
//     the one the frontend shows, turns any failure outside user code into an error reply (the
//     kernel never dies from a cell) and records the cell in the history store;
//   - kernel_info: names the kernel "terra" with its version; the language stays "python".
// No engine logic lives here.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "xeus-python/xinterpreter.hpp"

#include "history_manager.hpp"

namespace terra::kernel {

class terra_interpreter final : public xpyt::interpreter {
 public:
  explicit terra_interpreter(history_manager& history);

 private:
  void configure_impl() override;
  nl::json execute_request_impl(int execution_count, const std::string& code, bool silent,
                                bool store_history, nl::json user_expressions,
                                bool allow_stdin) override;
  nl::json kernel_info_request_impl() override;
  void shutdown_request_impl() override;

  // Runs the cell through xeus-python; any exception that escapes IPython becomes an error reply.
  nl::json run_cell(int execution_count, const std::string& code, bool silent,
                    bool store_history, nl::json user_expressions, bool allow_stdin);
  // Stores the cell just run (GIL held), with IPython's transformed source and result repr.
  void record_history(int execution_count, const std::string& code);

  history_manager& m_history;
};

}  // namespace terra::kernel
