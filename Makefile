# The two commands of README's quick start, and their siblings.
#   make run    set up everything, then execute the demo notebook with the Terra kernel
#   make test   run the whole test suite (sets up first)
#   make lab    set up, then start JupyterLab on 127.0.0.1 (token auth on)
.PHONY: run test lab setup bench
PY := .venv/bin/python

setup:
	@bash scripts/setup.sh

run: setup
	@$(PY) scripts/run_notebook.py notebooks/quickstart.ipynb

test:
	@bash scripts/test.sh

lab: setup
	@.venv/bin/jupyter lab --ip=127.0.0.1 --no-browser notebooks

bench: setup
	@$(PY) bench/run.py
