// Python.h first: it sets feature macros the system headers must see.
#include <Python.h>

#include "interrupt.hpp"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace terra::kernel {
namespace {

std::mutex g_mutex;          // guards g_in_cell against the watcher thread
bool g_in_cell = false;      // true while an interrupt_window is open
std::atomic<bool> g_interrupt_requested{false};  // set by the watcher, consumed on the main thread
pthread_t g_main_thread;     // the thread that runs cells (and initialised Python)
sigset_t g_startup_mask;     // restored in forked children

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

void watch_interrupts() {
  const sigset_t set = sigint_set();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_in_cell) continue;  // idle: a SIGINT means nothing
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

  struct sigaction action = {};
  action.sa_handler = on_wake;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART, on purpose
  sigaction(wake_signal(), &action, nullptr);
}

void start_interrupt_watcher() { std::thread(watch_interrupts).detach(); }

interrupt_window::interrupt_window() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
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
