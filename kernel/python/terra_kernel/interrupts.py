"""Where in a cell a Ctrl-C may surface: in the user's code, never in the kernel's own.

The C++ kernel (kernel/interrupt.hpp) delivers an interrupt only while code marked here as the
user's runs: IPython's ``run_code``, which executes the cell's statements (and, through magics,
whatever they run). An interrupt that arrives while IPython or the kernel does its own work around
the cell (history, hooks such as opening and closing the Terra session) waits and is raised where
the user's code starts or resumes; one still waiting when the cell ends is dropped. Before this, a
Ctrl-C landing in a ``pre_run_cell`` hook was caught by IPython, printed as "Error in callback",
and the cell ran on.

Inside the user's code, the kernel's own work (a Terra session opening at a loop's first
iteration) is wrapped in :func:`kernel_code`.
"""
import contextlib
import signal

try:
    import _terra_kernel_interrupts as _native  # embedded in the terra-kernel executable
except ImportError:  # imported outside the kernel: every interrupt is plain Python's
    _native = None


@contextlib.contextmanager
def kernel_code():
    """The kernel's own work inside the user's code: a Ctrl-C waits until it is done, then is
    raised as the block exits, in the user's code that called into it."""
    if _native is None:
        yield
        return
    _native.enter_kernel_code()
    try:
        yield
    finally:
        _native.leave_kernel_code()


def install(shell):
    """Marks ``shell.run_code`` as the user's code and makes the kernel's handler Python's SIGINT
    handler (it raises KeyboardInterrupt like ``signal.default_int_handler``)."""
    if _native is None:
        return
    run_code = shell.run_code

    async def run_user_code(code_obj, result=None, *, async_=False):
        _native.enter_user_code()  # raises instead, for a Ctrl-C that came before the code started
        try:
            return await run_code(code_obj, result, async_=async_)
        finally:
            _native.leave_user_code()

    shell.run_code = run_user_code
    signal.signal(signal.SIGINT, _native.keyboard_interrupt)
    _native.use_sections()
