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


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def opened_and_displayed(messages, model_name, anywidget_id=None):
    """Returns (comm_open content, display_data content) of the one widget model `model_name`
    (and, for anywidget models, `_anywidget_id`) that `messages` open and display."""
    opens = [m for m in messages if m["msg_type"] == "comm_open"
             and m["content"]["data"]["state"].get("_model_name") == model_name
             and anywidget_id in (None, m["content"]["data"]["state"].get("_anywidget_id"))]
    assert len(opens) == 1, [m["msg_type"] for m in messages]
    message = opens[0]
    opened = message["content"]
    assert opened["target_name"] == "jupyter.widget"
    views = [m["content"] for m in messages if m["msg_type"] == "display_data"
             and WIDGET_VIEW in m["content"]["data"]
             and m["content"]["data"][WIDGET_VIEW]["model_id"] == opened["comm_id"]]
    assert len(views) == 1
    view = views[0]["data"][WIDGET_VIEW]
    assert view["version_major"] == 2
    assert message["metadata"]["version"].startswith("2.")  # widget protocol version
    return opened, views[0]
