"""Benchmark of speculative decoding on this machine (one torch thread).

    python -m labsupport.bench speculative [--max-new-tokens 64] [--repeats 3] [--quick] [--json out.json]

For the shipped target/draft pair and for n-gram prompt lookup, γ = 1..8, greedy and
temperature 0.8, on a prose prompt and a repetitive (JSON-like) one, it measures:

* α (acceptance rate) and tokens per target forward, next to the theory
  ``(1−α^(k+1))/(1−α)`` at the measured α (averaged over the rounds' draft lengths k);
* the step costs: one target decode step, one draft decode step (c = ratio) and the
  verification cost v(γ) = a target forward over γ+1 tokens / one decode step;
* the prompt's prefill in target steps, ``p`` (and the draft model's, ``p_d``: it must read the
  prompt too), timed like the steps;
* the speed-up of the decoding phase ``dec = E[tokens per round] / (γ·c + v(γ))``, the predicted
  end-to-end speed-up for ``n`` new tokens ``(p + n − 1) / (p + p_d + n / dec)`` (the prefill is not
  sped up; plain decoding's first token comes from the prefill) and the measured wall-clock speed-up over plain target decoding
  (``labsupport.generation.generate``);
* in the paged engine: batch 1 vs batch 8, plain ``LLMEngine`` vs ``SpeculativeEngine``;
* then the cheap-draft variants (self-speculation, Medusa heads, token trees, lookahead) of
  :mod:`labsupport.bench.speculative_variants` (``--no-variants`` skips them).

It reports what it measures; nothing is tuned to show a gain (on a CPU verification is not
free: v(γ) > 1, so the measured speed-up is below the v = 1 prediction).

The measuring functions (:func:`measure_costs`, :func:`speedup_sweep`,
:func:`compare_with_engine`) are used by chapter 06 as well.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from labsupport.engine import LLMEngine
from labsupport.engine.native_attention import default_backend_line
from labsupport.generation import generate, prompt_token_ids
from labsupport.kv import blocks_needed
from labsupport.models import LoadedModel
from labsupport.sampling import GREEDY, SamplingParams
from labsupport.speculative import (
    PROSE,
    REPETITIVE,
    DraftModelProposer,
    NgramProposer,
    SpeculativeEngine,
    speculative_generate,
)
from labsupport.timing import median_range, time_interleaved
from labsupport.validation import check_int

from .spec_costs import CostModel, measure_costs, runner_verification_costs

# ============================================================================ the γ sweep


@dataclass
class SweepRow:
    """One γ of :func:`speedup_sweep` (times in seconds, ratios unitless)."""

    gamma: int
    alpha: float                   # measured acceptance rate
    by_position: list[float]       # acceptance per draft position
    tokens_per_round: float        # measured tokens per target forward
    theory: float                  # (1−α^(k+1))/(1−α) at the measured α, averaged over draft lengths k
    mean_draft: float              # k̄, mean draft length actually proposed
    c: float                       # draft cost per drafted token / one target decode step
    v: float                       # verification cost v(round(k̄))
    prefill: float                 # the target's prefill of the prompt / one target decode step
    draft_prefill: float           # the draft model's prefill of the prompt / one target decode step (0: n-gram)
    decode_speedup: float          # tokens_per_round / (k̄·c + v): the decoding phase alone
    predicted: float               # (prefill + n − 1) / (prefill + draft_prefill + n / decode_speedup), n new tokens
    free_verification: float       # tokens_per_round / (k̄·c + 1): the textbook formula (v = 1, no prefill)
    measured: float                # wall-clock speed-up: plain seconds / speculative seconds
    plain_seconds: float
    spec_seconds: float


def _plain_and_speculative(target, proposer, ids, params, max_new_tokens: int, repeats: int):
    """Plain decoding and speculative decoding of one prompt, timed in turn: the last result of each
    and the fastest of ``repeats`` seconds of each."""
    last: dict[str, object] = {}
    jobs = {"plain": lambda: generate(target, ids, params, max_new_tokens=max_new_tokens, record=False),
            "spec": lambda: speculative_generate(target, proposer, ids, params, max_new_tokens=max_new_tokens)}
    timings = time_interleaved({k: (lambda k=k, fn=fn: last.__setitem__(k, fn())) for k, fn in jobs.items()},
                               repeats=repeats, warmup=0)
    return last["plain"], last["spec"], timings["plain"].low, timings["spec"].low


def speedup_sweep(target: LoadedModel, make_proposer: Callable[[int], object], prompt: str | Sequence[int],
                  params: SamplingParams, gammas: Sequence[int], max_new_tokens: int, costs: CostModel,
                  repeats: int = 3) -> list[SweepRow]:
    """Measure speculative decoding against plain decoding for several γ, next to the predictions.

    Plain decoding is :func:`~labsupport.generation.generate` (no per-step records) with the
    same ``params``. For every γ the plain and the speculative run alternate ``repeats`` times
    and the fastest of each counts, so a change in the machine's load hits both sides. Both runs
    include the prompt's prefill, and so does the prediction (the draft model prefills the prompt
    too; n-gram lookup has nothing to prefill). c is the proposer's own drafting time per drafted
    token in the (last) speculative run over a target decode step: for a draft model its forwards
    and, when sampling, drawing each token from q; for n-gram lookup the search.

    Args:
        make_proposer: γ → a fresh proposer (e.g. ``lambda g: DraftModelProposer(draft, target, g)``).
        params: sampling settings; use ``ignore_eos=True`` so both runs emit ``max_new_tokens``
            (the prediction counts the tokens each run made).
        costs: from :func:`measure_costs` on the same machine (its ``v`` must cover the γs; with
            the draft model when the proposers draft with one, for its prefill).

    The prediction: plain decoding costs ``p + n − 1`` target steps (the prefill's forward already
    gives the first token), speculative decoding ``p + p_d + n / dec`` (it prefills all of the prompt
    but its last token, which the first round feeds).

    Returns:
        One :class:`SweepRow` per γ.

    Raises:
        TypeError / ValueError: ``repeats`` not an integer >= 1. ValueError: a draft-model
            proposer with ``costs`` measured without the draft model (no draft prefill).
    """
    check_int("repeats", repeats, 1)
    ids = prompt_token_ids(target, prompt)
    rows = []
    for g in gammas:
        prop = make_proposer(int(g))
        plain, res, plain_s, spec_s = _plain_and_speculative(target, prop, ids, params, max_new_tokens, repeats)
        st = res.stats
        k_mean = st.mean_draft_length
        c = st.draft_seconds / max(st.proposed, 1) / costs.t_target    # this run's drafting, sampling included
        v = costs.v.get(max(1, round(k_mean)), costs.v[max(costs.v)])
        dec = st.tokens_per_round / (k_mean * c + v)
        p, p_d = costs.prefill, (costs.draft_prefill if isinstance(prop, DraftModelProposer) else 0.0)
        if isinstance(prop, DraftModelProposer) and costs.t_draft_prefill == 0:
            raise ValueError("costs holds no draft prefill (measure_costs ran with draft=None), but the proposer "
                             "drafts with a model: measure the costs with that draft model")
        n_plain, n_spec = len(plain.token_ids), len(res.token_ids)
        rows.append(SweepRow(gamma=int(g), alpha=st.alpha, by_position=st.acceptance_by_position,
                             tokens_per_round=st.tokens_per_round, theory=st.theory_tokens_per_round,
                             mean_draft=k_mean, c=c, v=v, prefill=p, draft_prefill=p_d, decode_speedup=dec,
                             predicted=(p + n_plain - 1) / (p + p_d + n_spec / dec),
                             free_verification=st.tokens_per_round / (k_mean * c + 1.0), measured=plain_s / spec_s,
                             plain_seconds=plain_s, spec_seconds=spec_s))
    return rows



# ============================================================================ paged engine


@dataclass
class EngineComparison:
    """Plain ``LLMEngine`` vs :class:`SpeculativeEngine` on one batch (fastest of the repeats)."""

    batch: int
    proposer: str
    gamma: int
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    speedup: float
    tokens_per_round: float
    identical: bool             # same token ids as the plain engine (expected for greedy)
    pool_whole: bool            # every block free again after the run


def compare_with_engine(target: LoadedModel, draft: LoadedModel | None, prompt: Sequence[int], batch: int, *,
                        gamma: int = 4, max_new_tokens: int = 32, params: SamplingParams = GREEDY,
                        block_size: int = 16, repeats: int = 2) -> EngineComparison:
    """Time ``batch`` copies of ``prompt`` through the plain engine and the speculative engine.

    Both get the same pool (enough blocks for every sequence at once) and ``max_num_seqs =
    batch``. Wall-clock; use one torch thread.

    Raises:
        TypeError / ValueError: ``batch`` or ``repeats`` not an integer >= 1.
    """
    check_int("batch", batch, 1)
    check_int("repeats", repeats, 1)
    prompts = [list(prompt)] * batch
    blocks = batch * (blocks_needed(len(prompt) + max_new_tokens + gamma, block_size) + 1)
    state: dict[str, object] = {}

    def build(job: str) -> None:                  # the speculative engine is made untimed, fresh for each run
        if job == "spec":
            proposer = DraftModelProposer(draft, target, gamma) if draft is not None else NgramProposer(gamma)
            state["eng"] = SpeculativeEngine(target, proposer, block_size=block_size, num_blocks=blocks,
                                             max_num_seqs=batch)

    def plain_run() -> None:
        state["plain"] = LLMEngine(target, block_size=block_size, num_blocks=blocks, max_num_seqs=batch).generate(
            prompts, params, max_new_tokens)

    def spec_run() -> None:
        state["outs"] = state["eng"].generate(prompts, params, max_new_tokens)

    timings = time_interleaved({"plain": plain_run, "spec": spec_run}, repeats=repeats, warmup=0, before=build)
    plain, outs, eng = state["plain"], state["outs"], state["eng"]
    best_plain, best_spec = timings["plain"].low, timings["spec"].low
    tokens = sum(len(o.token_ids) for o in outs)
    return EngineComparison(batch=batch, proposer="draft model" if draft is not None else "n-gram", gamma=gamma,
                            plain_tokens_per_s=sum(len(o.token_ids) for o in plain) / best_plain,
                            spec_tokens_per_s=tokens / best_spec, speedup=best_plain / best_spec,
                            tokens_per_round=sum(o.spec_stats.tokens_per_round for o in outs) / batch,
                            identical=[o.token_ids for o in outs] == [o.token_ids for o in plain],
                            pool_whole=eng.block_manager.num_free_blocks == blocks)


# ============================================================================ the command line


def run_pairs(target, draft, prompts: dict[str, str], gammas: list[int], temps: list[float], max_new: int,
              repeats: int) -> dict:
    """Plain vs speculative (draft model and n-gram) for every prompt, temperature and γ."""
    results = {"rows": [], "costs": {}}
    for pname, text in prompts.items():
        ids = target.encode(text)
        costs = measure_costs(target, draft, ids, gammas=gammas, repeats=max(10, 5 * repeats))
        results["costs"][pname] = {"t_target_ms": 1e3 * costs.t_target, "t_draft_ms": 1e3 * costs.t_draft,
                                   "c": costs.c, "v": costs.v, "prefill": costs.prefill,
                                   "draft_prefill": costs.draft_prefill}
        for temp in temps:
            params = SamplingParams(temperature=temp, seed=0, ignore_eos=True)
            for name, make in (("draft", lambda g: DraftModelProposer(draft, target, g)), ("ngram", NgramProposer)):
                for row in speedup_sweep(target, make, ids, params, gammas, max_new, costs, repeats):
                    results["rows"].append(dict(prompt=pname, temperature=temp, proposer=name, **asdict(row)))
    return results


def run_engine(target, draft, prompt: str, max_new: int, gamma: int, repeats: int) -> list[dict]:
    """Paged engine: plain LLMEngine vs SpeculativeEngine (draft, n-gram) at batch 1 and batch 8."""
    ids = target.encode(prompt)
    return [asdict(compare_with_engine(target, d, ids, batch, gamma=gamma, max_new_tokens=max_new, repeats=repeats))
            for batch in (1, 8) for d in (draft, None)]


def _print_tables(res: dict, engine_rows: list[dict] | None) -> None:
    for pname, c in res["costs"].items():
        vs = "  ".join(f"v({g})={v:.2f}" for g, v in c["v"].items())
        print(f"\n[{pname}] target decode step {c['t_target_ms']:.2f} ms, draft {c['t_draft_ms']:.2f} ms "
              f"→ c = {c['c']:.2f};  {vs};  prefill of the prompt: target {c['prefill']:.1f} steps, "
              f"draft {c['draft_prefill']:.1f}")
    hdr = (f"{'prompt':<10} {'T':>3} {'proposer':<6} {'γ':>2} {'α':>5} {'k̄':>4} {'tok/fwd':>7} {'theory':>6} "
           f"{'Δ%':>5} {'c':>5} {'v':>5} {'dec':>5} {'pred':>5} {'v=1':>5} {'meas':>5}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in res["rows"]:
        d = 100 * (r["tokens_per_round"] - r["theory"]) / r["theory"]
        print(f"{r['prompt']:<10} {r['temperature']:>3g} {r['proposer']:<6} {r['gamma']:>2} {r['alpha']:>5.2f} "
              f"{r['mean_draft']:>4.1f} {r['tokens_per_round']:>7.2f} {r['theory']:>6.2f} {d:>5.1f} {r['c']:>5.2f} "
              f"{r['v']:>5.2f} {r['decode_speedup']:>5.2f} {r['predicted']:>5.2f} {r['free_verification']:>5.2f} "
              f"{r['measured']:>5.2f}")
    print("\nα: accepted/verified drafts; k̄: mean draft length; tok/fwd: tokens per target forward; theory: "
          "(1−α^(k+1))/(1−α); dec: tok/fwd / (k̄c + v), the decoding phase; pred: (p + n − 1) / (p + p_d + n / dec), "
          "the prefill p (and the draft's p_d) not sped up; v=1: tok/fwd / (k̄c + 1), free verification and no "
          "prefill; meas: wall-clock speed-up.")
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
    ap.add_argument("--no-variants", action="store_true", help="skip the self-speculation / Medusa / lookahead table")
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
          f"tokens, best of {args.repeats}, torch threads {torch.get_num_threads()}, {default_backend_line()}")
    v = runner_verification_costs(target, PROSE, gammas, repeats=max(3, args.repeats))
    print("\nverification cost of the paged runner, v(γ) = forward over γ + 1 tokens / one-token forward "
          f"(median, range of {max(3, args.repeats)} repeats, each the fastest of 5):")
    for g in gammas:
        print(f"  v({g}) = {median_range(v[g])}")
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
    if not args.no_variants:
        from labsupport.bench import speculative_variants
        print()
        speculative_variants.main(["--repeats", str(args.repeats), "--max-new-tokens", str(args.max_new_tokens),
                                   "--threads", str(args.threads)] + (["--quick"] if args.quick else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
