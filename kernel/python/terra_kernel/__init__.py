"""The Python side of the Terra kernel.

``terra-kernel`` (C++) calls :func:`load` once, right after xeus-python has built the IPython
shell. Everything the kernel adds to that shell in Python is set up here, one module per concern:

- :mod:`terra_kernel.comms`: the ``comm`` package and ``ipykernel.comm`` point at xeus's comms,
  so ipywidgets 8 and anywidget widgets reach the frontend;
- :mod:`terra_kernel.errors`: error replies name the exception class;
- :mod:`terra_kernel.interrupts`: a Ctrl-C surfaces in the user's code, never in the kernel's;
- :mod:`terra_kernel.coexec`: every cell co-executed by Terra (on by default);
- :mod:`terra_kernel.magics`: Terra's IPython magics (``%terra ...``).

Nothing here imports torch or the engine at load time: the kernel must start fast.
"""
from . import coexec, comms, errors, interrupts, magics

__all__ = ["load"]


def load(shell):
    """Sets up the kernel's Python side in ``shell`` (an ``xeus_python_shell`` XPythonShell)."""
    comms.install(shell)
    errors.install(shell)
    interrupts.install(shell)
    cells = coexec.CellCoexecution(shell)
    magics.register(shell, cells)
