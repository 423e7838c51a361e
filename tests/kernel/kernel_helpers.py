"""Helpers for the kernel tests: run a cell on a jupyter_client and collect what it published.

(Not in conftest.py: test modules import these by name, and a module called `conftest` can be any
directory's.)"""
import queue
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "terra"
TIMEOUT = 30


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


def wait_for_stdout(kc, msg_id, text, timeout=TIMEOUT):
    """Waits until request `msg_id` has printed `text`; its other iopub messages are dropped."""
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream"
                and text in msg["content"]["text"]):
            return


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
