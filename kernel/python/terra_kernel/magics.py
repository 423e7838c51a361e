"""Terra's IPython magics.

Magics are real IPython magics (a ``Magics`` class registered on the shell), so ``%lsmagic``,
``%terra?``, completion of ``%ter`` and history all work. Add Terra's commands to
:class:`TerraMagics`; :func:`register` is what the kernel calls at start-up.
"""
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class


@magics_class
class TerraMagics(Magics):
    @line_magic
    def terra(self, line):
        """Terra's controls.

        %terra version   print the version of the terra package
        %terra status    print Terra's state (for now: its version)
        """
        command = line.strip() or "status"
        if command not in ("version", "status"):
            raise UsageError(f"%terra: unknown command {command!r}; use %terra version or %terra status")
        import terra  # imports torch: only when asked for

        if command == "version":
            print(terra.__version__)
        else:
            print(f"Terra {terra.__version__}")


def register(shell):
    shell.register_magics(TerraMagics)
