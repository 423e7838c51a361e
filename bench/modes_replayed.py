"""Loops whose blocks were refused until session 53: eager, Terra, Terra with block replay off.

Until session 53 a block with an item under autocast or inference mode was refused, and so was one
with an item whose autograd history the backward consumes in part (an RNN module's last states):
such a loop co-executed op by op through the dispatcher (what `replay=off` still does). Each loop
in fresh processes per mode, modes alternated in every round (steady time per step over
400-step calls, as bench/long_run.py: a 100-step and a 400-step call on one state after 50
untimed steps, steady = their difference / 300):

- `autocast_mlp`: a 3-layer MLP (64-128-128-10, batch 32) trained with bf16 autocast around
  each step's forward, AdamW;
- `inference_eval`: an evaluation loop under torch.inference_mode over 16 batches (embedding, a
  transformer encoder layer of width 64, a linear head), summing the top-class probability;
- `lstm_lm`: a character-level language model (embedding 64, a 2-layer nn.LSTM of width 128, a
  linear head over 80 symbols; batches of 16 sequences of 32), its loss on the LSTM's output only,
  gradient clipping, Adam.

    .venv/bin/python bench/modes_replayed.py [--rounds 3] [--name modes_replayed]

Results: bench/results/<name>.{json,md}.
"""
import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ab import run_child  # noqa: E402

LOOPS = ("autocast_mlp", "inference_eval", "lstm_lm")
MODES = {"eager": {}, "terra": {}, "terra, replay off": {"TERRA_REPLAY": "0"}}


def make(loop):
    """The loop's state and a function running `n` of its iterations."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    if loop == "autocast_mlp":
        m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

        def train(n):
            for _ in range(n):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = nn.functional.cross_entropy(m(x).float(), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            return loss
        return train
    if loop == "lstm_lm":
        emb, lstm, head = nn.Embedding(80, 64), nn.LSTM(64, 128, num_layers=2, batch_first=True), nn.Linear(128, 80)
        params = [*emb.parameters(), *lstm.parameters(), *head.parameters()]
        opt = torch.optim.Adam(params, lr=2e-3)
        text = torch.randint(0, 80, (64, 33))

        def train_lm(n):
            for i in range(n):
                batch = text[(i % 4) * 16:(i % 4) * 16 + 16]
                out, _ = lstm(emb(batch[:, :-1]))
                loss = nn.functional.cross_entropy(head(out).reshape(-1, 80), batch[:, 1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            return loss
        return train_lm
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(100, 64), layer, nn.Linear(64, 10)).eval()
    data = [torch.randint(0, 100, (8, 16)) for _ in range(16)]

    def evaluate(n):
        total = 0
        with torch.inference_mode():
            for i in range(n):
                total = total + model(data[i % 16]).softmax(-1).amax(-1).mean()
        return total
    return evaluate


def child(loop, mode):
    import torch
    torch.set_num_threads(2)
    body = make(loop)
    import terra

    def run(n):
        if mode == "eager":
            return body(n)
        out = terra.run(body, n)
        terra.sync()
        return out

    run(50)
    t = time.perf_counter()
    run(100)
    t100 = time.perf_counter() - t
    t = time.perf_counter()
    out = run(400)
    t400 = time.perf_counter() - t
    s = terra.stats() if mode != "eager" else {}
    print(json.dumps({"steady_ms": (t400 - t100) / 300 * 1e3, "result": float(out.detach() if hasattr(out, "detach") else out),
                      "replayed": s.get("iterations_replayed", 0), "eager_chosen": s.get("iterations_eager_chosen", 0),
                      "coexecuted": s.get("iterations_coexecuted", 0), "refusal": s.get("replay_refusal", "")}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="modes_replayed")
    ap.add_argument("--child", nargs=2)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    rows = {(loop, mode): [] for loop in LOOPS for mode in MODES}
    for r in range(args.rounds):
        for loop in LOOPS:
            for mode, env in MODES.items():
                res = run_child(__file__, (loop, mode if mode == "eager" else "terra"), env=env)
                rows[(loop, mode)].append(res)
                print(f"round {r} {loop:15s} {mode:18s} {res['steady_ms']:.3f} ms/it", flush=True)
    import torch
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "machine": platform.processor(),
           "rounds": args.rounds, "rows": {f"{l}/{m}": v for (l, m), v in rows.items()}}
    (ROOT / "bench" / "results" / f"{args.name}.json").write_text(json.dumps(out, indent=1))
    L = ["# Loops under autocast or torch.inference_mode (bench/modes_replayed.py)", "",
         f"{out['date']}, torch {out['torch']}, 2 intra-op threads, {args.rounds} rounds of fresh processes, modes "
         "alternated in each round. Steady time per iteration over 400-step calls (medians over rounds); ratio: to "
         "eager's median; replayed / co-executed / eager-chosen: iterations of the process's last round, all its "
         "calls; results: every mode's last call returned the same number (checked).", "",
         "| loop | mode | ms/iteration | ratio to eager | per round | replayed | co-executed | eager chosen |",
         "|---|---|---:|---:|---|---:|---:|---:|"]
    for loop in LOOPS:
        eager = statistics.median(x["steady_ms"] for x in rows[(loop, "eager")])
        results = {x["result"] for mode in MODES for x in rows[(loop, mode)]}
        assert len(results) == 1, f"{loop}: results differ between modes: {results}"
        for mode in MODES:
            xs = rows[(loop, mode)]
            med = statistics.median(x["steady_ms"] for x in xs)
            L.append(f"| {loop} | {mode} | {med:.3f} | {med / eager:.2f} | "
                     f"{', '.join(format(x['steady_ms'], '.3f') for x in xs)} | {xs[-1]['replayed']} | "
                     f"{xs[-1]['coexecuted']} | {xs[-1]['eager_chosen']} |")
    (ROOT / "bench" / "results" / f"{args.name}.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
