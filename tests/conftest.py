"""Settings for the whole test suite.

Terra's payoff check (terra/payoff.h) runs a graph eagerly where co-executing it measured slower.
That decision depends on timing, so the suite pins co-execution (TERRA_ADAPTIVE=0, inherited by
the kernels and child processes the tests start); tests/python/test_payoff.py turns the check on
with margins that force each choice.
"""
import os

os.environ.setdefault("TERRA_ADAPTIVE", "0")
