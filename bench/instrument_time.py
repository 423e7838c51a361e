"""Time `terra.run` spends instrumenting a program's functions on its first call.

terra.run compiles again, with iteration boundaries on their loops, the functions defined in the
run function's source file (terra/__init__.py: `_program_functions`, `_instrument`). This times
that for each program of bench/programs in a fresh process (the cache of instrumented code starts
empty), the same work a first `terra.run` does. Another build: PYTHONPATH=.../build/python.

    .venv/bin/python bench/instrument_time.py
"""
import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import terra  # noqa: E402

PROGRAMS = ("tabular_mlp", "gpt", "music_transformer", "dcgan", "bert", "rl_cartpole")


def main():
    for name in PROGRAMS:
        prog = importlib.import_module(f"bench.programs.{name}")
        functions = terra._program_functions(prog.train) + [prog.train]
        start = time.perf_counter()
        for f in functions:
            terra._instrument(f, "__terra_mark_helper__")
        print(f"{name}: {len(functions)} functions, {(time.perf_counter() - start) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
