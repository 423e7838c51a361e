"""Error replies that name the exception.

xeus_python_shell 0.5 reports ``str(type)`` as the error's name (``"<class 'ValueError'>"``);
the protocol and every frontend expect the class name (``"ValueError"``).
"""


def install(shell):
    def _showtraceback(etype, evalue, stb):
        shell.last_error = [getattr(etype, "__name__", str(etype)), str(evalue), stb]

    shell._showtraceback = _showtraceback
