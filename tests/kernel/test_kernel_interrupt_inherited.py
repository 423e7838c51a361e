"""A kernel started by a server that ignores SIGINT (`jupyter lab &` from a script, nohup) inherits
SIGINT ignored; interrupts must still reach its cells."""
import signal
import time

from jupyter_client.manager import start_new_kernel

from kernel_helpers import KERNEL, execute, shell_reply, stdout, wait_for_stdout


def test_interrupt_reaches_a_kernel_started_with_sigint_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the kernel process
    try:
        km, kc = start_new_kernel(kernel_name=KERNEL, startup_timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(600)")
        wait_for_stdout(kc, msg_id, "sleeping")
        time.sleep(0.2)
        km.interrupt_kernel()
        reply = shell_reply(kc, msg_id)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        reply, messages = execute(kc, "print('alive')")
        assert reply["status"] == "ok" and stdout(messages) == "alive\n"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
