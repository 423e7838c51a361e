#!/usr/bin/env python3
"""Executes a notebook headless through a Jupyter kernel (Terra's by default) and prints each
cell's text output as the cell finishes. Exits non-zero if a cell raises.

    .venv/bin/python scripts/run_notebook.py notebooks/quickstart.ipynb [--output executed.ipynb]
"""
import argparse
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def text_of(output):
    """The text a terminal would show for one output: streams and text/plain results."""
    if output["output_type"] == "stream":
        return output["text"]
    if output["output_type"] in ("execute_result", "display_data"):
        text = output.get("data", {}).get("text/plain", "")
        return text + "\n" if text else ""
    return ""


def plain(text):
    return text if sys.stdout.isatty() else ANSI.sub("", text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--kernel", default="terra", help="kernel name (default: terra)")
    parser.add_argument("--output", type=Path, help="also save the executed notebook here")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    args = parser.parse_args(argv)

    nb = nbformat.read(args.notebook, as_version=4)

    def on_cell_executed(cell, cell_index, execute_reply):
        if cell.cell_type != "code":
            return
        text = "".join(text_of(output) for output in cell.outputs)
        if text:
            sys.stdout.write(plain(text))
            sys.stdout.flush()

    client = NotebookClient(
        nb,
        kernel_name=args.kernel,
        timeout=args.timeout,
        resources={"metadata": {"path": str(args.notebook.resolve().parent)}},
        on_cell_executed=on_cell_executed,
    )
    status = 0
    try:
        client.execute()
    except CellExecutionError as error:
        # The message holds the failing cell's source and traceback.
        print(plain(str(error)), file=sys.stderr)
        print(f"run_notebook: {args.notebook} failed in a cell (see above)", file=sys.stderr)
        status = 1
    except DeadKernelError as error:
        print(f"run_notebook: the {args.kernel} kernel died while running {args.notebook}: {error}",
              file=sys.stderr)
        status = 1
    if args.output:
        nbformat.write(nb, args.output)
    return status


if __name__ == "__main__":
    sys.exit(main())
