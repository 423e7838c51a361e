"""Terra: imperative-symbolic co-execution of PyTorch programs."""
import torch  # noqa: F401  (loads LibTorch before the extension that links it)

from . import _C

__version__ = _C.__version__
