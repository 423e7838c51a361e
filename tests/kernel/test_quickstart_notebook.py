"""The demo notebook runs headless through the terra kernel (what `make run` does), and
scripts/run_notebook.py reports a failing cell with a non-zero exit."""
import re
import subprocess
import sys

import nbformat

from kernel_helpers import ROOT

RUN_NOTEBOOK = ROOT / "scripts" / "run_notebook.py"


def run_notebook(*args):
    return subprocess.run([sys.executable, str(RUN_NOTEBOOK), *map(str, args)],
                          capture_output=True, text=True, timeout=180)


def test_quickstart_trains(tmp_path):
    executed = tmp_path / "quickstart.ipynb"
    result = run_notebook(ROOT / "notebooks" / "quickstart.ipynb", "--output", executed)
    assert result.returncode == 0, result.stderr
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss (\d+\.\d+)$", result.stdout, re.M)]
    assert len(losses) >= 5, result.stdout
    assert losses[-1] < 0.1 * losses[0]
    assert "final loss" in result.stdout

    nb = nbformat.read(executed, as_version=4)
    assert nb.metadata.kernelspec.name == "terra"
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells)
    assert not any(o.output_type == "error" for c in code_cells for o in c.outputs)


def test_failing_cell_exits_non_zero(tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print('before')"),
               nbformat.v4.new_code_cell("1 / 0"),
               nbformat.v4.new_code_cell("print('never')")],
        metadata={"kernelspec": {"name": "terra", "display_name": "Python 3 (Terra)",
                                 "language": "python"}})
    path = tmp_path / "fails.ipynb"
    nbformat.write(nb, path)
    result = run_notebook(path)
    assert result.returncode == 1
    assert result.stdout == "before\n"
    assert "ZeroDivisionError" in result.stderr
