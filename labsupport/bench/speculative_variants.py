"""Benchmark of the cheap-draft speculative variants in the paged engine (one torch thread).

    python -m labsupport.bench speculative-variants [--max-new-tokens 48] [--repeats 3] [--quick]

(also run at the end of ``python -m labsupport.bench speculative``). For plain decoding,
self-speculation (k = 1, 2, 3 layers), Medusa heads (a chain and a token tree), lookahead, EAGLE,
suffix decoding and — as the baseline without any model, chapter 06's — n-gram prompt lookup, on the prose and the repetitive prompt, at batch 1 and 8, it measures in one run:

* α per position (acceptance at draft depth i, given depth i was reached) and tokens per
  target forward;
* the draft cost per round ``c_round`` (drafting seconds per round) and the verification cost
  ``v`` (verifying seconds per round: the forward over all nodes, acceptance, KV compaction; a
  proposer's work after the round, such as EAGLE running its head over the accepted tokens, is
  drafting), both
  in units of one plain round of the same run, and ``v_forward``: a bare target forward over the
  round's mean number of nodes timed apart (fastest of repeats), for comparison;
* the prompt's prefill ``p`` in plain rounds (the target's forward over the prompt and the
  proposer's start: EAGLE's head reads the prompt's features too): paid once per request, not sped up;
* the speed-up of the decoding phase ``tokens per round / (c_round + v)`` (what a long generation
  approaches), the predicted end-to-end speed-up with the prefill, ``(p₀ + n) / (p + n·(c_round +
  v) / tokens per round)`` for ``n`` new tokens, ``p₀`` plain decoding's prefill (Amdahl's law: the
  prefill is the part that does not shrink), and the measured wall-clock speed-up over plain decoding through the same engine: each
  repeat runs plain and the method back to back, the speed-up is the median of those paired
  ratios, printed with their range;
* extra memory (parameters; nodes per round);
* and for the best method at batch 1, the speed-up at batch 1, 2, 4, 8, 16 (where it stops paying).
  The batch sizes the table measured (1 and 8) are taken from the table's runs, not measured
  again: the "best at batch 1" line and the sweep print the same numbers.

The measuring functions are used by chapter 07 as well. Nothing is tuned to show a gain.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from labsupport.engine.block_manager import BlockManager
from labsupport.engine.extend import extend
from labsupport.engine.model_runner import ModelRunner
from labsupport.engine.native_attention import default_backend_line
from labsupport.kv import blocks_needed
from labsupport.models import LoadedModel
from labsupport.sampling import GREEDY, SamplingParams
from labsupport.speculative import PROSE, REPETITIVE
from labsupport.speculative.eagle import EagleProposer, load_eagle
from labsupport.speculative.engine import SpeculativeEngine
from labsupport.speculative.lookahead import LookaheadProposer
from labsupport.speculative.medusa import MedusaProposer, load_medusa
from labsupport.speculative.proposers import NgramProposer
from labsupport.speculative.self_spec import SelfSpecProposer
from labsupport.speculative.suffix import SuffixProposer
from labsupport.timing import median_range, time_interleaved
from labsupport.validation import check_int

SIZES = (1, 2, 4, 8, 12, 16, 20)      # forward sizes timed for v_forward (interpolated between)


def default_methods(target: LoadedModel, heads=None, eagle=None) -> dict[str, Callable[[], object]]:
    """Name → factory of a fresh proposer (``None`` = plain decoding), the chapter's line-up."""
    heads = heads if heads is not None else load_medusa()
    eagle = eagle if eagle is not None else load_eagle()
    return {"plain": lambda: None,
            "self-spec k=1": lambda: SelfSpecProposer(1, 3), "self-spec k=2": lambda: SelfSpecProposer(2, 3),
            "self-spec k=3": lambda: SelfSpecProposer(3, 3),
            "medusa chain": lambda: MedusaProposer(heads, widths=(1, 1, 1)),
            "medusa tree": lambda: MedusaProposer(heads, widths=(3, 2, 1)),
            "lookahead": lambda: LookaheadProposer(window=4, ngram=4, max_candidates=3),
            "n-gram γ=4": lambda: NgramProposer(4), "suffix γ=8": lambda: SuffixProposer(8),
            "eagle γ=3": lambda: EagleProposer(eagle, 3), "eagle γ=5": lambda: EagleProposer(eagle, 5)}


@torch.no_grad()
def forward_costs(target: LoadedModel, context: Sequence[int], sizes: Sequence[int], batch: int = 1,
                  repeats: int = 10) -> dict[int, float]:
    """Seconds of one paged target forward over ``n`` new tokens for each of ``batch`` sequences holding
    ``context`` (fastest of the repeats, after two warm-ups; the sizes interleaved)."""
    blocks = batch * (blocks_needed(len(context) + max(sizes), 16) + 1)
    runner, bm = ModelRunner(target, 16, blocks), BlockManager(blocks, 16)
    extend(runner, bm, {b: list(context) for b in range(batch)}, all_logits=False)
    def forward(n: int):
        return lambda: extend(runner, bm, {b: [context[-1]] * n for b in range(batch)}, return_hidden=True)

    def undo(_n: int) -> None:                       # drop the appended K/V: every call starts from the context
        for b in range(batch):
            bm.truncate(b, len(context))

    timings = time_interleaved({n: forward(n) for n in sizes}, repeats=repeats, warmup=2, after=undo)
    return {n: t.low for n, t in timings.items()}


@dataclass
class MethodRow:
    """One method × prompt × batch of :func:`measure_methods` (times in seconds)."""

    method: str
    prompt: str
    batch: int
    alpha_by_position: list[float]
    tokens_per_round: float
    nodes_per_round: float          # tokens fed per sequence per verification forward (root included)
    c_round: float                  # drafting time per round / one plain round
    v: float                        # verification time per round / one plain round
    v_forward: float                # a bare forward over the mean nodes / a bare 1-token forward (timed apart)
    prefill: float                  # this method's prompt prefill (target forward + proposer start) / one plain round
    decode_speedup: float           # tokens_per_round / (c_round + v): the decoding phase alone
    predicted: float                # (plain's prefill + n) / (prefill + n / decode_speedup), n = new tokens (plain rounds)
    measured: float                 # median of measured_runs
    measured_runs: list[float]      # plain seconds / method seconds per repeat (run back to back), same engine
    seconds: float
    plain_seconds: float
    extra_parameters: int
    tree_kv_bytes: int              # KV bytes of the candidates per sequence while a round is verified
    identical: bool                 # output token-identical to plain (greedy)


def _run(target, make, prompts, params, max_new, block_size=16):
    proposer = make()
    extra = 0 if proposer is None else proposer.max_draft_tokens
    blocks = len(prompts) * (blocks_needed(len(prompts[0]) + max_new + extra, block_size) + 1)
    eng = SpeculativeEngine(target, proposer, block_size=block_size, num_blocks=blocks, max_num_seqs=len(prompts))
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params, max_new)
    return time.perf_counter() - t0, eng, outs


def measure_methods(target: LoadedModel, methods: dict[str, Callable[[], object]], prompts: dict[str, str],
                    batches: Sequence[int] = (1, 8), max_new_tokens: int = 48, repeats: int = 3,
                    params: SamplingParams = GREEDY) -> list[MethodRow]:
    """Every method against plain decoding, interleaved repeats, medians; see the module docstring.

    Raises:
        TypeError / ValueError: ``repeats`` or ``max_new_tokens`` not an integer >= 1.
    """
    check_int("repeats", repeats, 1)
    check_int("max_new_tokens", max_new_tokens, 1)
    params = SamplingParams(**{**asdict(params), "ignore_eos": True}) if not params.ignore_eos else params
    rows = []
    for pname, text in prompts.items():
        ids = target.encode(text)
        for batch in batches:
            fwd = forward_costs(target, ids + ids[-1:] * (max_new_tokens // 2), SIZES, batch, repeats=5)
            timed = {m: [] for m in methods}                   # (seconds, drafting s, verifying s, rounds) per run
            runs = {}
            for r in range(repeats + 1):                         # the first pass is a warm-up
                for m, make in methods.items():
                    dt, eng, outs = _run(target, make, [ids] * batch, params, max_new_tokens)
                    if r:
                        timed[m].append((dt, eng.draft_seconds, eng.target_seconds, eng.num_rounds,
                                         eng.prefill_seconds))
                    runs[m] = (eng, outs)
            # the parts come from each method's median run, like the measured time (one busy spike
            # in another run must not enter the prediction and not the measurement)
            parts = {m: sorted(timed[m])[(len(timed[m]) - 1) // 2][1:] for m in methods}
            parts_s = {m: statistics.median(t[0] for t in timed[m]) for m in methods}
            plain_s = parts_s["plain"]
            plain_outs = runs["plain"][1]
            t_round = (parts["plain"][0] + parts["plain"][1]) / parts["plain"][2]
            n = parts["plain"][2]                                # plain rounds: one token per sequence each
            prefill = {m: parts[m][3] / t_round for m in methods}  # each method's prefill, in plain rounds
            ratios = {m: [p[0] / t[0] for p, t in zip(timed["plain"], timed[m])] for m in methods}
            for m in methods:
                eng, outs = runs[m]
                st = outs[0].spec_stats
                nodes = eng.num_verified_tokens / eng.num_rounds / batch
                t_nodes = float(np.interp(nodes, SIZES, [fwd[n] for n in SIZES]))
                c = parts[m][0] / parts[m][2] / t_round
                v = parts[m][1] / parts[m][2] / t_round
                tpr = sum(o.spec_stats.produced for o in outs) / sum(o.spec_stats.rounds for o in outs)
                decode = tpr / (c + v)
                heads = getattr(eng.proposer, "heads", None) or getattr(eng.proposer, "head", None)   # Medusa, EAGLE
                rows.append(MethodRow(method=m, prompt=pname, batch=batch, alpha_by_position=st.acceptance_by_position,
                                      tokens_per_round=tpr, nodes_per_round=nodes, c_round=c, v=v,
                                      v_forward=t_nodes / fwd[1], prefill=prefill[m], decode_speedup=decode,
                                      predicted=(prefill["plain"] + n) / (prefill[m] + n / decode),
                                      measured=statistics.median(ratios[m]),
                                      measured_runs=ratios[m], seconds=parts_s[m], plain_seconds=plain_s,
                                      extra_parameters=heads.num_parameters if heads is not None else 0,
                                      tree_kv_bytes=int((nodes - 1) * eng.runner.kv_bytes_per_token),
                                      identical=[o.token_ids for o in outs] == [o.token_ids for o in plain_outs]))
    return rows


def batch_sweep_runs(target: LoadedModel, make: Callable[[], object], prompt: str,
                     batches: Sequence[int] = (1, 2, 4, 8, 16), max_new_tokens: int = 32, repeats: int = 3,
                     known: Mapping[int, Sequence[float]] | None = None) -> dict[int, list[float]]:
    """Speed-ups of one method over plain decoding at each batch size: per repeat, plain seconds /
    method seconds of two runs back to back (greedy, ``ignore_eos``; one warm-up pair first).

    Args:
        known: speed-ups already measured the same way (e.g. ``MethodRow.measured_runs`` of
            :func:`measure_methods` at the same ``max_new_tokens``), by batch size: those batch
            sizes are not measured again, so a summary and the sweep quote the same runs.

    Raises:
        TypeError / ValueError: ``repeats`` or a batch size not an integer >= 1.
    """
    check_int("repeats", repeats, 1)
    ids = target.encode(prompt)
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    known = known or {}
    out = {}
    for batch in batches:
        check_int("batch", batch, 1)
        if batch in known:
            out[batch] = list(known[batch])
            continue
        out[batch] = []
        for r in range(repeats + 1):
            a = _run(target, lambda: None, [ids] * batch, params, max_new_tokens)[0]
            b = _run(target, make, [ids] * batch, params, max_new_tokens)[0]
            if r:
                out[batch].append(a / b)
    return out


def batch_sweep(target: LoadedModel, make: Callable[[], object], prompt: str, batches: Sequence[int] = (1, 2, 4, 8, 16),
                max_new_tokens: int = 32, repeats: int = 3,
                known: Mapping[int, Sequence[float]] | None = None) -> dict[int, float]:
    """Median speed-up of one method over plain decoding at each batch size (see :func:`batch_sweep_runs`)."""
    runs = batch_sweep_runs(target, make, prompt, batches, max_new_tokens, repeats, known)
    return {batch: statistics.median(r) for batch, r in runs.items()}


GOALS = {"prose": 1.5, "repetitive": 2.0}
"""Speed-up goals at batch 1 for the best method on each prompt (checked end to end and for the
decoding phase alone: a short generation after a long prompt spends a share of its time in the
prefill, which no speculative method shortens)."""


def print_rows(rows: list[MethodRow]) -> None:
    hdr = (f"{'prompt':<10} {'batch':>5} {'method':<14} {'α by position':<18} {'tok/fwd':>7} {'nodes':>5} "
           f"{'c':>5} {'v':>5} {'v_fwd':>5} {'pre':>5} {'dec':>5} {'pred':>5} {'meas':>5} {'range':>9} {'Δ%':>5} {'params':>7} {'KV kB':>5} {'same':>5}")
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        a = " ".join("  - " if math.isnan(x) else f"{x:.2f}" for x in r.alpha_by_position[:3])
        d = 100 * (r.predicted - r.measured) / r.measured
        print(f"{r.prompt:<10} {r.batch:>5} {r.method:<14} {a:<18} {r.tokens_per_round:>7.2f} {r.nodes_per_round:>5.1f} "
              f"{r.c_round:>5.2f} {r.v:>5.2f} {r.v_forward:>5.2f} {r.prefill:>5.1f} {r.decode_speedup:>5.2f} "
              f"{r.predicted:>5.2f} {r.measured:>5.2f} "
              f"{min(r.measured_runs):>4.2f}–{max(r.measured_runs):<4.2f} {d:>5.0f} {r.extra_parameters:>7} "
              f"{r.tree_kv_bytes / 1e3:>5.0f} {r.identical!s:>5}")
    print("α by position: acceptance at draft depth 1, 2, 3 given it was reached; tok/fwd: tokens per target "
          "forward; nodes: tokens verified per forward; c: drafting and v: verifying per round, both in plain "
          "rounds of the same run; v_fwd: a bare forward over that many nodes / one token, timed apart; params: "
          "extra weights; KV kB: the candidates' KV per sequence during verification; pre: the prompt's prefill in "
          "plain rounds (the target's and the proposer's, paid once); dec = tok/fwd / (c + v): the decoding phase's "
          "speed-up; pred = (plain's pre + n) / (pre + n / dec) for n new tokens: end to end, the prefill not sped "
          "up; meas: "
          "wall-clock speed-up over plain decoding (median of the repeats, each plain and the method back to back), "
          "range: the repeats' lowest and highest.")


def kernel_choice_line(runner: ModelRunner) -> str:
    """The matmul kernel each matrix shape uses per row bucket (``linear.tune``'s choice, cached per machine):
    verification cost, and so every ratio below, depends on it."""
    from labsupport.engine.linear import cache_path

    shapes = "; ".join(f"{key[0][0]}×{key[0][1]}: " + ", ".join(f"{b} {k}" for b, k in sorted(choice.items()))
                       for key, choice in runner.kernel_choices.items())
    return f"matmul kernel per row bucket (chosen once per machine, cached in {cache_path()}): {shapes}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m labsupport.bench speculative-variants``."""
    ap = argparse.ArgumentParser(prog="python -m labsupport.bench speculative-variants",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 32 tokens, batch 1 only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from labsupport.models import load_model
    target = load_model("tiny-gpt2", device="cpu")
    if args.quick:
        args.repeats, args.max_new_tokens = 1, 32
    methods = default_methods(target)
    print(f"speculative variants: tiny-gpt2, {args.max_new_tokens} new tokens, greedy, median of {args.repeats}, "
          f"torch threads {torch.get_num_threads()}, {default_backend_line()}")
    print(kernel_choice_line(ModelRunner(target, 16, 4)))
    rows = measure_methods(target, methods, {"prose": PROSE, "repetitive": REPETITIVE},
                           batches=(1,) if args.quick else (1, 8), max_new_tokens=args.max_new_tokens,
                           repeats=args.repeats)
    print_rows(rows)
    for prompt, goal in GOALS.items():                  # the goals: the best method per prompt at batch 1
        top = max((r for r in rows if r.batch == 1 and r.method != "plain" and r.prompt == prompt),
                  key=lambda r: r.measured)
        plain = next(r for r in rows if (r.batch, r.method, r.prompt) == (1, "plain", prompt))
        share = plain.prefill / (plain.prefill + args.max_new_tokens)
        print(f"\nbest at batch 1 on the {prompt} prompt: {top.method}, end to end "
              f"{median_range(top.measured_runs, unit='×')} (goal {goal}×: {'met' if top.measured >= goal else 'missed'}); "
              f"the decoding phase {top.decode_speedup:.2f}× (goal {'met' if top.decode_speedup >= goal else 'missed'}), "
              f"the prefill {share:.0%} of plain decoding's time; output identical: {top.identical}", end="")
    print()
    best = max((r for r in rows if r.batch == 1 and r.method != "plain"), key=lambda r: r.measured)
    known = {r.batch: r.measured_runs for r in rows if (r.method, r.prompt) == (best.method, best.prompt)}
    sweep = batch_sweep_runs(target, methods[best.method], PROSE if best.prompt == "prose" else REPETITIVE,
                             batches=(1, 2, 4) if args.quick else (1, 2, 4, 8, 16),
                             max_new_tokens=args.max_new_tokens, repeats=args.repeats, known=known)
    medians = {b: statistics.median(r) for b, r in sweep.items()}
    print(f"best of all at batch 1: {best.method} on the {best.prompt} prompt, {median_range(sweep[1], unit='×')}")
    from labsupport.speculative.policy import break_even_batch
    print("speed-up by batch size (median, range): " + ";  ".join(f"{b}: {median_range(r, unit='×')}" for b, r in sweep.items())
          + f"; stops paying at batch {break_even_batch(medians)}"
          + f"  (batch {', '.join(str(b) for b in sorted(known))}: the table's runs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [asdict(r) for r in rows], "sweep": sweep}, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
