"""Benchmark of the KV cache on this machine: cached vs uncached generation, prefill vs decode.

    python -m labsupport.bench kv-cache [--new-tokens 64 256 512] [--prompt-len 16] [--repeats 3]
                                        [--threads 1] [--model tiny-gpt2]

Greedy generation (EOS ignored, so every run makes exactly n tokens) with
:func:`labsupport.generation.generate`, once with ``use_cache=False`` (every step recomputes
the whole sequence) and once with ``use_cache=True`` (prefill once, then one token per step).
It prints the wall-clock time of each, the speed-up, the token-forward ratio the counting
predicts, and checks that both produce the same tokens. Times are measured, never asserted.

The measuring helpers here are also used by the KV-cache chapter.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..generation import generate, token_forwards
from ..models import LoadedModel, model_forward
from ..sampling import SamplingParams
from ..validation import check_int

#: Greedy, never stopping on EOS: a run makes exactly ``max_new_tokens`` tokens.
FIXED_LENGTH_GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)

TEXT = ("Return a new list containing all items from the iterable in ascending order. A custom key "
        "function can be supplied to customize the sort order, and the reverse flag can be set to "
        "request the result in descending order. ")


def prompt_of_length(lm: LoadedModel, n_tokens: int, text: str = TEXT) -> list[int]:
    """The first ``n_tokens`` token ids of ``text`` repeated as often as needed.

    Raises:
        TypeError: a count that is not an integer.
        ValueError: ``n_tokens < 1``.
    """
    check_int("n_tokens", n_tokens, 1)
    one = lm.encode(text)
    return (one * (n_tokens // len(one) + 1))[:n_tokens]


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


@dataclass
class CacheTiming:
    """One row of the cached-vs-uncached comparison (seconds: the best of the repeats)."""

    new_tokens: int
    uncached_s: float
    cached_s: float
    identical: bool
    forwards_uncached: int
    forwards_cached: int

    @property
    def speedup(self) -> float:
        return self.uncached_s / self.cached_s

    @property
    def forwards_ratio(self) -> float:
        return self.forwards_uncached / self.forwards_cached


def time_cached_vs_uncached(lm: LoadedModel, prompt_ids: Sequence[int], new_tokens: Sequence[int],
                            repeats: int = 1) -> list[CacheTiming]:
    """Wall-clock time of greedy generation with and without the KV cache, for each ``n`` in ``new_tokens``.

    The two runs alternate ``repeats`` times and the fastest of each is kept: on a shared
    machine the minimum is the run least disturbed by other processes (as ``timeit`` does).

    Returns:
        One :class:`CacheTiming` per ``n``; ``identical`` says whether both runs gave the same tokens.

    Raises:
        TypeError: a count that is not an integer.
        ValueError: ``repeats < 1`` or a length beyond the model's positions (from ``generate``).
    """
    check_int("repeats", repeats, 1)
    rows = []
    for n in new_tokens:
        times_none, times_cache = [], []
        for _ in range(repeats):
            t, r_none = _timed(generate, lm, prompt_ids, FIXED_LENGTH_GREEDY, max_new_tokens=n, use_cache=False,
                               record=False)
            times_none.append(t)
            t, r_cache = _timed(generate, lm, prompt_ids, FIXED_LENGTH_GREEDY, max_new_tokens=n, use_cache=True,
                                record=False)
            times_cache.append(t)
        rows.append(CacheTiming(n, min(times_none), min(times_cache), r_none.token_ids == r_cache.token_ids,
                                r_none.token_forwards, r_cache.token_forwards))
    return rows


@dataclass
class PrefillDecode:
    """Prefill of a prompt vs decode steps (seconds; the best of the repeats)."""

    prompt_len: int
    prefill_s: float
    decode_s: float          # one decode step (one new token with the cache)

    @property
    def prefill_per_token_s(self) -> float:
        return self.prefill_s / self.prompt_len

    @property
    def ratio(self) -> float:
        """How many decode steps one prefill of the whole prompt costs."""
        return self.prefill_s / self.decode_s


@torch.no_grad()
def time_prefill_decode(lm: LoadedModel, prompt_len: int = 256, decode_steps: int = 32,
                        repeats: int = 3) -> PrefillDecode:
    """Time one prefill of ``prompt_len`` tokens and the mean decode step after it (KV cache, greedy).

    Each of the ``repeats`` runs is one request; the fastest prefill and the fastest mean decode
    step are kept.

    Raises:
        TypeError: a count that is not an integer.
        ValueError: ``prompt_len`` or ``decode_steps`` < 1, or too long for the model.
    """
    check_int("decode_steps", decode_steps, 1)
    ids = torch.tensor([prompt_of_length(lm, prompt_len)], device=lm.device)
    prefills, decodes = [], []
    for _ in range(repeats):
        times = request_token_times(lm, ids[0].tolist(), decode_steps + 1)
        prefills.append(times[0])
        decodes.append((times[-1] - times[0]) / decode_steps)
    return PrefillDecode(prompt_len, min(prefills), min(decodes))


@torch.no_grad()
def request_token_times(lm: LoadedModel, prompt_ids: Sequence[int], new_tokens: int) -> list[float]:
    """Seconds from the start of one greedy request at which each of its ``new_tokens`` tokens exists.

    The first entry is the time to first token (TTFT: the prefill); the gaps after it are the
    time per output token (TPOT: one decode step with the KV cache each).

    Raises:
        TypeError: a count that is not an integer.
        ValueError: ``new_tokens < 1``.
    """
    check_int("new_tokens", new_tokens, 1)
    times = []
    start = time.perf_counter()
    logits, cache = model_forward(lm.model, torch.tensor([list(prompt_ids)], device=lm.device))   # prefill
    for step in range(new_tokens):
        token = logits[:, -1].argmax(dim=-1, keepdim=True)                                        # (1, 1)
        times.append(time.perf_counter() - start)
        if step + 1 < new_tokens:
            logits, cache = model_forward(lm.model, token, cache)                                 # decode
    return times


def main(argv: list[str] | None = None) -> int:
    """Print the cached-vs-uncached table (and prefill vs decode) for the shipped target model."""
    from ..models import load_model

    parser = argparse.ArgumentParser(prog="python -m labsupport.bench kv-cache", description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="tiny-gpt2")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    prompt = prompt_of_length(lm, args.prompt_len)
    generate(lm, prompt, FIXED_LENGTH_GREEDY, max_new_tokens=8, record=False)          # warm-up
    print(f"KV cache benchmark: {args.model}, prompt {args.prompt_len} tokens, greedy, {args.threads} torch "
          f"thread(s), best of {args.repeats}")
    print(f"{'new tokens':>10} {'no cache s':>11} {'cache s':>9} {'speed-up':>9} {'forwards ratio':>15} "
          f"{'same tokens':>12}")
    ok = True
    for row in time_cached_vs_uncached(lm, prompt, args.new_tokens, args.repeats):
        assert row.forwards_cached == token_forwards(args.prompt_len, row.new_tokens, True)
        ok &= row.identical
        print(f"{row.new_tokens:>10} {row.uncached_s:>11.3f} {row.cached_s:>9.3f} {row.speedup:>8.1f}× "
              f"{row.forwards_ratio:>14.1f}× {'yes' if row.identical else 'NO':>12}")
    pd = time_prefill_decode(lm, prompt_len=256, decode_steps=32, repeats=3)
    print(f"prefill of {pd.prompt_len} tokens: {pd.prefill_s * 1e3:.1f} ms "
          f"({pd.prefill_per_token_s * 1e3:.3f} ms per token); one decode step: {pd.decode_s * 1e3:.2f} ms "
          f"(prefill = {pd.ratio:.1f} decode steps)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
