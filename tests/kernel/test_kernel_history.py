"""The kernel's history store: it answers history_request from an IPython-style SQLite file that
outlives the kernel process."""
import sqlite3
import uuid

from jupyter_client.manager import KernelManager, start_new_kernel

from kernel_helpers import KERNEL, execute, shell_reply


def history(kc, **request):
    return shell_reply(kc, kc.history(**request))["content"]


def test_history_survives_a_restart(terra_kernel_env):
    marker = f"marker_{uuid.uuid4().hex[:12]}"
    km, kc = start_new_kernel(kernel_name=KERNEL, startup_timeout=60)
    try:
        execute(kc, f"{marker} = 6 * 7")
        execute(kc, marker)
        before = history(kc, hist_access_type="tail", n=2, output=True, raw=True)
        (session, line, (source, output)), = before["history"][1:]
        assert (source, output) == (marker, "42")

        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=60)
        found = history(kc, hist_access_type="search", pattern=f"{marker}*", n=10,
                        output=False, raw=True)
        assert [entry[2] for entry in found["history"]] == [f"{marker} = 6 * 7", marker]
        assert found["history"][1][:2] == [session, line]
        again = history(kc, hist_access_type="range", session=session, start=line,
                        stop=line + 1, raw=True, output=False)
        assert again["history"] == [[session, line, marker]]
        # The new process is a new session, numbered after the old one.
        execute(kc, "1")
        (new_session, _, _), = history(kc, hist_access_type="tail", n=1)["history"]
        assert new_session > session
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    # IPython's schema, readable without the kernel.
    with sqlite3.connect(terra_kernel_env) as db:
        rows = db.execute("SELECT source, source_raw FROM history WHERE source_raw LIKE ?",
                          (f"{marker}%",)).fetchall()
    assert (f"{marker} = 6 * 7", f"{marker} = 6 * 7") in rows


def test_history_stores_transformed_source_and_default_location(tmp_path, monkeypatch):
    # Without TERRA_HISTORY_FILE the store goes to the user's data dir.
    monkeypatch.delenv("TERRA_HISTORY_FILE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    km = KernelManager(kernel_name=KERNEL)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        execute(kc, "%terra status")
        (entry,) = history(kc, hist_access_type="tail", n=1, raw=False)["history"]
        assert entry[2] == "get_ipython().run_line_magic('terra', 'status')"
        (entry,) = history(kc, hist_access_type="tail", n=1, raw=True)["history"]
        assert entry[2] == "%terra status"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert (tmp_path / "terra" / "history.sqlite").is_file()
