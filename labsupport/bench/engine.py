"""Benchmark of the paged-KV engine against Hugging Face ``generate`` (``python -m labsupport.bench engine``).

Same prompts, same lengths, greedy, end-of-sequence ignored on both sides (so every request
makes exactly its number of tokens and the token ids can be compared), one torch thread:

1. one request at a time: ``LLMEngine`` vs ``model.generate`` (tokens/s);
2. a batch of 8: ``LLMEngine`` vs ``model.generate`` on a left-padded batch of 8;
3. 32 queued requests, half short and half long: continuous batching (8 running at most)
   vs static batches of 8 with ``model.generate`` (each batch runs until its longest row is
   done: the slot-utilisation argument of Orca, Yu et al., 2022) and vs transformers' own
   continuous batching (``generate_batch``'s manager) — wall clock;
4. KV memory: fraction of allocated KV slots that hold real tokens, paged (block 16) vs a
   contiguous reservation of 1024 tokens per request (Kwon et al., 2023 measure 60–80 % of KV memory wasted by such systems), averaged
   over the steps of the 32-request run.

Every measurement is ``--repeats`` runs after a warm-up, ours and the peer alternating; the
table prints the median with the spread (min–max), and each ratio is taken per alternating pair
(then median and min–max). Nothing here is a test: a ratio below its goal is printed as it is.
"""

from __future__ import annotations

import argparse
import time

import torch

from labsupport.engine.native_attention import default_backend_line
from labsupport.kv import blocks_needed
from labsupport.timing import median_range, time_interleaved
from labsupport.validation import check_int

PROMPTS = [
    "Return the number of items in the list.",
    "If the value is not given, the default",
    "This module provides functions for working with files and directories. The functions",
    "Raise ValueError if the argument is negative.",
    "The default encoding is",
    "Create a new socket using the given address family, socket type and protocol number. The",
    "Return a string containing",
    "This function is called when",
    "Open the file and return a corresponding file object. If the file cannot be opened, an",
    "Return True if the object is",
    "The optional argument",
    "Convert a number or string to an integer, or return 0 if no arguments are given. If",
    "Return the absolute value of",
    "Write the string to the stream and",
    "Read and return at most size bytes from the stream. If the argument is omitted,",
    "Return a new dictionary",
    "The following exceptions are",
    "Return the current time in seconds since the epoch. Fractions of a second may be present",
    "Split the string at the first occurrence of sep, and return a",
    "Return an iterator over",
    "If the optional timeout parameter is given,",
    "Decode the bytes using the codec registered for encoding. The default",
    "Start the thread's activity. It must be called at most once per thread object. It",
    "Remove and return an arbitrary element from the set.",
    "Return the hash value of the object",
    "Wait until the thread terminates. This blocks the calling thread until",
    "Return a copy of the string with",
    "The class attribute",
    "Set the current position of the stream to the given byte offset, which is",
    "Return the list of",
    "Format the exception. With no arguments, the",
    "Return a shallow copy of",
]


EVICT_BYTES = 64 * 2 ** 20
"""What ``cold=True`` writes before each pass: twice the 32 MiB L3 of the machines this course is
measured on, so the weights come from memory, not from a cache."""


@torch.inference_mode()
def weight_pass_seconds(runner, repeats: int = 20, *, cold: bool = False) -> float:
    """The bandwidth floor of a decode step: one row through every weight matrix of the runner
    (its layers' four matrices and the LM head, each a distinct tensor, the fastest one-row kernel),
    fastest of ``repeats`` — nothing else a step does (attention, norms, Python) is in it.

    Back to back (``cold=False``) the passes read the weights from the caches where they fit (the
    tiny target's 16.8 MB fit a 32 MiB L3); with ``cold=True`` :data:`EVICT_BYTES` are written
    before each pass, so it reads them from memory, as every step of a model larger than the cache
    does. A real step lies between the two: between steps the rest of the step, and on a shared
    machine other programs, evict part of the weights."""
    check_int("repeats", repeats, 1)
    mats = [m for layer in runner.layers for m in (layer.c_attn, layer.attn_proj, layer.c_fc, layer.mlp_proj)]
    mats.append(runner.lm_head_linear)
    xs = [torch.randn(1, m.shape[0], device=runner.device, dtype=runner.dtype) for m in mats]
    evict = torch.zeros(EVICT_BYTES // 4) if cold else None

    def one_pass() -> None:
        for m, x in zip(mats, xs):
            m(x)

    return time_interleaved({"pass": one_pass}, repeats=repeats, warmup=2,
                            before=(lambda _: evict.add_(1.0)) if cold else None)["pass"].low


def _paired(ours, peer, repeats: int) -> tuple[list[float], object, list[float], object]:
    """Wall times of two jobs run alternately (ours, peer, ours, peer, …), so a busy machine
    slows both alike; returns ``(times_ours, result_ours, times_peer, result_peer)``."""
    results: dict[str, object] = {}

    def keep(name: str, fn):
        return lambda: results.__setitem__(name, fn())

    t = time_interleaved({"ours": keep("ours", ours), "peer": keep("peer", peer)}, repeats=repeats, warmup=0)
    return list(t["ours"].samples), results["ours"], list(t["peer"].samples), results["peer"]


def _generation_config(max_new: int, pad_id: int):
    from transformers import GenerationConfig

    # eos_token_id=[]: never stop early (None would fall back to the model's own EOS id)
    return GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=[], pad_token_id=pad_id)


@torch.inference_mode()
def hf_batch(model, prompts: list[list[int]], max_new: int, pad_id: int) -> list[list[int]]:
    """``model.generate`` on one left-padded batch; new token ids per row."""
    from ..generation import left_pad

    ids, mask, _ = left_pad(prompts, pad_id, model.device)
    out = model.generate(ids, attention_mask=mask, generation_config=_generation_config(max_new, pad_id))
    return out[:, ids.shape[1]:].tolist()


def hf_continuous(model, prompts: list[list[int]], max_news: list[int], pad_id: int, max_running: int,
                  block_size: int, num_blocks: int) -> tuple[float, list[list[int]]]:
    """transformers' continuous batching (the manager ``generate_batch`` uses), per-request lengths.

    Returns the wall time from the first request to the last result (manager start-up excluded).
    """
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    cb = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks,
                                  max_batch_tokens=max(512, max(len(p) for p in prompts) + max_running),
                                  max_requests_per_batch=max_running)
    config = _generation_config(max(max_news), pad_id)
    config.eos_token_id = -1                                  # no EOS (its manager reads a negative id as none)
    with model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=cb,
                                                   block=True, timeout=10) as manager:
        start = time.perf_counter()
        ids = [manager.add_request(p, max_tokens=n, eos_token_id=-1) for p, n in zip(prompts, max_news)]
        results = {}
        while len(results) < len(ids):
            r = manager.get_result(timeout=5)
            if r is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped before finishing")
            if r is not None and r.is_finished():
                results[r.request_id] = r
        seconds = time.perf_counter() - start
    return seconds, [list(results[i].generated_tokens) for i in ids]


def kv_slot_use(lm, prompts: list[list[int]], max_news: list[int], block_size: int, num_blocks: int,
                max_running: int, reservation: int) -> dict[str, float]:
    """Fraction of allocated KV slots that hold a token, paged vs contiguous, and the paged bound.

    Two views of the same run: averaged over every step (what the pool holds while serving),
    and per request at its longest. Paged allocation is
    ``blocks · block_size`` slots; contiguous is ``reservation`` slots per request (the
    pre-PagedAttention rule of reserving the maximum length up front). ``bound`` is the best
    paging can do: each request holding ``⌈tokens / block_size⌉`` blocks, so only its last block
    is partly empty (on average ``(block_size − 1) / 2`` slots a request; short requests lose the
    largest share). Paged allocation equal to the bound means no block is held that is not needed.
    """
    from ..engine import LLMEngine
    from ..sampling import GREEDY
    from ..serving_math import internal_waste_fraction

    engine = LLMEngine(lm, block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_running)
    for p, n in zip(prompts, max_news):
        engine.add_request(p, GREEDY.replace(ignore_eos=True), max_tokens=n)
    bm = engine.block_manager
    tokens = paged = contiguous = 0
    lengths: list[int] = []                                  # every running request's tokens, every step
    peak: dict[str, tuple[int, int]] = {}                    # request → (tokens, blocks) at its longest
    while engine.has_unfinished_requests():
        engine.step()
        tables = bm.block_tables()
        for rid, table in tables.items():
            n = bm.num_slots(rid)
            tokens += n
            lengths.append(n)
            peak[rid] = max(peak.get(rid, (0, 0)), (n, len(table)))
        paged += bm.num_used_blocks * block_size
        contiguous += len(tables) * reservation
    final_tokens = sum(t for t, _ in peak.values())
    return {"paged_steps": tokens / paged, "contiguous_steps": tokens / contiguous,
            "bound_steps": 1 - internal_waste_fraction(lengths, block_size),
            "paged_final": final_tokens / (block_size * sum(b for _, b in peak.values())),
            "contiguous_final": final_tokens / (reservation * len(peak)),
            "bound_final": 1 - internal_waste_fraction([t for t, _ in peak.values()], block_size)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labsupport.bench engine", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gpt2", help="shipped name, local folder or hub id (default tiny-gpt2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens per request in parts 1–2 (default 128)")
    ap.add_argument("--short", type=int, default=32, help="short outputs in part 3 (default 32)")
    ap.add_argument("--long", type=int, default=256, help="long outputs in part 3 (default 256)")
    ap.add_argument("--requests", type=int, default=32, help="queued requests in part 3 (default 32)")
    ap.add_argument("--batch", type=int, default=8, help="batch size / most running requests (default 8)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement, median (default 5)")
    ap.add_argument("--skip-hf-continuous", action="store_true", help="skip transformers' continuous batching")
    args = ap.parse_args(argv)

    from ..engine import LLMEngine
    from ..models import load_model
    from ..sampling import GREEDY

    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    model, pad = lm.model, lm.tokenizer.pad_token_id
    params = GREEDY.replace(ignore_eos=True)
    prompts = [lm.encode(p) for p in PROMPTS]
    while len(prompts) < args.requests:
        prompts += prompts
    batch = prompts[:args.batch]
    bs, n = args.block_size, args.new_tokens
    print(f"engine benchmark: model {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M "
          f"parameters), {torch.get_num_threads()} torch thread(s), greedy, EOS ignored, block size {bs}, "
          f"median of {args.repeats}, {default_backend_line()}")
    num_blocks = args.batch * blocks_needed(max(map(len, prompts)) + max(n, args.long), bs) + args.batch
    engine = LLMEngine(lm, block_size=bs, num_blocks=num_blocks, max_num_seqs=args.batch)

    def ours_one_by_one():
        return [engine.generate([p], params, max_tokens=n)[0].token_ids for p in batch]

    def hf_one_by_one():
        return [hf_batch(model, [p], n, pad)[0] for p in batch]

    def ours_batch():
        return [o.token_ids for o in engine.generate(batch, params, max_tokens=n)]

    def hf_padded():
        return hf_batch(model, batch, n, pad)

    # warm-up (allocator, kernels, caches) outside the timings
    engine.generate(batch[:2], params, max_tokens=8)
    hf_batch(model, batch[:2], 8, pad)
    rows = []
    t_ours1, ids_ours1, t_hf1, ids_hf1 = _paired(ours_one_by_one, hf_one_by_one, args.repeats)
    total = len(batch) * n
    rows.append((f"1 request at a time ({len(batch)} × {n} tokens)", t_ours1, "HF generate, 1 at a time",
                 t_hf1, "tok/s", 2.0, sum(a == b for a, b in zip(ids_ours1, ids_hf1))))
    t_ours8, ids_ours8, t_hf8, _ = _paired(ours_batch, hf_padded, args.repeats)
    rows.append((f"batch of {len(batch)} ({len(batch)} × {n} tokens)", t_ours8,
                 f"HF generate, padded batch of {len(batch)}", t_hf8, "tok/s", 1.5,
                 sum(a == b for a, b in zip(ids_ours8, ids_hf1))))

    # part 3: queued requests with bimodal output lengths (alternating, so every static batch mixes them)
    queue = prompts[:args.requests]
    max_news = [args.long if i % 2 == 0 else args.short for i in range(len(queue))]
    useful = sum(max_news)
    cb_engine = LLMEngine(lm, block_size=bs, num_blocks=num_blocks, max_num_seqs=args.batch)

    def ours_continuous():
        for p, m in zip(queue, max_news):
            cb_engine.add_request(p, params, max_tokens=m)
        return [o.token_ids for o in cb_engine.run()]

    def hf_static():
        out = []
        for i in range(0, len(queue), args.batch):
            rows_ = hf_batch(model, queue[i:i + args.batch], max(max_news[i:i + args.batch]), pad)
            out += [r[:m] for r, m in zip(rows_, max_news[i:i + args.batch])]
        return out

    t_cb, ids_cb, t_static, ids_static = _paired(ours_continuous, hf_static, args.repeats)
    same_static = sum(a == b for a, b in zip(ids_cb, ids_static))
    rows.append((f"{len(queue)} queued, outputs {args.short}/{args.long} (wall s)", t_cb,
                 f"HF static batches of {args.batch}", t_static, "s", 1.4, same_static))
    if not args.skip_hf_continuous:
        hf_continuous(model, queue[:4], [8] * 4, pad, args.batch, bs, num_blocks)       # warm-up
        ours_times, hf_times = [], []
        for _ in range(args.repeats):                                  # alternate, as in _paired
            start = time.perf_counter()
            ours_continuous()
            ours_times.append(time.perf_counter() - start)
            seconds, ids_hfcb = hf_continuous(model, queue, max_news, pad, args.batch, bs, num_blocks)
            hf_times.append(seconds)                                   # its manager's start-up not counted
        rows.append((f"{len(queue)} queued, outputs {args.short}/{args.long} (wall s)",
                     ours_times, "HF continuous batching (generate_batch)",
                     hf_times, "s", 1.0, sum(a == b for a, b in zip(ids_cb, ids_hfcb))))
    kv = kv_slot_use(lm, queue, max_news, bs, num_blocks, args.batch, 1024)
    floors, cold_floors = [], []
    for t in t_ours1:                                               # each repeat of part 1 next to a floor
        floors.append((t / total) / weight_pass_seconds(engine.runner))
        cold_floors.append((t / total) / weight_pass_seconds(engine.runner, cold=True))

    print(f"\n{'workload':<44} {'ours':>22} {'peer':<40} {'peer':>22} {'unit':<5} {'ratio':>18} {'goal':>5} same ids")
    print("-" * 172)
    for name, ours, peer, theirs, unit, goal, same in rows:       # ours, theirs: wall seconds of each repeat
        if unit == "tok/s":                                       # the same tokens each repeat: rate = total / s
            ours, theirs = [total / t for t in ours], [total / t for t in theirs]
            ratios = [a / b for a, b in zip(ours, theirs)]        # per alternating pair
        else:
            ratios = [b / a for a, b in zip(ours, theirs)]
        total_rows = len(queue) if unit == "s" else len(batch)
        print(f"{name:<44} {median_range(ours):>26} {peer:<40} {median_range(theirs):>26} {unit:<5} {median_range(ratios, unit='×'):>24} "
              f"{goal:>4.1f}× {same}/{total_rows}")
    for view, key in (("averaged over steps", "steps"), ("per request, at its longest", "final")):
        print(f"{'KV slots holding a token, ' + view:<44} {100 * kv['paged_' + key]:>8.1f}% "
              f"{'contiguous reservation of 1024 tokens':<40} {100 * kv['contiguous_' + key]:>8.1f}% "
              f"{'':<5} {'':>18}  bound {100 * kv['bound_' + key]:.1f}%")
    print(f"(bound: every request's blocks cover its tokens and no more, so only its last block of {bs} slots is "
          f"partly empty; paged at the bound = no block held that is not needed)")
    print(f"\nbatch-1 time per token (one request at a time, prefill included) / one pass over the weights at "
          f"one row (the bandwidth floor of a decode step on this machine), goal ≤ 1.3×:\n"
          f"  weights from the caches (passes back to back): {median_range(floors, unit='×')}\n"
          f"  weights from memory ({EVICT_BYTES >> 20} MiB written before each pass): "
          f"{median_range(cold_floors, unit='×')}")
    kinds = {}
    for lin in engine.runner.matrices():                            # the kernels the runner measured and chose
        kinds.setdefault(" / ".join(f"{b}: {k}" for b, k in lin.choices.items()), []).append(lin.shape)
    print("matrix kernels chosen at load (linear.tune; row bucket: kernel): " +
          ";  ".join(f"{', '.join(f'{i}×{o}' for i, o in sorted(set(shapes)))} → {c}" for c, shapes in kinds.items()))
    print(f"\nuseful tokens in part 3: {useful}; static batching computes "
          f"{sum(args.batch * max(max_news[i:i + args.batch]) for i in range(0, len(queue), args.batch))} "
          f"token-rows (every row runs as long as the longest in its batch).")
    print("median (min–max) of the repeats; the ratio is taken per alternating pair of runs.")
    print("ratio: ours/peer for tok/s, peer/ours for wall time (> 1 means ours is faster); "
          "'same ids': requests whose greedy tokens equal the reference (batch-1 runs for the batch of 8).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
