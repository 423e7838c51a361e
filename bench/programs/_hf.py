"""Hugging Face transformers models for the benchmarks: built from a config with random weights
(nothing is downloaded), trained with AdamW on synthetic token data. The package is installed by
the benchmark's own setup (bench/requirements-hf.txt, `ensure_installed`), not by the project's.
"""
import importlib
import subprocess
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements-hf.txt"


def ensure_installed():
    """Import transformers, installing bench/requirements-hf.txt into this interpreter first if
    it is missing (from PyPI; the project's own setup never needs it)."""
    try:
        return importlib.import_module("transformers")
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
                       check=True)
        importlib.invalidate_caches()
        return importlib.import_module("transformers")


def quiet(transformers):
    transformers.logging.set_verbosity_error()
    return transformers
