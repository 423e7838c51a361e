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

namespace terra::kernel {
namespace {

// Guards g_in_cell, and every read of g_sigint_fd: a SIGINT is only ever consumed by someone who
// knows whether a cell is running.
std::mutex g_mutex;
bool g_in_cell = false;      // true while an interrupt_window is open
std::atomic<bool> g_interrupt_requested{false};  // set by the watcher, consumed on the main thread
pthread_t g_main_thread;     // the thread that runs cells (and initialised Python)
sigset_t g_startup_mask;     // restored in forked children
int g_sigint_fd = -1;        // signalfd: readable while a SIGINT is pending, reading consumes it

// A real-time signal nobody else in the process uses; only ever sent to the main thread.
int wake_signal() { return SIGRTMIN + 2; }

// Runs on the main thread. Tripping Python's flag from here rather than from the watcher matters:
// CPython 3.11 only arms the eval loop's check when the flag is set from the main thread, so a
// pure-Python busy loop would never see a flag set elsewhere. Installed without SA_RESTART, the
// signal also makes a blocked system call return EINTR, after which Python checks the flag.
// A wake-up delivered late (at the next window's start) finds no request and does nothing.
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
void watch_interrupts() {
  pollfd pending = {g_sigint_fd, POLLIN, 0};
  for (;;) {
    if (poll(&pending, 1, -1) <= 0) continue;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!take_pending_sigint() || !g_in_cell) continue;  // taken by a window, or idle: nothing
    g_interrupt_requested = true;
    pthread_kill(g_main_thread, wake_signal());
  }
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
  }
  const sigset_t wake = wake_set();
  pthread_sigmask(SIG_UNBLOCK, &wake, nullptr);
}

interrupt_window::~interrupt_window() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_in_cell = false;
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
