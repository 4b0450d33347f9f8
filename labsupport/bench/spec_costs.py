"""The step costs of speculative decoding on this machine, timed (one torch thread): a target decode
step, a draft step (their ratio ``c``), the verification of γ + 1 tokens (``v(γ)``) and the prompt's
prefill (``p``), through the Hugging Face cache or the paged runner — what the speed-up formula of
chapter 06 needs, measured. :mod:`labsupport.bench.speculative` (the γ sweep, the engine comparison,
the command line) re-exports :func:`measure_costs`, :class:`CostModel` and
:func:`runner_verification_costs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from labsupport.engine.block_manager import BlockManager
from labsupport.engine.extend import extend
from labsupport.engine.model_runner import ModelRunner
from labsupport.kv import blocks_needed
from labsupport.models import LoadedModel
from labsupport.speculative import (
    CachedLM,
)
from labsupport.timing import time_interleaved
from labsupport.validation import check_bool, check_int, check_real, check_token_ids

# ============================================================================ step costs and the γ sweep


@dataclass
class CostModel:
    """Measured step costs (seconds, fastest of the repeats) and the ratios the speed-up formula needs.

    ``c = t_draft / t_target``; ``v[γ]`` = time of a target forward over γ+1 new tokens / t_target;
    ``prefill`` / ``draft_prefill`` = the prompt's forward from an empty cache (target / draft) / t_target.
    """

    t_target: float
    t_draft: float
    v: dict[int, float]
    t_prefill: float = 0.0
    t_draft_prefill: float = 0.0

    def __post_init__(self) -> None:
        """Raises: TypeError / ValueError: a time that is not a finite number (``t_target`` > 0, the
        others ≥ 0), ``v`` not a dict of γ ≥ 1 → cost > 0."""
        check_real("t_target", self.t_target, 0.0, low_open=True)
        for name in ("t_draft", "t_prefill", "t_draft_prefill"):
            check_real(name, getattr(self, name), 0.0)
        if not isinstance(self.v, dict):
            raise TypeError(f"v must be a dict {{γ: cost}}, got {type(self.v).__name__}")
        for g, cost in self.v.items():
            check_int("v's γ", g, 1)
            check_real(f"v[{g}]", cost, 0.0, low_open=True)

    @property
    def c(self) -> float:
        return self.t_draft / self.t_target

    @property
    def prefill(self) -> float:
        """The target's prefill of the context, in target decode steps."""
        return self.t_prefill / self.t_target

    @property
    def draft_prefill(self) -> float:
        """The draft model's prefill of the context, in target decode steps (0 without a draft model)."""
        return self.t_draft_prefill / self.t_target

    def predicted_speedup(self, tokens_per_round: float, gamma: int, c: float | None = None) -> float:
        """``E[tokens per round] / (γ·c + v(γ))`` (c defaults to the measured draft ratio)."""
        return tokens_per_round / (gamma * (self.c if c is None else c) + self.v[gamma])


Job = tuple[Callable[[], object], Callable[[], object]]
"""A timed call and the untimed call that undoes it (drops the tokens it added)."""


def _cached_jobs(lm: LoadedModel, context: list[int], sizes: Sequence[int]) -> dict[object, Job]:
    """Forwards of ``lm`` with Hugging Face's cache (as :func:`speculative_generate` runs the target):
    ``n`` new tokens after ``context`` for each size, and ``"prefill"``, ``context`` from an empty cache."""
    kv = CachedLM(lm)
    kv.forward(context)

    def prefill() -> None:
        kv.reset()
        kv.forward(context)

    def forward(n: int) -> Job:
        new = context[-n:] if len(context) >= n else [0] * n
        return (lambda: kv.forward(new)), (lambda: kv.drop(n))

    return {**{n: forward(n) for n in sizes}, "prefill": (prefill, lambda: None)}


def _paged_jobs(lm: LoadedModel, context: list[int], sizes: Sequence[int]) -> dict[object, Job]:
    """The same forwards through a paged runner of its own (as :class:`DraftModelProposer` drafts and
    :class:`SpeculativeEngine` verifies)."""
    blocks = blocks_needed(len(context) + max(sizes), 16) + 1
    runner, bm = ModelRunner(lm, 16, blocks), BlockManager(blocks, 16)
    extend(runner, bm, {0: context}, all_logits=False)

    def prefill() -> None:
        bm.free(0)
        extend(runner, bm, {0: context}, all_logits=False)

    def forward(n: int) -> Job:                 # n copies of the last token: a verification-sized step
        return (lambda: extend(runner, bm, {0: context[-1:] * n}, all_logits=n > 1)), \
            (lambda: bm.truncate(0, len(context)))

    return {**{n: forward(n) for n in sizes}, "prefill": (prefill, lambda: None)}


@torch.no_grad()
def measure_costs(target: LoadedModel, draft: LoadedModel | None, context: Sequence[int],
                  gammas: Sequence[int] = range(1, 9), repeats: int = 20, *, paged: bool = False) -> CostModel:
    """Time one decode step of target and draft, target forwards over γ+1 tokens, and the prefill.

    Each repeat times every measurement once, in turn (target 1 token, draft 1 token, target
    γ+1 tokens for each γ, after ``context`` is in the KV cache; then ``context`` itself from an
    empty cache, target and draft: the prefill of a generation); the fastest time of each
    counts (other processes only ever add time) and interleaving keeps the ratios fair when
    the machine's load changes.

    Each model is timed the way it runs: by default as in
    :func:`~labsupport.speculative.speculative_generate` (the target with its Hugging Face cache,
    the draft model through the paged runner that :class:`~labsupport.speculative.DraftModelProposer`
    drafts with); with ``paged=True`` both through the paged runner, as in
    :class:`~labsupport.speculative.SpeculativeEngine`.

    Args:
        context: token ids already in the KV cache when timing (e.g. a prompt).
        gammas: draft lengths whose verification cost ``v(γ)`` is measured.
        repeats: timed rounds (two untimed warm-up rounds come first); wall-clock, so use one
            torch thread.
        paged: time the target through the paged runner too (the engine's costs).

    Returns:
        :class:`CostModel` (``t_draft = 0`` when ``draft`` is None, e.g. for n-gram lookup).

    Raises:
        TypeError / ValueError: ``repeats`` not an integer >= 1, ``context`` empty or not token
            ids of ``target`` or too long for the models' positions with γ + 1 more, a γ not an
            integer >= 1, ``paged`` not a bool.
    """
    check_int("repeats", repeats, 1)
    check_bool("paged", paged)
    context = check_token_ids("context", context, int(target.model.config.vocab_size))
    gammas = [check_int("gammas[i]", g, 1) for g in gammas]
    sizes = [1] + [int(g) + 1 for g in gammas]
    limit = min(int(m.model.config.n_positions) for m in (target, draft) if m is not None)
    if len(context) + max(sizes) > limit:
        raise ValueError(f"context must leave room for the largest forward ({max(sizes)} tokens) within the "
                         f"models' {limit} positions: at most {limit - max(sizes)} tokens, got {len(context)}")
    jobs = {("target", n): job for n, job in (_paged_jobs if paged else _cached_jobs)(target, context, sizes).items()}
    if draft is not None:
        jobs.update({("draft", n): job for n, job in _paged_jobs(draft, context, [1]).items()})
    timings = time_interleaved({job: run for job, (run, _) in jobs.items()}, repeats=repeats, warmup=2,
                               after=lambda job: jobs[job][1]())            # undo: the next call starts alike
    best = {job: t.low for job, t in timings.items()}
    t_target = best[("target", 1)]
    return CostModel(t_target=t_target, t_draft=best.get(("draft", 1), 0.0),
                     v={int(g): best[("target", int(g) + 1)] / t_target for g in gammas},
                     t_prefill=best[("target", "prefill")], t_draft_prefill=best.get(("draft", "prefill"), 0.0))


@torch.no_grad()
def runner_verification_costs(target: LoadedModel, context: str | Sequence[int], gammas: Sequence[int] = range(1, 9),
                              repeats: int = 5, inner: int = 5) -> dict[int, list[float]]:
    """v(γ) of the paged runner itself: the time of one forward over γ + 1 new tokens of a sequence
    holding ``context``, in units of one single-token forward — once per repeat (each the fastest
    of ``inner`` alternating tries), so the spread across repeats can be printed. ``context``: text or ids.

    Returns:
        ``{γ: [v of each repeat]}``.

    Raises:
        TypeError / ValueError: ``repeats`` or ``inner`` not an integer >= 1, a γ < 1.
    """
    from labsupport.bench.speculative_variants import forward_costs
    check_int("repeats", repeats, 1)
    gammas = [check_int("gammas[i]", g, 1) for g in gammas]
    out: dict[int, list[float]] = {g: [] for g in gammas}
    ids = target.encode(context) if isinstance(context, str) else list(context)
    for _ in range(repeats):
        best = forward_costs(target, ids, [1] + [g + 1 for g in gammas], repeats=inner)
        for g in gammas:
            out[g].append(best[g + 1] / best[1])
    return out
