"""Why the same prompt gives different tokens, measured (chapter 12): float sums in two orders, one
request's logits alone and in a batch, and how many completions one prompt gets over many batch mixes.

Everything here drives the real engine (:class:`~labsupport.engine.LLMEngine`,
:class:`~labsupport.engine.ModelRunner`); its batch-invariant mode is
:mod:`labsupport.engine.batch_invariant`.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .engine import BlockManager, EngineConfig, LLMEngine, ModelRunner
from .engine.extend import extend
from .sampling import GREEDY, SamplingParams
from .validation import check_choice, check_int

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The float formats chapter 12 sums in, by name."""

ORDERS = ("sequential", "pairwise")
"""Two orders of one sum: one running total (a loop), or a tree of pairs (what a parallel reduction does)."""


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u = 2^-p`` for a format with ``p`` mantissa bits + 1: the largest relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


def ordered_sum(x: torch.Tensor, order: str) -> torch.Tensor:
    """The sums of the rows of ``x (R, n)`` in ``x``'s dtype, every addition rounded to it, in ``order``.

    ``"sequential"``: ``((x0 + x1) + x2) + …``, one running total. ``"pairwise"``: neighbours added in
    pairs, then the pairs' sums in pairs, … (``⌈log2 n⌉`` levels; an odd element waits a level).

    Raises:
        ValueError: an unknown order, or ``x`` not 2-D.
    """
    check_choice("order", order, ORDERS)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, n), got shape {tuple(x.shape)}")
    if order == "sequential":
        total = x[:, 0].clone()
        for i in range(1, x.shape[1]):
            total = total + x[:, i]                       # rounded to x.dtype after every addition
        return total
    while x.shape[1] > 1:
        if x.shape[1] % 2:                                # the odd one out waits for the next level
            x = torch.cat([x[:, :-1:2] + x[:, 1::2], x[:, -1:]], dim=1)
        else:
            x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0]


def fixed_order_row_sums(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """Each row's sum in one order that does not depend on how many rows came with it: the row cut into
    chunks of ``chunk`` consecutive values, each chunk summed left to right, then the chunk sums left to
    right; every addition rounded to ``x``'s dtype (chapter 12's exercise 1 checks against this).

    Raises:
        ValueError: ``x`` not 2-D with at least one column, ``chunk`` < 1.
    """
    check_int("chunk", chunk, 1)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"x must be 2-D (rows, n) with n ≥ 1, got shape {tuple(x.shape)}")
    total = None
    for start in range(0, x.shape[1], chunk):
        part = ordered_sum(x[:, start:start + chunk], "sequential")
        total = part if total is None else total + part
    return total


def shape_dependent_row_sums(x: torch.Tensor) -> torch.Tensor:
    """Row sums by a rule that picks its order from the batch's shape, as a fast kernel does: one running
    total for up to 4 rows, pairs of pairs for more. A row's last bits then depend on its batch."""
    return ordered_sum(x, "sequential" if x.shape[0] <= 4 else "pairwise")


@dataclass(frozen=True)
class SumError:
    """How far sums of ``length`` numbers in ``dtype`` land from the exact sum (medians over rows).

    Attributes:
        dtype, length: the format and the number of terms.
        sequential, pairwise: median relative error ``|sum − exact| / Σ|x|`` of each order.
        order_gap: median ``|sequential − pairwise| / Σ|x|``: the same numbers, two orders, two answers.
        bound_sequential, bound_pairwise: the worst cases ``(n − 1)·u`` and ``⌈log2 n⌉·u`` (Higham).
    """

    dtype: str
    length: int
    sequential: float
    pairwise: float
    order_gap: float
    bound_sequential: float
    bound_pairwise: float


def summation_errors(lengths: Sequence[int] = (16, 128, 1024, 4096), dtypes: Sequence[str] = tuple(DTYPES),
                     rows: int = 64, seed: int = 0) -> list[SumError]:
    """Sum ``rows`` vectors of normal numbers of each length in each format, in both orders, against
    their exact sum (the same rounded inputs summed in float64, whose error is far below these).

    Raises:
        ValueError: a length < 2 or an unknown dtype name.
    """
    check_int("rows", rows, 1)
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        check_int("lengths", n, 2)
        values = torch.randn(rows, n, generator=g, dtype=torch.float64)
        for name in dtypes:
            dtype = DTYPES[check_choice("dtypes", name, tuple(DTYPES))]
            x = values.to(dtype)
            exact = x.double().sum(1)
            scale = x.double().abs().sum(1)
            seq, pair = ordered_sum(x, "sequential").double(), ordered_sum(x, "pairwise").double()
            med = lambda t: float(t.median())
            u = unit_roundoff(dtype)
            out.append(SumError(name, n, med((seq - exact).abs() / scale), med((pair - exact).abs() / scale),
                                med((seq - pair).abs() / scale), (n - 1) * u, math.ceil(math.log2(n)) * u))
    return out


@dataclass(frozen=True)
class BatchVariance:
    """One request's logits in a batch against the same request alone.

    Attributes:
        batch_size: requests in the forward (the target among ``batch_size − 1`` others).
        prefill_diff: largest ``|Δ logit|`` over the prompt's rows.
        decode_diff: largest ``|Δ logit|`` of one decode step (the others decoding beside it).
        identical: both bit-identical.
        same_argmax: every row picks the same greedy token.
    """

    batch_size: int
    prefill_diff: float
    decode_diff: float
    identical: bool
    same_argmax: bool


def _prompts(vocab: int, count: int, rng: random.Random, shortest: int, longest: int) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randrange(shortest, longest + 1))] for _ in range(count)]


def last_token_logits(runner: ModelRunner, ids: torch.Tensor) -> torch.Tensor:
    """Each row of ``ids (R, T)`` as a fresh request, all in one forward of ``runner``: ``(R, vocab)`` logits
    of each request's last token (a function of a batch, for chapter 12's exercise 2)."""
    out = extend(runner, BlockManager(runner.num_blocks, runner.block_size),
                 {i: row.tolist() for i, row in enumerate(ids)}, all_logits=False)
    return torch.stack([out[i][-1] for i in range(len(ids))])


def batch_variance(runner: ModelRunner, prompt: Sequence[int], batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
                   *, seed: int = 0) -> list[BatchVariance]:
    """Run ``prompt`` alone, then among ``B − 1`` random prompts of other lengths (at a random place in
    the batch), prefill and one decode step, and compare its logits (exactly as the runner computes them).

    Raises:
        ValueError: a batch size < 1, or a prompt that leaves no room for a decode step.
    """
    prompt = list(prompt)
    if len(prompt) + 1 > runner.max_positions:
        raise ValueError(f"prompt must be shorter than n_positions={runner.max_positions}, got {len(prompt)} tokens")
    rng = random.Random(seed)
    next_token = prompt[0]

    def run(others: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        bm = BlockManager(runner.num_blocks, runner.block_size)
        where = rng.randrange(len(others) + 1)
        batch = {f"o{i}": p for i, p in enumerate(others[:where])} | {"t": prompt} | \
            {f"o{i}": p for i, p in enumerate(others[where:], start=where)}
        pre = extend(runner, bm, batch)["t"]
        dec = extend(runner, bm, {k: [next_token] for k in batch})["t"]         # everyone decodes one token
        return pre, dec

    alone_pre, alone_dec = run([])
    out = []
    longest = max(2, min(48, runner.max_positions - 2))
    for b in batch_sizes:
        check_int("batch_sizes", b, 1)
        pre, dec = run(_prompts(runner.vocab_size, b - 1, rng, 1, longest))
        same = torch.equal(pre, alone_pre) and torch.equal(dec, alone_dec)
        argmax = torch.equal(pre.argmax(-1), alone_pre.argmax(-1)) and torch.equal(dec.argmax(-1), alone_dec.argmax(-1))
        out.append(BatchVariance(b, float((pre - alone_pre).abs().max()), float((dec - alone_dec).abs().max()),
                                 same, argmax))
    return out


@dataclass
class MixResult:
    """One prompt's completions over many batch mixes.

    Attributes:
        completions: the target's token ids in each mix.
        counts: how many mixes gave each distinct completion, most common first.
        first_divergence: the first position where two completions differ (``None``: all the same).
        gap: at that position, the top-1 minus top-2 logit of the most common completion's context
            (computed alone): how close the tie was that flipped.
        min_gap, min_gap_at: the smallest such gap along the most common completion, and its position:
            a token can flip only where the gap is smaller than the change a batch makes.
        tokens_per_second: generated tokens of every request per second of engine time (median over mixes).
    """

    completions: list[tuple[int, ...]]
    counts: list[tuple[tuple[int, ...], int]]
    first_divergence: int | None
    gap: float | None
    tokens_per_second: float
    min_gap: float = math.inf
    min_gap_at: int | None = None

    @property
    def distinct(self) -> int:
        return len(self.counts)


def batch_mixes(prompt: Sequence[int], *, vocab: int, n_positions: int, num_mixes: int = 24, max_tokens: int = 24,
                max_others: int = 12, seed: int = 0) -> list[tuple[list[dict], int]]:
    """``num_mixes`` request lists, each the target (``max_tokens`` new tokens) among 0 … ``max_others``
    random prompts of 1 … 48 tokens with 1 … ``max_tokens`` new tokens each (the first mix: the target
    alone); with the target's place in each. Requests are ``{"prompt_token_ids", "max_tokens"}`` as
    :mod:`labsupport.vllm_bridge` sends them, so both engines can run the very same mixes.

    Raises:
        ValueError: ``num_mixes`` < 1, ``max_tokens`` < 1, ``max_others`` < 0.
    """
    check_int("num_mixes", num_mixes, 1)
    check_int("max_tokens", max_tokens, 1)
    check_int("max_others", max_others, 0)
    rng = random.Random(seed)
    longest = max(1, min(48, n_positions - max_tokens - 1))
    mixes = []
    for m in range(num_mixes):
        others = _prompts(vocab, 0 if m == 0 else rng.randrange(max_others + 1), rng, 1, longest)
        where = rng.randrange(len(others) + 1)
        requests = [{"prompt_token_ids": p, "max_tokens": rng.randrange(1, max_tokens + 1)} for p in others]
        requests.insert(where, {"prompt_token_ids": list(prompt), "max_tokens": max_tokens})
        mixes.append((requests, where))
    return mixes


def completions_over_mixes(lm, prompt: Sequence[int], *, num_mixes: int = 24, max_tokens: int = 24,
                           params: SamplingParams = GREEDY, batch_invariant: bool = False,
                           max_others: int = 12, seed: int = 0, **config) -> MixResult:
    """The published experiment on the tiny model: one request, ``num_mixes`` engines, each with
    0 … ``max_others`` other requests of random lengths around it (:func:`batch_mixes`); count its
    distinct completions.

    Args:
        lm: a loaded model (any dtype the engine runs: fp32, or a bf16 copy from :func:`in_dtype`).
        prompt: the target's token ids. params: its sampling (greedy, or seeded: one stream per request).
        batch_invariant: the engine's mode. config: other :class:`EngineConfig` fields.

    Raises:
        ValueError: ``num_mixes`` < 1, ``max_tokens`` < 1, ``max_others`` < 0.
    """
    cfg = lm.model.config
    mixes = batch_mixes(prompt, vocab=cfg.vocab_size, n_positions=cfg.n_positions, num_mixes=num_mixes,
                        max_tokens=max_tokens, max_others=max_others, seed=seed)
    completions, speeds = [], []
    for requests, where in mixes:
        eng = LLMEngine(lm, EngineConfig(batch_invariant=batch_invariant, **config))
        ids = [eng.add_request(r["prompt_token_ids"], (params if i == where else GREEDY).replace(ignore_eos=True),
                               max_tokens=r["max_tokens"]) for i, r in enumerate(requests)]
        t0 = time.perf_counter()
        outs = eng.run()
        speeds.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
        completions.append(tuple(eng.output(ids[where]).token_ids))
    return summarize(lm, prompt, completions, statistics.median(speeds))


def vllm_completions_over_mixes(lm, prompt: Sequence[int], *, batch_invariant: bool = False, dtype: str = "bfloat16",
                                timeout: float = 600, **mix_args) -> MixResult:
    """The same mixes (:func:`batch_mixes`) through vLLM's CPU build in its own venv (``make vllm``),
    greedy, EOS ignored, one vLLM for every mix; ``batch_invariant`` sets ``VLLM_BATCH_INVARIANT=1``
    for that vLLM.

    Raises:
        VLLMError: no vLLM venv (the message says how to make one), or vLLM failed to start or to run
            (the message ends with vLLM's own log lines).
    """
    from .models import resolve_path
    from .vllm_bridge import VLLMWorker

    cfg = lm.model.config
    mixes = batch_mixes(prompt, vocab=cfg.vocab_size, n_positions=cfg.n_positions, **mix_args)
    with VLLMWorker(resolve_path(lm.name), timeout=timeout, env={"VLLM_BATCH_INVARIANT": "1" if batch_invariant else "0"},
                    dtype=dtype, max_model_len=256, enable_prefix_caching=False) as worker:
        runs = [(worker.run(requests), where) for requests, where in mixes]
    completions = [tuple(run["outputs"][where]["token_ids"]) for run, where in runs]
    speeds = [sum(len(o["token_ids"]) for o in run["outputs"]) / run["seconds"] for run, _ in runs]
    return summarize(lm, prompt, completions, statistics.median(speeds))


def summarize(lm, prompt: Sequence[int], completions: list[tuple[int, ...]], tokens_per_second: float) -> MixResult:
    """The :class:`MixResult` of ``completions``: their counts, where the first two part, and the logit
    gap there (the model run alone on the prompt + the common tokens, in its own dtype).

    Raises:
        ValueError: no completions.
    """
    if not completions:
        raise ValueError("completions must hold at least one completion")
    counts = Counter(completions).most_common()
    first = gap = None
    if len(counts) > 1:
        first = min(next((i for i, (a, b) in enumerate(zip(c, counts[0][0])) if a != b), min(len(c), len(counts[0][0])))
                    for c, _ in counts[1:])
    top = counts[0][0]
    gaps = []
    if top:                                                # one forward over prompt + text: the gap before each token
        with torch.inference_mode():
            logits = lm.model(torch.tensor([list(prompt) + list(top[:-1])], device=lm.device)).logits[0].float()
        best = torch.topk(logits[len(prompt) - 1:], 2, dim=-1).values
        gaps = (best[:, 0] - best[:, 1]).tolist()
    if first is not None and first < len(gaps):
        gap = gaps[first]
    at = min(range(len(gaps)), key=gaps.__getitem__) if gaps else None
    return MixResult(list(completions), counts, first, gap, tokens_per_second,
                     gaps[at] if at is not None else math.inf, at)


def in_dtype(lm, dtype: str):
    """A copy of ``lm`` whose model runs in ``dtype`` (``"bfloat16"``, ``"float16"`` or ``"float32"``); its
    ``name`` stays the one it was loaded from (vLLM loads that and casts it itself)."""
    check_choice("dtype", dtype, tuple(DTYPES))
    from .models import LoadedModel
    return LoadedModel(model=copy.deepcopy(lm.model).to(DTYPES[dtype]).eval(), tokenizer=lm.tokenizer,
                       device=lm.device, name=lm.name)
