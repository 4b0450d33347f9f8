"""Caching a whole long context instead of re-prefilling retrieved chunks (context caching vs RAG).

RAG builds each prompt from a system prompt, a few retrieved chunks and the question, and
prefills all of it on every request (prefix caching saves the system prompt only: the
chunks differ). Context caching keeps the KV of a whole document collection once and
prefills only the question on top of it. The arithmetic, per request::

    RAG:      prefill  s + k + q  tokens          (e.g. 500 + 5,000 + 500 = 6,000)
    cached:   prefill  q  tokens on c cached ones  (e.g. 500 on 100,000)

with the prefill's FLOPs ``n · 2N`` for the weights plus ``4 · L · H · d · n · (c + n/2)``
for attention to the ``c`` cached and the new tokens (QKᵀ and AV, 2 FLOPs per multiply-add;
query heads count, GQA does not shrink them). The price: the cached context's KV is held in
memory all the time (``c · 2·L·H_kv·d·bytes``), and every decode step reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..kv import H100_SXM, Accelerator, ModelShape, kv_bytes_per_token, preset, step_time, weight_bytes
from ..sampling import GREEDY
from ..validation import check_int, check_real

__all__ = ["ContextCacheReport", "context_cache_report", "measure_context_vs_rag", "prefill_flops"]


def prefill_flops(shape: ModelShape, new_tokens: int, cached_tokens: int = 0) -> float:
    """FLOPs to prefill ``new_tokens`` after ``cached_tokens`` already in the KV cache:
    ``n · 2N + 4 · L · H · d · n · (c + (n + 1) / 2)`` (weights, then causal attention).

    Raises:
        TypeError / ValueError: ``new_tokens`` < 1 or ``cached_tokens`` < 0.
    """
    n = check_int("new_tokens", new_tokens, 1)
    c = check_int("cached_tokens", cached_tokens, 0)
    return n * 2.0 * shape.n_params + 4.0 * shape.n_layers * shape.n_heads * shape.head_dim * n * (c + (n + 1) / 2)


@dataclass(frozen=True)
class ContextCacheReport:
    """RAG vs context caching for one model on one accelerator (seconds, bytes).

    Attributes:
        rag_tokens / cached_tokens: tokens prefilled per request.
        rag_ttft / cached_ttft: prefill time at the given MFU (compute-bound).
        kv_held: bytes of KV the cached context holds all the time.
        rag_kv: bytes of KV one RAG request holds while it runs.
        rag_step / cached_step: a batch-1 decode step, ``(W + KV) / BW`` (chapter 05's model).
    """

    rag_tokens: int
    cached_tokens: int
    rag_ttft: float
    cached_ttft: float
    kv_held: int
    rag_kv: int
    rag_step: float
    cached_step: float

    @property
    def ttft_ratio(self) -> float:
        return self.rag_ttft / self.cached_ttft


def context_cache_report(shape: ModelShape | None = None, acc: Accelerator = H100_SXM, system: int = 500,
                         retrieved: int = 5000, question: int = 500, context: int = 100_000,
                         mfu: float = 0.5, kv_dtype: str = "fp16") -> ContextCacheReport:
    """The per-request arithmetic of RAG (``system + retrieved + question`` prefilled) vs a cached
    context (``question`` prefilled on ``context`` cached tokens); default Llama 3 8B on an H100.

    Raises:
        TypeError / ValueError: sizes < 1, ``mfu`` outside (0, 1].
    """
    shape = shape or preset("Llama 3 8B")
    for name, v in (("system", system), ("retrieved", retrieved), ("question", question), ("context", context)):
        check_int(name, v, 1)
    mfu = check_real("mfu", mfu, 0.0, 1.0, low_open=True)
    rate = acc.peak_flops * mfu
    rag = system + retrieved + question
    per_token = kv_bytes_per_token(shape, kv_dtype)
    w = weight_bytes(shape)
    return ContextCacheReport(
        rag_tokens=rag, cached_tokens=question,
        rag_ttft=prefill_flops(shape, rag) / rate, cached_ttft=prefill_flops(shape, question, context) / rate,
        kv_held=context * per_token, rag_kv=rag * per_token,
        rag_step=step_time(w, acc.bandwidth, 1, rag * per_token),
        cached_step=step_time(w, acc.bandwidth, 1, (context + question) * per_token))


def measure_context_vs_rag(lm, system: list[int], corpus_chunks: list[list[int]], questions: list[list[int]],
                           retrieve: int = 2, new_tokens: int = 4, block_size: int = 16, seed: int = 0) -> dict:
    """The same arithmetic measured on the real engine with prefix caching on.

    *Context caching*: the whole context (system + every corpus chunk) is prefilled once, then
    each question is asked on it. *RAG*: each request is the system prompt, ``retrieve`` chunks
    drawn (seeded) from the corpus, and the question; a fresh engine, so only shared prefixes hit.

    Returns:
        ``{"cached": {...}, "rag": {...}}`` each with ``ttft`` (median s), ``computed`` (mean prompt
        tokens run through the model per request), ``held_tokens`` (KV tokens kept between requests)
        and ``held_bytes``.
    """
    import numpy as np

    from ..engine import LLMEngine

    rng = np.random.default_rng(seed)
    context = list(system) + [t for c in corpus_chunks for t in c]
    out = {}
    for mode in ("cached", "rag"):
        total = len(context) + max(len(q) for q in questions) + new_tokens
        eng = LLMEngine(lm, block_size=block_size, num_blocks=4 * (total // block_size + 2),
                        enable_prefix_caching=True, max_num_seqs=1)
        if mode == "cached":
            eng.add_request(context, GREEDY, 1)
            eng.run()
        ttfts, computed = [], []
        for q in questions:
            if mode == "cached":
                prompt = context + list(q)
            else:
                picks = rng.choice(len(corpus_chunks), size=min(retrieve, len(corpus_chunks)), replace=False)
                prompt = list(system) + [t for i in picks for t in corpus_chunks[int(i)]] + list(q)
            rid = eng.add_request(prompt, GREEDY, new_tokens, arrival_time=time.perf_counter())
            eng.run()
            ttfts.append(eng.requests[rid].metrics.ttft)
            computed.append(len(prompt) - eng.requests[rid].num_prefix_hit_tokens)
        held = len(context) if mode == "cached" else 0
        out[mode] = {"ttft": float(np.median(ttfts)), "computed": float(np.mean(computed)),
                     "held_tokens": held, "held_bytes": held * eng.runner.kv_bytes_per_token}
    return out
