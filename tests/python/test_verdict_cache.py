"""One-thread verdicts kept across processes (terra_core/runtime/verdicts.h).

A recording checks each kernel it has no verdict for by running it again on copies with one
intra-op thread; the verdicts go to a cache file, so a second run of the same program records its
block without checking, and still gives eager's bits.
"""
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, torch, terra
    torch.set_num_threads(2)

    def train(steps):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(8 * 12 * 12, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = torch.randn(16, 1, 12, 12), torch.randn(16, 4)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    eager = train(12)
    ours = terra.run(train, 12)
    s = terra.stats("train")
    c = terra._c().runner_counts()
    print(json.dumps({"equal": all(torch.equal(a, b) for a, b in zip(eager, ours)),
                      "checked": s["kernels_checked"], "reused": s["kernel_verdicts_reused"],
                      "recorded": s["blocks_recorded"], "cache": c["verdict_cache"],
                      "loaded": c["verdicts_loaded"]}))
""")


def run_child(cache_dir, tmp_path):
    script = tmp_path / "child.py"  # a file: terra.run marks the loops of its source
    script.write_text(CHILD)
    env = dict(os.environ, TERRA_CACHE_DIR=str(cache_dir), TERRA_ADAPTIVE="0")
    out = subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True,
                         text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_second_run_records_its_block_with_the_first_runs_verdicts(tmp_path):
    cache = tmp_path / "cache"
    first = run_child(cache, tmp_path)
    assert first["equal"] and first["recorded"] >= 1, first
    assert first["checked"] > 0 and first["loaded"] == 0, first
    assert first["cache"].startswith(str(cache)), first
    second = run_child(cache, tmp_path)
    assert second["equal"] and second["recorded"] >= 1, second
    assert second["checked"] == 0 and second["reused"] > 0, second
    assert second["loaded"] >= first["checked"], (first, second)


def test_a_damaged_cache_file_loses_only_its_damaged_records(tmp_path):
    cache = tmp_path / "cache"
    first = run_child(cache, tmp_path)
    path = first["cache"]
    with open(path, "ab") as f:
        f.write(b"\x01" * 16 + b"\x02" * 7)  # a foreign record and a torn one
    second = run_child(cache, tmp_path)
    assert second["equal"] and second["checked"] == 0 and second["loaded"] == first["loaded"] + first["checked"], second


def test_the_cache_file_can_be_turned_off(tmp_path):
    off = run_child("0", tmp_path)
    assert off["cache"] == "" and off["loaded"] == 0 and off["checked"] > 0 and off["equal"], off
    assert [p.name for p in tmp_path.iterdir()] == ["child.py"]
