"""Our engine next to vLLM's CPU build (``python -m labsupport.bench vllm``).

vLLM runs in its own venv (``make vllm`` creates ``.venv-vllm``) and is driven through
:mod:`labsupport.vllm_bridge` (JSON lines to a worker process). Both engines get the same
prompts (the ones of ``bench engine``), greedy, EOS ignored, the same block size, pool size,
most running sequences and thread count, and the same driving loop (add requests until
``max_in_flight`` are unfinished, ``step``, collect). Workloads:

1. one request at a time (``max_in_flight`` 1), 8 × ``--new-tokens``;
2. a batch of 8 (all 8 added at once);
3. 32 queued requests, outputs alternating ``--long`` / ``--short``, 8 running at most;
4. 32 concurrent requests × ``--new-tokens``.

Each is timed ``--repeats`` times, ours and vLLM alternating (a busy machine slows both
alike), after one warm-up; the table shows medians with the spread (min–max), and the ratio
ours/vLLM of tokens per second taken per alternating pair of runs (median, min–max). vLLM's time is measured inside its worker (no pipe time).
Then every request's greedy tokens are compared; a difference is reported at its first
position with our model's logit gap between the two candidates there (fp32: only a near-tie
is an acceptable cause). Nothing here is a test: ratios are printed as they are.

vLLM's defaults differ from ours in two ways that this benchmark aligns: prefix caching is
switched off (it is on by default in vLLM, and repeats of the same prompts would hit it), and
the block size is 32 (vLLM's CPU attention needs a multiple of 32).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ..engine.native_attention import default_backend_line
from ..kv import blocks_needed
from ..timing import median_range
from ..vllm_bridge import HOW_TO, VLLMError, VLLMWorker, drive, first_divergence, latency, requests_for, vllm_python
from .engine import PROMPTS


def unavailable() -> str | None:
    """Why this benchmark cannot run here (no vLLM venv), or None."""
    return None if vllm_python() is not None else HOW_TO


def workloads(prompts: list[list[int]], new_tokens: int, short: int, long: int, batch: int,
              requests: int) -> list[tuple[str, list[dict], int]]:
    """``(name, requests, max_in_flight)`` of the four workloads."""
    queue = (prompts * (-(-requests // len(prompts))))[:requests]
    bimodal = [long if i % 2 == 0 else short for i in range(len(queue))]
    first = prompts[:batch]
    return [(f"1 request at a time ({batch} × {new_tokens})", requests_for(first, new_tokens), 1),
            (f"batch of {batch} ({batch} × {new_tokens})", requests_for(first, new_tokens), batch),
            (f"{len(queue)} queued, {long}/{short} tokens, {batch} running", requests_for(queue, bimodal), batch),
            (f"{len(queue)} concurrent × {new_tokens}", requests_for(queue, new_tokens), len(queue))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labsupport.bench vllm", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gpt2", help="shipped name or local folder (default tiny-gpt2)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for each engine (default 1)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens per request in 1, 2, 4 (default 128)")
    ap.add_argument("--short", type=int, default=32, help="short outputs in 3 (default 32)")
    ap.add_argument("--long", type=int, default=256, help="long outputs in 3 (default 256)")
    ap.add_argument("--batch", type=int, default=8, help="batch size / most running in 3 (default 8)")
    ap.add_argument("--requests", type=int, default=32, help="requests in 3 and 4 (default 32)")
    ap.add_argument("--block-size", type=int, default=32, help="KV block size, a multiple of 32 (default 32)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per workload, median (default 5)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for any one vLLM answer")
    args = ap.parse_args(argv)
    if vllm_python() is None:
        print(f"benchmark 'vllm' cannot run: {HOW_TO}")
        return 2

    from ..engine import LLMEngine
    from ..models import load_model, resolve_path

    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    prompts = [lm.encode(p) for p in PROMPTS]
    jobs = workloads(prompts, args.new_tokens, args.short, args.long, args.batch, args.requests)
    longest = max(len(p) for p in prompts) + max(args.new_tokens, args.long)
    num_blocks = args.requests * blocks_needed(longest, args.block_size) + args.batch
    settings = {"block_size": args.block_size, "max_num_seqs": args.requests, "enable_prefix_caching": False}
    engine = LLMEngine(lm, num_blocks=num_blocks, **settings)
    print(f"vLLM benchmark: model {args.model}, {torch.get_num_threads()} thread(s) each, greedy, EOS ignored, "
          f"block size {args.block_size}, {num_blocks} blocks, max_num_seqs {args.requests}, prefix caching off, "
          f"median of {args.repeats} (min–max); ours: {default_backend_line()}")
    try:
        worker = VLLMWorker(resolve_path(args.model), threads=args.threads, timeout=args.timeout,
                            num_gpu_blocks_override=num_blocks,
                            max_model_len=min(lm.model.config.n_positions, longest),
                            **settings)
    except VLLMError as err:
        print(f"vLLM did not start: {err}")
        return 1
    with worker:
        print(f"vLLM {worker.info['vllm_version']} started in {worker.info['startup_s']:.1f} s; its config: "
              + ", ".join(f"{k} {v}" for k, v in worker.config.items()))
        warm = requests_for(prompts[:2], 8)
        drive(engine, warm)
        worker.run(warm)
        rows = []
        for name, reqs, window in jobs:
            tokens = sum(r["max_tokens"] for r in reqs)
            ours_tps, theirs_tps = [], []
            for _ in range(args.repeats):
                a = drive(engine, reqs, window)
                b = worker.run(reqs, window)
                ours_tps.append(tokens / a["seconds"])
                theirs_tps.append(tokens / b["seconds"])
            diverged = first_divergence(lm, reqs, a["outputs"], b["outputs"])
            rows.append((name, ours_tps, theirs_tps, reqs, a, b, diverged))

    print(f"\n{'workload':<42} {'ours tok/s':>20} {'vLLM tok/s':>20} {'ours/vLLM':>20}  same greedy ids")
    print("-" * 124)
    total = same = 0
    for name, ours_tps, theirs_tps, reqs, _, _, diverged in rows:
        ratios = [a / b for a, b in zip(ours_tps, theirs_tps)]           # per alternating pair of runs
        total += len(reqs)
        same += len(reqs) - len(diverged)
        ratio = f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"
        print(f"{name:<42} {median_range(ours_tps, digits=0):>22} {median_range(theirs_tps, digits=0):>22} {ratio:>20}  "
              f"{len(reqs) - len(diverged)}/{len(reqs)}")
    print(f"\ngreedy token identity: {same}/{total} requests ({100 * same / total:.1f} %)")
    for name, *_, diverged in rows:
        for d in diverged:
            if d["gap"] is None:
                print(f"  {name}, request {d['index']}: different lengths from token {d['position']}")
            else:
                print(f"  {name}, request {d['index']}: first difference at token {d['position']} "
                      f"(ours {d['ours']}, vLLM {d['theirs']}), logit gap {d['gap']:.2e}"
                      f"{' — a near-tie' if d['near_tie'] else ' — NOT a near-tie'}")
    name, *_, a, b, _ = rows[-1]
    la, lb = latency(a["outputs"]), latency(b["outputs"])
    print(f"\nlast run of '{name}': median TTFT ours {1e3 * la['ttft']:.1f} ms, vLLM {1e3 * lb['ttft']:.1f} ms; "
          f"median TPOT ours {1e3 * la['tpot']:.2f} ms, vLLM {1e3 * lb['tpot']:.2f} ms; "
          f"steps ours {a['steps']}, vLLM {b['steps']}")
    print("ratio > 1: ours is faster. vLLM's time excludes the pipe; both use the same driving loop.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
