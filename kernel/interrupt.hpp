// Interrupts: SIGINT raises KeyboardInterrupt in the cell that is running when it arrives, and
// does nothing at all to a kernel that is idle, nor to the cell that runs next.
//
// xeus 2.4 cannot take a signal while idle (its zmq::poll throws on EINTR and the kernel exits),
// so no thread may ever receive SIGINT asynchronously. The scheme:
//   - block_interrupts() blocks SIGINT (and the wake-up signal below) in the main thread before any
//     other thread or ZeroMQ context exists, so every thread inherits the mask;
//   - start_interrupt_watcher() starts one thread that waits for a SIGINT to be pending (on a
//     signalfd) and consumes it only while holding the lock that orders it against cells starting
//     and ending;
//   - an interrupt_window spans a cell's execution on the main thread. Opening one discards a
//     SIGINT still pending from before the cell. SIGINT inside a window sends the main thread a
//     wake-up signal whose handler trips Python's interrupt flag (PyErr_SetInterrupt) and, by
//     interrupting a blocking call (time.sleep, a lock, a socket) with EINTR, makes Python raise
//     KeyboardInterrupt at once. The wake-up signal is unblocked on the main thread only inside a
//     window, and an interrupt that lands after the cell ended is discarded when the window
//     closes: KeyboardInterrupt never escapes into the kernel's own Python calls.
// Processes forked from the kernel get the mask the kernel started with back.
#pragma once

namespace terra::kernel {

// Call first thing in main(), before any thread exists.
void block_interrupts();

// Starts the sigwait thread (detached: the server ends the process with std::exit).
void start_interrupt_watcher();

// Marks the main thread as running user code. Construct and destroy on the main thread, with the
// Python interpreter initialised.
class interrupt_window {
 public:
  interrupt_window();
  ~interrupt_window();
  interrupt_window(const interrupt_window&) = delete;
  interrupt_window& operator=(const interrupt_window&) = delete;
};

}  // namespace terra::kernel
