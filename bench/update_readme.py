"""Copies the steady-state table and the geometric means from bench/results/bench_cpu.md into
README.md, between the `<!-- bench:start -->` and `<!-- bench:end -->` markers."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    md = (ROOT / "bench" / "results" / "bench_cpu.md").read_text()
    section = md.split("## Steady-state step time", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    means = next((line for line in section.splitlines() if line.startswith("Geometric-mean")), "")
    header = md.splitlines()[2] if len(md.splitlines()) > 2 else ""
    block = (f"<!-- bench:start -->\nStep time after the warm-up calls, as a ratio to eager (lower is faster): a "
             f"first run's steps 67 to about 150, in calls of 10-50 steps, where Terra's payoff check may still be "
             f"timing the two modes (steady training: `bench/long_run.py` above), from "
             f"`bench/results/bench_cpu.md`:\n\n{table}\n\n{means}\n\n<sub>{header}</sub>\n<!-- bench:end -->")
    readme = (ROOT / "README.md").read_text()
    readme = re.sub(r"<!-- bench:start -->.*<!-- bench:end -->", lambda _: block, readme, flags=re.S)
    (ROOT / "README.md").write_text(readme)


if __name__ == "__main__":
    main()
