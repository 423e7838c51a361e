"""The Jupyter protocol conformance suite (jupyter_kernel_test) against the installed kernel,
with every family of checks enabled."""
import jupyter_kernel_test as jkt


class TerraKernelTests(jkt.KernelTests):
    kernel_name = "terra"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"

    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import itertools; itertools.chai", "matches": {"chain"}},
    ]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]

    code_page_something = "print?"
    code_generate_error = "raise RuntimeError('this is the error')"

    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
    ]

    supported_history_operations = ("tail", "range", "search")
    code_history_pattern = "1?2*"

    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"
