// Interrupts: SIGINT raises KeyboardInterrupt in the user's code of the cell that is running when
// it arrives, and does nothing at all to a kernel that is idle, nor to the cell that runs next.
//
// xeus 2.4 cannot take a signal while idle (its zmq::poll throws on EINTR and the kernel exits),
// so no thread may ever receive SIGINT asynchronously. The scheme:
//   - block_interrupts() blocks SIGINT (and the wake-up signal below) in the main thread before any
//     other thread or ZeroMQ context exists, so every thread inherits the mask;
//   - start_interrupt_watcher() starts one thread that waits for a SIGINT to be pending (on a
//     signalfd) and consumes it only while holding the lock that orders it against cells starting
//     and ending, so it counts for the cell that was running when it arrived;
//   - an interrupt_window spans a cell's execution on the main thread. Opening one discards a
//     SIGINT still pending from before the cell; one that lands after the cell ended is discarded
//     when the window closes: KeyboardInterrupt never escapes into a later cell;
//   - inside the window, the Python side (terra_kernel.interrupts, through the embedded module
//     `_terra_kernel_interrupts`) marks the user's code (IPython's run_code) and the kernel's own
//     sections inside it (opening a Terra session). A SIGINT while the user's code runs sends the
//     main thread a wake-up signal whose handler trips Python's interrupt flag
//     (PyErr_SetInterrupt) and, by interrupting a blocking call (time.sleep, a lock, a socket)
//     with EINTR, makes Python raise KeyboardInterrupt at once; the wake-up is sent again until
//     Python has acted on it, for the one that lands just before a blocking call starts. A SIGINT
//     while the kernel's own code runs (IPython's bookkeeping, the pre/post-cell hooks, a Terra
//     session opening) waits and is raised where the user's code starts or resumes, so the
//     kernel's state is never left half-changed and the cell never runs on as if not interrupted.
// Processes forked from the kernel get the mask the kernel started with back.
#pragma once

namespace terra::kernel {

// Call first thing in main(), before any thread exists.
void block_interrupts();

// Starts the watcher thread (detached: the server ends the process with std::exit).
void start_interrupt_watcher();

// Marks the main thread as running a cell. Construct and destroy on the main thread, with the
// Python interpreter initialised.
class interrupt_window {
 public:
  interrupt_window();
  ~interrupt_window();
  interrupt_window(const interrupt_window&) = delete;
  interrupt_window& operator=(const interrupt_window&) = delete;
};

}  // namespace terra::kernel
