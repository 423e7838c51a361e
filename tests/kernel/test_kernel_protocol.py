"""Protocol behaviour of the terra kernel through jupyter_client: interrupts, errors, stdin,
kernel_info, and the Python it embeds."""
import os
import signal
import time

from kernel_helpers import collect, drain, execute, shell_reply, stdout


def wait_busy(kc, msg_id, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "busy"):
            return
    raise AssertionError("the kernel never went busy")


def interrupt_cell(kernel, code):
    km, kc = kernel
    drain(kc)
    msg_id = kc.execute(code)
    wait_busy(kc, msg_id)
    time.sleep(0.3)  # let the cell get into its loop or system call
    started = time.monotonic()
    km.interrupt_kernel()
    reply = shell_reply(kc, msg_id, timeout=10)["content"]
    collect(kc, msg_id)
    return reply, time.monotonic() - started


def test_interrupt_blocking_call_raises_keyboard_interrupt(kernel):
    reply, latency = interrupt_cell(kernel, "import time; time.sleep(60)")
    assert reply["status"] == "error"
    assert reply["ename"] == "KeyboardInterrupt"
    assert latency < 5, "the interrupt must wake a blocking call, not wait for it"
    km, kc = kernel
    assert km.is_alive()
    reply, messages = execute(kc, "print('still here')")
    assert reply["status"] == "ok" and stdout(messages) == "still here\n"


def test_interrupt_busy_loop_raises_keyboard_interrupt(kernel):
    reply, _ = interrupt_cell(kernel, "n = 0\nwhile True:\n    n += 1")
    assert reply["ename"] == "KeyboardInterrupt"
    km, kc = kernel
    reply, messages = execute(kc, "print(n > 0)")
    assert reply["status"] == "ok" and stdout(messages) == "True\n"


def test_sigint_while_idle_does_nothing(kernel):
    km, kc = kernel
    drain(kc)
    for _ in range(3):
        km.interrupt_kernel()  # interrupt_mode "signal": SIGINT to the kernel
        os.kill(km.provisioner.process.pid, signal.SIGINT)
        time.sleep(0.1)
    time.sleep(0.3)
    assert km.is_alive()
    # No interrupt left pending either: the next cell runs to completion.
    reply, messages = execute(kc, "import time; time.sleep(0.2); print('ok')")
    assert reply["status"] == "ok" and stdout(messages) == "ok\n"


def test_error_reply_then_next_cell_runs(kernel):
    km, kc = kernel
    reply, messages = execute(kc, "def f():\n    raise ValueError('bad value')\nf()")
    assert reply["status"] == "error"
    assert (reply["ename"], reply["evalue"]) == ("ValueError", "bad value")
    errors = [m for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1 and errors[0]["content"]["ename"] == "ValueError"
    assert any("bad value" in line for line in errors[0]["content"]["traceback"])
    reply, messages = execute(kc, "print('next')")
    assert reply["status"] == "ok" and stdout(messages) == "next\n"


def test_error_reply_even_when_ipython_cannot_format_the_traceback(kernel):
    # IPython 8.5's formatter (stack_data) fails on some frames, for instance one interrupted
    # before its first line; IPython then recorded no error and the interrupted cell's reply said
    # "ok". Simulated by breaking the formatter.
    km, kc = kernel
    reply, _ = execute(kc, "import IPython.core.ultratb as _ultratb\n"
                           "_format = _ultratb.VerboseTB.format_exception_as_a_whole\n"
                           "def _broken(*args, **kwargs):\n"
                           "    raise RuntimeError('formatter broke')\n"
                           "_ultratb.VerboseTB.format_exception_as_a_whole = _broken")
    assert reply["status"] == "ok", reply
    try:
        reply, messages = execute(kc, "def f():\n    raise ValueError('bad value')\nf()")
    finally:
        execute(kc, "_ultratb.VerboseTB.format_exception_as_a_whole = _format")
    assert reply["status"] == "error" and reply["ename"] == "ValueError", reply
    assert "formatter broke" not in str(messages)
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1 and any("bad value" in line for line in errors[0]["traceback"])


def test_cell_sent_right_after_an_error_reply_runs(kernel):
    # A frontend may send the next cell as soon as the error reply is in, before the kernel is
    # idle: that cell was not queued behind the error and must run (xeus 2.4 aborted it, now and
    # then, with a reply and no idle status, so clients waited forever).
    km, kc = kernel
    for n in range(40):
        msg_id = kc.execute(f"raise ValueError('bad {n}')")
        assert shell_reply(kc, msg_id)["content"]["ename"] == "ValueError"
        reply, messages = execute(kc, f"print({n})")
        assert reply["status"] == "ok" and stdout(messages) == f"{n}\n", (n, reply)


def queue_behind_a_failing_cell(kc, stop_on_error=True):
    """Starts a cell that fails once the client answers its input(); queues an execute_request and
    a kernel_info_request behind it, then lets it fail. Returns the three msg_ids."""
    drain(kc)
    failing = kc.execute("input()\nraise ValueError('first')", allow_stdin=True,
                         stop_on_error=stop_on_error)
    assert kc.get_stdin_msg(timeout=10)["msg_type"] == "input_request"
    queued = kc.execute("queued_ran = True\nprint('queued')")
    info = kc.kernel_info()
    kc.input("")  # only now can the first cell fail: the other two are already queued
    reply = shell_reply(kc, failing)["content"]
    assert reply["status"] == "error" and reply["ename"] == "ValueError", reply
    return failing, queued, info


def test_cells_queued_behind_an_error_are_aborted(kernel):
    km, kc = kernel
    execute(kc, "queued_ran = False")
    failing, queued, info = queue_behind_a_failing_cell(kc)
    assert shell_reply(kc, queued)["content"] == {"status": "aborted"}
    # Busy and idle, nothing in between: frontends mark the cell finished on the idle status.
    assert [m["msg_type"] for m in collect(kc, queued)] == ["status"]
    # Only execute requests are aborted.
    info_reply = shell_reply(kc, info)
    assert info_reply["msg_type"] == "kernel_info_reply"
    assert info_reply["content"]["status"] == "ok"
    assert info_reply["content"]["implementation"] == "terra"
    reply, messages = execute(kc, "print(queued_ran)")
    assert reply["status"] == "ok" and stdout(messages) == "False\n"


def test_cells_queued_behind_an_error_run_without_stop_on_error(kernel):
    km, kc = kernel
    failing, queued, info = queue_behind_a_failing_cell(kc, stop_on_error=False)
    assert shell_reply(kc, queued)["content"]["status"] == "ok"
    assert stdout(collect(kc, queued)) == "queued\n"
    assert shell_reply(kc, info)["content"]["status"] == "ok"


def test_syntax_error_and_system_exit_keep_the_kernel(kernel):
    km, kc = kernel
    reply, _ = execute(kc, "def (:")
    assert reply["status"] == "error" and reply["ename"] == "SyntaxError"
    reply, _ = execute(kc, "raise SystemExit(3)")
    assert km.is_alive()
    reply, messages = execute(kc, "print('alive')")
    assert stdout(messages) == "alive\n"


def test_input_with_allow_stdin(kernel):
    km, kc = kernel
    msg_id = kc.execute("name = input('who? ')\nprint('hello', name)", allow_stdin=True)
    request = kc.get_stdin_msg(timeout=10)
    assert request["msg_type"] == "input_request"
    assert request["content"]["prompt"] == "who? "
    kc.input("terra")
    reply = shell_reply(kc, msg_id)["content"]
    assert reply["status"] == "ok"
    assert "hello terra" in stdout(collect(kc, msg_id))


def test_kernel_info_names_terra(kernel):
    km, kc = kernel
    msg_id = kc.kernel_info()
    info = shell_reply(kc, msg_id)["content"]
    assert info["status"] == "ok"
    assert info["implementation"] == "terra"
    assert info["language_info"]["name"] == "python"
    assert info["language_info"]["file_extension"] == ".py"
    assert info["language_info"]["version"].startswith("3.11")
    assert "Terra" in info["banner"]
    reply, messages = execute(kc, "import terra; print(terra.__version__)")
    assert reply["status"] == "ok"
    assert stdout(messages).strip() == info["implementation_version"]


def test_torch_imports_and_trains_a_step(kernel):
    km, kc = kernel
    code = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "lin = torch.nn.Linear(3, 1)\n"
        "loss = lin(torch.ones(2, 3)).pow(2).mean()\n"
        "loss.backward()\n"
        "print(torch.__version__, lin.weight.grad.shape)"
    )
    reply, messages = execute(kc, code, timeout=60)
    assert reply["status"] == "ok", reply
    assert stdout(messages).startswith("2.13") and "torch.Size([1, 3])" in stdout(messages)


def test_embedded_python_is_the_venv_with_debian_ipython(kernel):
    km, kc = kernel
    code = (
        "import sys, IPython, xeus_python_shell, comm\n"
        "print(sys.prefix)\n"
        "print(IPython.__version__, IPython.__file__)\n"
        "print(type(get_ipython()).__module__)\n"
        "print(comm.create_comm.__module__)"
    )
    reply, messages = execute(kc, code)
    assert reply["status"] == "ok", reply
    prefix, ipython, shell_module, comm_module = stdout(messages).splitlines()
    assert os.path.realpath(prefix) == os.path.realpath(os.path.join(os.path.dirname(__file__),
                                                                     "..", "..", ".venv"))
    version, path = ipython.split()
    assert version.startswith("8.5.") and path.startswith("/usr/lib/python3/dist-packages/")
    assert shell_module == "xeus_python_shell.shell"
    assert comm_module == "terra_kernel.comms"


def test_terra_magic(kernel):
    km, kc = kernel
    reply, messages = execute(kc, "%terra version")
    assert reply["status"] == "ok" and stdout(messages).strip()[0].isdigit()
    reply, messages = execute(kc, "%terra frobnicate")
    # IPython shows a UsageError as a message on stderr, not as a traceback.
    stderr = "".join(m["content"]["text"] for m in messages
                     if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
    assert "UsageError" in stderr and "%terra status" in stderr


def test_execution_count_matches_in_and_out(kernel):
    km, kc = kernel
    reply, _ = execute(kc, "40 + 2")
    count = reply["execution_count"]
    reply, messages = execute(kc, f"print(Out[{count}], In[{count}])")
    assert stdout(messages) == "42 40 + 2\n"


def test_debugger_initializes_and_attaches(kernel):
    km, kc = kernel

    def debug(command, arguments):
        msg = kc.session.msg("debug_request", {"type": "request", "seq": 1, "command": command,
                                               "arguments": arguments})
        kc.control_channel.send(msg)
        while True:
            reply = kc.control_channel.get_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    initialized = debug("initialize", {"clientID": "tests", "adapterID": "python",
                                       "pathFormat": "path", "linesStartAt1": True,
                                       "columnsStartAt1": True})
    assert initialized["success"], initialized
    assert debug("attach", {})["success"]
    info = debug("debugInfo", {})
    assert info["success"] and info["body"]["isStarted"]
    reply, messages = execute(kc, "print('after attach')")
    assert stdout(messages) == "after attach\n"


def test_bad_messages_do_not_kill_the_kernel(kernel):
    from jupyter_client.session import Session

    km, kc = kernel
    socket = kc.shell_channel.socket
    Session(key=b"not-the-key").send(socket, "execute_request", {"code": "1"})  # bad signature
    kc.session.send(socket, "no_such_request", {})
    kc.session.send(socket, "execute_request", {"code": 42})  # wrong type
    kc.session.send(socket, "history_request", {"hist_access_type": "tail", "n": "ten"})
    time.sleep(0.5)
    assert km.is_alive()
    drain(kc)
    reply, messages = execute(kc, "print('fine')")
    assert stdout(messages) == "fine\n"
