"""``python -m labsupport.bench quant``: the decode step with fp32 matmuls against int8 ones
(:mod:`labsupport.quant.int8`), at batch 1 and 8, timed in alternation, next to the roofline's
prediction from the bytes each step reads. Chapter 11 calls :func:`step_times`, and
:func:`budget_run` (how many requests a fixed KV memory runs in each ``kv_cache_dtype``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from ..engine import LLMEngine
from ..engine.model_runner import ModelRunner
from ..kv import blocks_needed
from ..quant.kv import kv_bytes_per_token
from ..sampling import SamplingParams
from ..timing import median_range
from ..validation import check_int


def weight_bytes_per_step(runner: ModelRunner) -> int:
    """Bytes of every matrix a decode step reads (layers' four + LM head), as the runner stores them."""
    mats = [m for layer in runner.layers for m in (layer.c_attn, layer.attn_proj, layer.c_fc, layer.mlp_proj)]
    mats.append(runner.lm_head_linear)
    return sum(getattr(m, "nbytes", None) or 4 * m.shape[0] * m.shape[1] for m in mats)


@dataclass
class StepTimes:
    """Decode-step seconds of two runners over the same batch, measured in alternation.

    Attributes:
        batch: sequences per step. context: tokens already cached per sequence.
        fp32, int8: seconds per step, one entry per repeat (each the median of ``steps`` steps).
        fp32_bytes, int8_bytes: weight bytes each step reads.
    """

    batch: int
    context: int
    fp32: list[float]
    int8: list[float]
    fp32_bytes: int
    int8_bytes: int

    @property
    def speedups(self) -> list[float]:
        """fp32 / int8 per repeat (> 1: int8 is faster)."""
        return [a / b for a, b in zip(self.fp32, self.int8)]

    @property
    def predicted_speedup(self) -> float:
        """The bandwidth-bound prediction: bytes read by fp32 / bytes read by int8."""
        return self.fp32_bytes / self.int8_bytes


def _decode_once(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    """Prefill ``batch`` sequences of ``context`` tokens, then time ``steps`` decode steps; the median."""
    torch.manual_seed(0)
    tables = [list(range(b * blocks_needed(context + steps + 1, runner.block_size),
                         (b + 1) * blocks_needed(context + steps + 1, runner.block_size))) for b in range(batch)]
    prompts = [torch.randint(0, runner.vocab_size, (context,)).tolist() for _ in range(batch)]
    runner.forward(prompts, [0] * batch, tables)
    times = []
    tokens = [[1]] * batch
    for i in range(steps):
        start = time.perf_counter()
        runner.forward(tokens, [context + i] * batch, tables)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def step_times(lm, batch: int = 1, context: int = 32, steps: int = 16, repeats: int = 5) -> StepTimes:
    """Decode-step time with fp32 and with int8 matmuls (:class:`StepTimes`), alternating runners
    each repeat so both see the same machine load."""
    blocks = batch * blocks_needed(context + steps + 1, 16)
    fp32 = ModelRunner(lm, 16, blocks)
    int8 = ModelRunner(lm, 16, blocks, quantization="int8")
    a, b = [], []
    for _ in range(repeats):
        a.append(_decode_once(fp32, batch, context, steps))
        b.append(_decode_once(int8, batch, context, steps))
    return StepTimes(batch, context, a, b, weight_bytes_per_step(fp32), weight_bytes_per_step(int8))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labsupport.bench quant", description=__doc__)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=7, help="alternating repeats per batch size (default 7)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from ..models import load_model
    lm = load_model("tiny-gpt2", device="cpu")
    print(f"decode step, tiny-gpt2, {args.threads} thread(s), median of {args.repeats} alternating repeats (range)")
    for batch in args.batches:
        t = step_times(lm, batch=batch, repeats=args.repeats)
        print(f"batch {batch:>2}: fp32 {median_range(t.fp32, scale=1e3, unit=' ms')}  "
              f"int8 {median_range(t.int8, scale=1e3, unit=' ms')}  "
              f"speed-up {median_range(t.speedups, unit='×')}  "
              f"(bytes predict {t.predicted_speedup:.2f}×: {t.fp32_bytes / 1e6:.1f} MB → {t.int8_bytes / 1e6:.1f} MB)")
    return 0


@dataclass
class BudgetRun:
    """One engine run under a fixed KV memory budget.

    Attributes:
        kv_cache_dtype: the setting. num_blocks: blocks the budget buys. capacity: their token slots.
        mean_running / max_running: sequences per decode step (mean over steps, and the most).
        preemptions: sequences preempted for lack of blocks. steps: engine steps to finish all.
        token_ids: each request's output, in request order. finish_reasons: theirs (``"error"``:
            a request longer than the whole pool, refused by the engine).
    """

    kv_cache_dtype: str
    num_blocks: int
    capacity: int
    mean_running: float
    max_running: int
    preemptions: int
    steps: int
    token_ids: list[list[int]]
    finish_reasons: list[str]


def budget_run(lm, budget_bytes: int, kv_cache_dtype: str, prompts, max_tokens: int, *,
               block_size: int = 16, max_num_seqs: int = 32) -> BudgetRun:
    """Run ``prompts`` (greedy, ``max_tokens`` each) through an :class:`~labsupport.engine.LLMEngine`
    whose KV pool is as many blocks as ``budget_bytes`` buys in ``kv_cache_dtype``.

    Raises:
        ValueError: a budget smaller than one block, or bad settings (as the engine's).
    """
    if isinstance(prompts, str) or not hasattr(prompts, "__len__"):
        raise TypeError(f"prompts must be a list of prompts (strings or token-id lists), got {type(prompts).__name__}")
    cfg = lm.model.config
    per_token = kv_bytes_per_token(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, kv_cache_dtype)
    check_int("budget_bytes", budget_bytes, 1)
    num_blocks = budget_bytes // (per_token * block_size)
    if num_blocks < 1:
        raise ValueError(f"budget_bytes must buy at least one block ({per_token * block_size} B in "
                         f"{kv_cache_dtype!r}), got {budget_bytes}")
    engine = LLMEngine(lm, block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                       kv_cache_dtype=kv_cache_dtype, record_history=True, num_cpu_blocks=0)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = engine.generate(list(prompts), params)
    running = [len(s.running) for s in engine.history if s.running]
    return BudgetRun(kv_cache_dtype, num_blocks, num_blocks * block_size, sum(running) / max(len(running), 1),
                     max(running, default=0), sum(len(s.preempted) for s in engine.history), len(engine.history),
                     [list(o.token_ids) for o in outputs], [o.finish_reason for o in outputs])
