"""Comms for widgets on xeus-python 0.14.

xeus-python puts its comm implementation in ``sys.modules["ipykernel.comm"]`` (``Comm``,
``CommManager``), but ipywidgets 8 and anywidget open their comms through the ``comm`` package,
whose defaults send nothing. :func:`install` points ``comm.create_comm`` and
``comm.get_comm_manager`` at xeus's implementation.

It also guards a crash: xeus 2.4 aborts the kernel when a comm is opened on a target that was
never registered. Every target a comm is opened on is registered first (with a handler that
ignores frontend-opened comms, unless the owner registers a real one later), and
``jupyter.widget`` is registered up front so a frontend can open widget comms before the user
imported ipywidgets.
"""
import sys

import comm

_xcomm = sys.modules["ipykernel.comm"]  # installed by xeus-python before the shell exists


class CommManager:
    """xeus's CommManager, remembering which targets are registered."""

    def __init__(self, xmanager):
        self._xmanager = xmanager
        self.targets = {}

    def register_target(self, target_name, callback):
        self.targets[target_name] = callback
        self._xmanager.register_target(target_name, callback)

    def unregister_target(self, target_name, callback=None):
        # xeus 0.14 cannot unregister: leave a handler that ignores new comms.
        self.register_target(target_name, _ignore_comm_open)

    def ensure_target(self, target_name):
        if target_name not in self.targets:
            self.register_target(target_name, _ignore_comm_open)


_manager = None


class Comm(_xcomm.Comm):
    """xeus's Comm; opening it never hits an unregistered target."""

    def __init__(self, target_name="", data=None, metadata=None, buffers=None, **kwargs):
        if _manager is not None and target_name:
            _manager.ensure_target(target_name)
        super().__init__(
            target_name,
            {} if data is None else data,
            {} if metadata is None else metadata,
            [] if buffers is None else list(buffers),
            **kwargs,
        )


def create_comm(*args, **kwargs):
    return Comm(*args, **kwargs)


def get_comm_manager():
    return _manager


def _ignore_comm_open(comm, msg):
    pass


def _open_widget_comm(comm, msg):
    """A frontend opened a widget comm: hand it to ipywidgets (which replaces this on import)."""
    from ipywidgets import Widget

    Widget.handle_comm_opened(comm, msg)


def install(shell):
    global _manager
    _manager = CommManager(shell.kernel.comm_manager)
    shell.kernel.comm_manager = _manager
    _xcomm.Comm = Comm
    _xcomm.CommManager = CommManager
    comm.create_comm = create_comm
    comm.get_comm_manager = get_comm_manager
    _manager.register_target("jupyter.widget", _open_widget_comm)
