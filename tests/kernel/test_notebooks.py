"""Every demo notebook runs headless through the terra kernel without errors, co-executes, and
says what it should."""
import subprocess
import sys

import pytest

from kernel_helpers import ROOT

RUN_NOTEBOOK = ROOT / "scripts" / "run_notebook.py"
EXPECTED = {
    "quickstart": ["final weights bitwise equal to eager: True", "co-executed"],
    "dynamic_control_flow": ["co-executed", "fell back"],
    "inference_numpy": ["boxes kept in all", "co-executed"],
    "graph_views": ["graph of the training cell", "co-executed", "Terra graph In [2]",
                    "Terra timeline of In [2]"],
}


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_demo_notebook(name):
    result = subprocess.run([sys.executable, str(RUN_NOTEBOOK), str(ROOT / "notebooks" / f"{name}.ipynb")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for text in EXPECTED.get(name, ["co-executed"]):
        assert text in result.stdout, (name, text, result.stdout[-3000:])
