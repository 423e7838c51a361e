"""Inference with Hugging Face `generate()` under Terra against eager, in fresh processes.

A notebook cell that runs a model's `generate()` over a batch of prompts: GPT-2 from a config
(random weights, 2 layers, d=64, 4 heads, vocab 512; nothing downloaded), `--calls` greedy calls
of 12 new tokens for a batch of 2 prompts of 8 tokens, in one loop. Unlike the training programs,
every new token ends in a wait for the GraphRunner (the stopping criteria's `unfinished.max() == 0`
is a Python bool), and the attention kernel on one new token, `_scaled_dot_product_flash_attention_for_cpu`,
gives other bits with one intra-op thread than with two, so it runs with the program's count:
a parallel region of the GraphRunner per layer and token.

Per round, one fresh process per mode (eager, Terra, and each `--variant NAME=VAR=VALUE`), in turn;
each times a first call of `--calls` (a cell run once: tracing and the payoff check's timing
included) and a second one (the cell run again), and prints both calls' times, each co-executed, eager and traced
iteration count and a digest of the generated tokens (Terra's must equal eager's). Results:
bench/results/hf_generate.{json,md}.

    .venv/bin/python bench/hf_generate.py [--rounds 3] [--calls 120] [--variant asleep=TERRA_WORKER_SPIN=sleep]
"""
import argparse
import json
import statistics
import sys
import time

from ab import ROOT, run_child  # bench/ab.py

RESULTS = ROOT / "bench" / "results"


def child(mode, calls):
    sys.path.insert(0, str(ROOT))
    import torch
    from bench.programs import _hf
    transformers = _hf.quiet(_hf.ensure_installed())
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(config).eval()
    prompts = torch.randint(0, 512, (2, 8))

    def generate_all(n):
        outs = []
        for _ in range(n):
            outs.append(model.generate(prompts, max_new_tokens=12, do_sample=False, pad_token_id=0))
        return outs

    run, counts = generate_all, dict  # eager: no Terra imported, as a plain kernel
    if mode == "terra":
        import terra
        keys = ("iterations_coexecuted", "iterations_eager", "iterations_traced")
        run = lambda n: terra.run(generate_all, n)
        counts = lambda: {k: terra.stats().get(k, 0) for k in keys}
    t0 = time.perf_counter()
    run(calls)
    first = time.perf_counter() - t0
    before = counts()
    t0 = time.perf_counter()
    outs = run(calls)
    seconds = time.perf_counter() - t0
    tokens = torch.stack(outs)
    out = {"first_seconds": first, "seconds": seconds, "digest": int((tokens * torch.arange(1, tokens.numel() + 1).view_as(tokens)).sum())}
    out.update({k: v - before[k] for k, v in counts().items()})  # the second call's
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=120)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=VAR=VALUE: Terra again with an environment variable set")
    ap.add_argument("--name", default="hf_generate", help="results file stem")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    modes = [("eager", "eager", None), ("terra", "terra", None)]
    for v in args.variant:
        name, var, value = v.split("=", 2)
        modes.append((name, "terra", {var: value}))
    runs = {name: [] for name, _, _ in modes}
    for r in range(args.rounds):
        for name, mode, env in modes:
            runs[name].append(run_child(__file__, (mode, args.calls), env=env))
            print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    eager = statistics.median(x["seconds"] for x in runs["eager"])
    eager_first = statistics.median(x["first_seconds"] for x in runs["eager"])
    digest = runs["eager"][0]["digest"]
    rows = []
    for name, _, _ in modes:
        xs = runs[name]
        rows.append({"mode": name, "first_seconds": statistics.median(x["first_seconds"] for x in xs),
                     "first_ratio": statistics.median(x["first_seconds"] for x in xs) / eager_first,
                     "seconds": statistics.median(x["seconds"] for x in xs),
                     "ratio": statistics.median(x["seconds"] for x in xs) / eager,
                     "same_tokens": all(x["digest"] == digest for x in xs),
                     "coexecuted": [x.get("iterations_coexecuted") for x in xs],
                     "eager_iterations": [x.get("iterations_eager") for x in xs],
                     "traced": [x.get("iterations_traced") for x in xs]})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"calls": args.calls, "rounds": args.rounds, "runs": runs, "rows": rows}, indent=1))
    lines = [f"# HF generate() under Terra against eager (bench/hf_generate.py)", "",
             f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, {args.rounds} rounds of fresh processes, two calls of "
             f"{args.calls} generate() each (first: the cell run once; second: run again), medians; "
             "iteration counts are the second call's, per round.", "",
             "| mode | first call s | over eager | second call s | over eager | tokens as eager | co-executed | eager | traced |",
             "|---|---:|---:|---:|---:|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['mode']} | {row['first_seconds']:.3f} | {row['first_ratio']:.2f} | "
                     f"{row['seconds']:.3f} | {row['ratio']:.2f} | {row['same_tokens']} | "
                     f"{row['coexecuted']} | {row['eager_iterations']} | {row['traced']} |")
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
