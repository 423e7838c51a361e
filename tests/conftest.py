"""Settings for the whole test suite.

Terra's payoff check (terra/payoff.h) runs a graph eagerly where co-executing it measured slower.
That decision depends on timing, so the suite pins co-execution (TERRA_ADAPTIVE=0, inherited by
the kernels and child processes the tests start); tests/python/test_payoff.py turns the check on
with margins that force each choice.
"""
import os
import tempfile

os.environ.setdefault("TERRA_ADAPTIVE", "0")
# One-thread verdicts (terra_core/runtime/verdicts.h) persist across processes in a cache file; the
# suite keeps its own, new for every run, so no test depends on what an earlier run checked.
os.environ.setdefault("TERRA_CACHE_DIR", tempfile.mkdtemp(prefix="terra-test-cache-"))
# The payoff check's choices persist in that directory too (runtime/payoff_memory.h): a test that
# turns the check on would start from the choice an earlier test made for the same loop, so the
# suite remembers none; tests/python/test_payoff_memory.py turns it on.
os.environ.setdefault("TERRA_REMEMBER_PAYOFF", "0")
