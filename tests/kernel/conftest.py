"""Fixtures for the kernel tests: the installed `terra` kernel and an isolated history store."""
import os

import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import start_new_kernel

from kernel_helpers import KERNEL, ROOT

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
