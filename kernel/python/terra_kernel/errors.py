"""Error replies that name the exception, and that are error replies whatever the traceback.

- xeus_python_shell 0.5 reports ``str(type)`` as the error's name (``"<class 'ValueError'>"``);
  the protocol and every frontend expect the class name (``"ValueError"``).
- When IPython 8.5's traceback formatter fails (stack_data cannot place a frame, as for a frame
  interrupted before its first line, reported at line -1), IPython prints "Unexpected exception
  formatting exception" and records no error at all: the cell's reply said "ok", so an interrupted
  cell looked finished and "Run All" went on. The formatter falls back to Python's plain traceback
  instead.
"""
import sys
import traceback


def install(shell):
    def _showtraceback(etype, evalue, stb):
        shell.last_error = [getattr(etype, "__name__", str(etype)), str(evalue), stb]

    shell._showtraceback = _showtraceback

    formatter = shell.InteractiveTB
    rich = formatter.structured_traceback

    def structured_traceback(etype=None, value=None, tb=None, tb_offset=None, *args, **kwargs):
        if etype is None:
            etype, value, tb = sys.exc_info()
        try:
            return rich(etype, value, tb, tb_offset, *args, **kwargs)
        except (Exception, KeyboardInterrupt):  # a second Ctrl-C while formatting, too
            if isinstance(tb, tuple):  # IPython passes chained tracebacks so
                tb = tb[0]
            skip = formatter.tb_offset if tb_offset is None else tb_offset
            while skip > 0 and tb is not None and tb.tb_next is not None:
                tb, skip = tb.tb_next, skip - 1
            return [line.rstrip("\n") for line in traceback.format_exception(etype, value, tb)]

    formatter.structured_traceback = structured_traceback
