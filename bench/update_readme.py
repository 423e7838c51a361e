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
    block = (f"<!-- bench:start -->\nSteady-state step time as a ratio to eager (lower is faster), from "
             f"`bench/results/bench_cpu.md`:\n\n{table}\n\n{means}\n\n<sub>{header}</sub>\n<!-- bench:end -->")
    readme = (ROOT / "README.md").read_text()
    readme = re.sub(r"<!-- bench:start -->.*<!-- bench:end -->", lambda _: block, readme, flags=re.S)
    (ROOT / "README.md").write_text(readme)


if __name__ == "__main__":
    main()
