"""Shared set-up for the kernel tests: the installed `terra` kernel, an isolated history store,
and a helper that runs a cell and collects what it published."""
import os
import queue
import time
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "terra"
TIMEOUT = 30

# The kernel spec installed into the venv (scripts/test.sh exports the same).
os.environ.setdefault("JUPYTER_PATH", str(ROOT / ".venv" / "share" / "jupyter"))


@pytest.fixture(scope="session", autouse=True)
def terra_kernel_env(tmp_path_factory):
    """Every kernel these tests start keeps its history in a throwaway store."""
    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        pytest.fail("the `terra` kernel is not installed: run scripts/setup.sh first")
    history = tmp_path_factory.mktemp("history") / "history.sqlite"
    old = os.environ.get("TERRA_HISTORY_FILE")
    os.environ["TERRA_HISTORY_FILE"] = str(history)
    yield history
    if old is None:
        os.environ.pop("TERRA_HISTORY_FILE", None)
    else:
        os.environ["TERRA_HISTORY_FILE"] = old


@pytest.fixture(scope="module")
def kernel():
    """A running terra kernel and its client, shared by one test module."""
    km, kc = start_new_kernel(kernel_name=KERNEL, startup_timeout=60)
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def collect(kc, msg_id, timeout=TIMEOUT):
    """Returns the iopub messages of request `msg_id`, up to its idle status (excluded)."""
    deadline = time.monotonic() + timeout
    messages = []
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages
        messages.append(msg)


def shell_reply(kc, msg_id, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def execute(kc, code, timeout=TIMEOUT, **kwargs):
    """Runs `code`; returns (execute_reply content, iopub messages of the request)."""
    msg_id = kc.execute(code, **kwargs)
    reply = shell_reply(kc, msg_id, timeout)
    return reply["content"], collect(kc, msg_id, timeout)


def stdout(messages):
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def drain(kc):
    for get in (kc.get_shell_msg, kc.get_iopub_msg):
        while True:
            try:
                get(timeout=0.05)
            except queue.Empty:
                break
