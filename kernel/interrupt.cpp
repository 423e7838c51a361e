// Python.h first: it sets feature macros the system headers must see.
#include <Python.h>

#include "interrupt.hpp"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <mutex>
#include <thread>

#include "pybind11/embed.h"

namespace py = pybind11;

namespace terra::kernel {
namespace {

// Everything below but the atomics is guarded by g_mutex, and so is every read of g_sigint_fd: a
// SIGINT is only ever consumed by someone who knows what the main thread is running.
std::mutex g_mutex;
bool g_in_cell = false;  // an interrupt_window is open
int g_user_code = 0;     // nesting of user-code sections in the cell
int g_kernel_code = 0;   // nesting of kernel sections inside those
bool g_held = false;     // an interrupt of this cell waits for its user code to run
int g_kicks_left = 0;    // wake-ups still to send while Python has not taken the interrupt
bool g_sections = false;  // the Python side marks user code (until it does, all of a cell is)

std::atomic<bool> g_interrupt_requested{false};  // set by the watcher, consumed on the main thread
pthread_t g_main_thread;  // the thread that runs cells (and initialised Python)
sigset_t g_startup_mask;  // restored in forked children
int g_sigint_fd = -1;     // signalfd: readable while a SIGINT is pending, reading consumes it

// Re-sent wake-ups: after 20 ms, then twice as long each time, 6 in all (about 1.3 s).
constexpr int kFirstKickMs = 20;
constexpr int kKicks = 6;

// A real-time signal nobody else in the process uses; only ever sent to the main thread.
int wake_signal() { return SIGRTMIN + 2; }

bool deliverable() { return g_in_cell && g_user_code > 0 && g_kernel_code == 0; }

// Runs on the main thread. Tripping Python's flag from here rather than from the watcher matters:
// CPython 3.11 only arms the eval loop's check when the flag is set from the main thread, so a
// pure-Python busy loop would never see a flag set elsewhere. Installed without SA_RESTART, the
// signal also makes a blocked system call return EINTR, after which Python checks the flag.
// A wake-up that finds no request (a late one, or a re-sent one) only does the latter.
void on_wake(int) {
  if (g_interrupt_requested.exchange(false)) PyErr_SetInterrupt();  // both async-signal-safe
}

sigset_t sigint_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  return set;
}

sigset_t wake_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, wake_signal());
  return set;
}

void restore_mask_in_child() { pthread_sigmask(SIG_SETMASK, &g_startup_mask, nullptr); }

// Consumes the pending SIGINT, if any (they do not queue: at most one is pending). Call with
// g_mutex held.
bool take_pending_sigint() {
  signalfd_siginfo info;
  bool taken = false;
  while (read(g_sigint_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) taken = true;
  return taken;
}

// Waits for a SIGINT to be pending without consuming it, then consumes it under the lock. That is
// what ties an interrupt to the cell that was running when it arrived, however late this thread
// gets scheduled: a SIGINT still pending when a window opens arrived before that cell started,
// and the window consumes it, so one found here while a window is open arrived inside it.
// (Consuming first, with sigwait, and looking at the window afterwards gave a SIGINT sent while
// the kernel was idle to the next cell whenever that cell started before this thread ran.)
//
// A wake-up that lands after the main thread's last check of Python's flag but before a blocking
// call starts (time.sleep about to sleep) interrupts nothing, and the flag is not looked at again
// until that call returns. So the wake-up is sent again, with growing intervals, until Python has
// taken the interrupt (keyboard_interrupt() ran) or the user code is no longer running.
void watch_interrupts() {
  pollfd pending = {g_sigint_fd, POLLIN, 0};
  int interval_ms = kFirstKickMs;
  for (;;) {
    int timeout_ms = -1;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_kicks_left > 0) timeout_ms = interval_ms;
    }
    const int ready = poll(&pending, 1, timeout_ms);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (ready > 0) {
      if (!take_pending_sigint() || !g_in_cell) continue;  // taken by a window, or idle: nothing
      if (!deliverable()) {
        g_held = true;  // the kernel's own code is running: the user's code gets it next
        continue;
      }
      g_interrupt_requested = true;
      g_kicks_left = kKicks;
      interval_ms = kFirstKickMs;
      pthread_kill(g_main_thread, wake_signal());
    } else if (ready == 0 && g_kicks_left > 0 && deliverable()) {
      --g_kicks_left;
      interval_ms *= 2;
      pthread_kill(g_main_thread, wake_signal());
    }
  }
}

// Python's SIGINT handler in the kernel: signal.default_int_handler, and the acknowledgement that
// ends the re-sent wake-ups. Runs on the main thread when Python acts on its interrupt flag.
void keyboard_interrupt(py::object /*signum*/, py::object /*frame*/) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_kicks_left = 0;
  }
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  throw py::error_already_set();
}

// The main thread has just stopped running user code: an interrupt on its way to Python (a
// wake-up not handled yet, or Python's flag tripped but not acted on) is taken back and held.
// Called without g_mutex (Python's handler takes it), with the GIL.
void hold_interrupt_in_flight() {
  bool in_flight = g_interrupt_requested.exchange(false);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    in_flight = in_flight || g_kicks_left > 0;
    g_kicks_left = 0;
  }
  if (PyErr_CheckSignals() != 0) {
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw py::error_already_set();
    PyErr_Clear();
    in_flight = true;
  }
  if (in_flight) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_in_cell) g_held = true;
  }
}

void raise_keyboard_interrupt() {
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  throw py::error_already_set();
}

void use_sections() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sections = true;
}

void enter_user_code() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!(g_in_cell && g_kernel_code == 0 && g_held)) {
      ++g_user_code;
      return;
    }
    g_held = false;
  }
  raise_keyboard_interrupt();  // instead of running any of it: the section is not entered
}

void leave_user_code() {
  bool was_deliverable = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    was_deliverable = deliverable();
    --g_user_code;
    if (deliverable()) return;
  }
  if (was_deliverable) hold_interrupt_in_flight();
}

void enter_kernel_code() {
  bool was_deliverable = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    was_deliverable = deliverable();
    ++g_kernel_code;
  }
  if (was_deliverable) hold_interrupt_in_flight();
}

void leave_kernel_code() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    --g_kernel_code;
    if (!(deliverable() && g_held)) return;
    g_held = false;
  }
  raise_keyboard_interrupt();  // in the user's code, right where the kernel section was entered
}

}  // namespace

void block_interrupts() {
  g_main_thread = pthread_self();
  sigset_t blocked = sigint_set();
  sigaddset(&blocked, wake_signal());
  pthread_sigmask(SIG_BLOCK, &blocked, &g_startup_mask);
  pthread_atfork(nullptr, nullptr, restore_mask_in_child);
  const sigset_t sigint = sigint_set();
  g_sigint_fd = signalfd(-1, &sigint, SFD_NONBLOCK | SFD_CLOEXEC);
  // A server started in the background (`jupyter lab &`, nohup) hands its kernels SIGINT ignored,
  // and an ignored signal is discarded even while blocked: signalfd would never see an interrupt.
  // SIGINT is blocked in every thread from here on, so the default action never runs.
  struct sigaction current = {};
  if (sigaction(SIGINT, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) {
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
  }

  struct sigaction action = {};
  action.sa_handler = on_wake;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART, on purpose
  sigaction(wake_signal(), &action, nullptr);
}

void start_interrupt_watcher() {
  if (g_sigint_fd < 0) {
    std::cerr << "terra-kernel: signalfd failed, interrupts are ignored" << std::endl;
    return;
  }
  std::thread(watch_interrupts).detach();
}

interrupt_window::interrupt_window() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    take_pending_sigint();  // sent before this cell started (while idle): it means nothing
    g_in_cell = true;
    g_user_code = g_sections ? 0 : 1;
    g_kernel_code = 0;
    g_held = false;
    g_kicks_left = 0;
  }
  const sigset_t wake = wake_set();
  pthread_sigmask(SIG_UNBLOCK, &wake, nullptr);
}

interrupt_window::~interrupt_window() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_in_cell = false;
    g_held = false;
    g_kicks_left = 0;
  }
  // From here on the watcher sends no wake-up, and one still pending finds no request.
  g_interrupt_requested = false;
  const sigset_t wake = wake_set();
  pthread_sigmask(SIG_BLOCK, &wake, nullptr);

  // Discard an interrupt that arrived as the cell was finishing: run the pending handler now and
  // drop the KeyboardInterrupt it raises, instead of letting it surface in a later call.
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyErr_CheckSignals() != 0) PyErr_Clear();
  PyGILState_Release(gil);
}

}  // namespace terra::kernel

// The Python side (terra_kernel.interrupts) marks the user's code and the kernel's own sections
// in it, and installs keyboard_interrupt as Python's SIGINT handler.
PYBIND11_EMBEDDED_MODULE(_terra_kernel_interrupts, m) {
  m.doc() = "Where in a cell a Ctrl-C may surface (see kernel/interrupt.hpp).";
  m.def("use_sections", &terra::kernel::use_sections,
        "From now on only the marked user code of a cell can be interrupted.");
  m.def("enter_user_code", &terra::kernel::enter_user_code,
        "The cell's own code starts (IPython's run_code); raises KeyboardInterrupt instead if "
        "one came while the kernel prepared the cell.");
  m.def("leave_user_code", &terra::kernel::leave_user_code,
        "The cell's own code is done; an interrupt on its way waits for more of it.");
  m.def("enter_kernel_code", &terra::kernel::enter_kernel_code,
        "The kernel's own work starts inside the user's code: interrupts wait.");
  m.def("leave_kernel_code", &terra::kernel::leave_kernel_code,
        "The kernel's own work is done; raises the KeyboardInterrupt that waited.");
  m.def("keyboard_interrupt", &terra::kernel::keyboard_interrupt, py::arg("signum"),
        py::arg("frame"), "Python's SIGINT handler in the kernel: raises KeyboardInterrupt.");
}
