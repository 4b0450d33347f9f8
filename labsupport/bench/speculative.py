"""Benchmark of speculative decoding on this machine (one torch thread).

    python -m labsupport.bench speculative [--max-new-tokens 64] [--repeats 3] [--quick] [--json out.json]

For the shipped target/draft pair and for n-gram prompt lookup, γ = 1..8, greedy and
temperature 0.8, on a prose prompt and a repetitive (JSON-like) one, it measures:

* α (acceptance rate) and tokens per target forward, next to the theory
  ``(1−α^(k+1))/(1−α)`` at the measured α (averaged over the rounds' draft lengths k);
* the step costs: one target decode step, one draft decode step (c = ratio) and the
  verification cost v(γ) = a target forward over γ+1 tokens / one decode step;
* the predicted speed-up ``E[tokens per round] / (γ·c + v(γ))`` and the measured wall-clock
  speed-up over plain target decoding (``labsupport.generation.generate``);
* in the paged engine: batch 1 vs batch 8, plain ``LLMEngine`` vs ``SpecDecodeEngine``.

It reports what it measures; nothing is tuned to show a gain (see
``shared/notes/tiny-model-training.md``: on a CPU verification is not free, v(γ) > 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

PROSE = ("Return the number of items in the sequence. If the optional argument is given, the "
         "default value is used instead of")
REPETITIVE = ('{"id": 1, "name": "alpha", "type": "int", "default": 0},\n'
              '{"id": 2, "name": "beta", "type": "int", "default": 0},\n'
              '{"id": 3, "name": "gamma", "type": "int", "default": 0},\n'
              '{"id": 4, "name": "delta", "type": "int", "default": 0},\n'
              '{"id": 5, "name": "')


def _best_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def run_pairs(target, draft, prompts: dict[str, str], gammas: list[int], temps: list[float], max_new: int,
              repeats: int) -> dict:
    """Plain vs speculative (draft model and n-gram) for every prompt, temperature and γ."""
    from dataclasses import asdict

    from labsupport.sampling import SamplingParams
    from labsupport.speculative import DraftModelProposer, NgramProposer, measure_costs, speedup_sweep

    results = {"rows": [], "costs": {}}
    for pname, text in prompts.items():
        ids = target.encode(text)
        costs = measure_costs(target, draft, ids, gammas=gammas, repeats=max(10, 5 * repeats))
        results["costs"][pname] = {"t_target_ms": 1e3 * costs.t_target, "t_draft_ms": 1e3 * costs.t_draft,
                                   "c": costs.c, "v": costs.v}
        for temp in temps:
            params = SamplingParams(temperature=temp, seed=0, ignore_eos=True)
            for name, make in (("draft", lambda: DraftModelProposer(draft, target)), ("ngram", NgramProposer)):
                for row in speedup_sweep(target, make, ids, params, gammas, max_new, costs, repeats):
                    results["rows"].append(dict(prompt=pname, temperature=temp, proposer=name, **asdict(row)))
    return results


def run_engine(target, draft, prompt: str, max_new: int, gamma: int, repeats: int) -> list[dict]:
    """Paged engine: plain LLMEngine vs SpecDecodeEngine (draft, n-gram) at batch 1 and batch 8."""
    from dataclasses import asdict

    from labsupport.engine.spec_decode import compare_with_engine

    ids = target.encode(prompt)
    return [asdict(compare_with_engine(target, d, ids, batch, gamma=gamma, max_new_tokens=max_new, repeats=repeats))
            for batch in (1, 8) for d in (draft, None)]


def _print_tables(res: dict, engine_rows: list[dict] | None) -> None:
    for pname, c in res["costs"].items():
        vs = "  ".join(f"v({g})={v:.2f}" for g, v in c["v"].items())
        print(f"\n[{pname}] target decode step {c['t_target_ms']:.2f} ms, draft {c['t_draft_ms']:.2f} ms "
              f"→ c = {c['c']:.2f};  {vs}")
    hdr = (f"{'prompt':<10} {'T':>3} {'proposer':<6} {'γ':>2} {'α':>5} {'k̄':>4} {'tok/fwd':>7} {'theory':>6} "
           f"{'Δ%':>5} {'c':>5} {'v':>5} {'pred':>5} {'seed':>5} {'meas':>5}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in res["rows"]:
        d = 100 * (r["tokens_per_round"] - r["theory"]) / r["theory"]
        print(f"{r['prompt']:<10} {r['temperature']:>3g} {r['proposer']:<6} {r['gamma']:>2} {r['alpha']:>5.2f} "
              f"{r['mean_draft']:>4.1f} {r['tokens_per_round']:>7.2f} {r['theory']:>6.2f} {d:>5.1f} {r['c']:>5.2f} "
              f"{r['v']:>5.2f} {r['predicted']:>5.2f} {r['seed_formula']:>5.2f} {r['measured']:>5.2f}")
    print("\nα: accepted/verified drafts; k̄: mean draft length; tok/fwd: tokens per target forward; theory: "
          "(1−α^(k+1))/(1−α); pred: tok/fwd / (k̄c + v); seed: the same with v = 1; meas: wall-clock speed-up.")
    if engine_rows:
        print(f"\n{'batch':>5} {'proposer':<11} {'γ':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'speed-up':>8} "
              f"{'tok/fwd':>7} {'identical':>9} {'pool whole':>10}")
        for r in engine_rows:
            print(f"{r['batch']:>5} {r['proposer']:<11} {r['gamma']:>2} {r['plain_tokens_per_s']:>11.0f} "
                  f"{r['spec_tokens_per_s']:>10.0f} {r['speedup']:>8.2f} {r['tokens_per_round']:>7.2f} "
                  f"{r['identical']!s:>9} {r['pool_whole']!s:>10}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m labsupport.bench speculative``; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m labsupport.bench speculative", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny-gpt2")
    ap.add_argument("--draft", default="tiny-gpt2-draft")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gammas", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--temperatures", default="0,0.8")
    ap.add_argument("--engine-gamma", type=int, default=4)
    ap.add_argument("--no-engine", action="store_true")
    ap.add_argument("--quick", action="store_true", help="γ 1,4,8, greedy only, 1 repeat, 32 tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.gammas, args.temperatures, args.repeats, args.max_new_tokens = "1,4,8", "0", 1, 32
    from labsupport.models import load_model

    target, draft = load_model(args.target, device="cpu"), load_model(args.draft, device="cpu")
    gammas = [int(g) for g in args.gammas.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    print(f"speculative decoding benchmark: target {args.target}, draft {args.draft}, {args.max_new_tokens} new "
          f"tokens, best of {args.repeats}, torch threads {torch.get_num_threads()}")
    res = run_pairs(target, draft, {"prose": PROSE, "repetitive": REPETITIVE}, gammas, temps,
                    args.max_new_tokens, args.repeats)
    engine_rows = None
    if not args.no_engine:
        engine_rows = run_engine(target, draft, PROSE, args.max_new_tokens, args.engine_gamma, args.repeats)
        res["engine"] = engine_rows
    _print_tables(res, engine_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
