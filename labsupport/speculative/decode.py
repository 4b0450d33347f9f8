"""The speculative decoding loop over a Hugging Face model, with KV rollback by cropping.

The chapter's readable baseline: one request, the target's own ``DynamicCache``. One *round*
(Leviathan et al. 2023; Chen et al. 2023; vLLM's names):

1. the proposer drafts up to γ tokens ``d_1..d_γ`` (a draft model: sampled from its ``q``;
   n-gram prompt lookup: copied from earlier text, ``q`` one-hot) — the same
   :class:`~.proposers.Proposer` protocol as :class:`~.engine.SpeculativeEngine`;
2. the target runs **one** forward over ``[last, d_1..d_γ]`` and gives ``γ+1`` rows ``p``;
3. :func:`~.rounds.finish_round` accepts a prefix of the drafts, adds the target's own token
   (the replacement at the first rejection, or the bonus token) and commits under the stop rule;
4. the KV of rejected tokens leaves the target's cache (``DynamicCache.crop``) and the proposer's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..engine.sequence import Sequence as Seq
from ..generation import max_new_tokens_for, grammar_for, prompt_token_ids
from ..models import LoadedModel
from ..sampling import GREEDY, SamplingParams
from ..stopping import StopRule
from ..validation import check_type
from .cache import CachedLM
from .proposers import Proposer
from .rounds import Draft, SpecSequence, clip_draft, finish_round
from .stats import RoundRecord, SpecStats


@dataclass
class SpeculativeResult:
    """What :func:`speculative_generate` produced (fields as in ``GenerationResult``)."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    rounds: list[RoundRecord]
    stats: SpecStats
    seconds: float


@dataclass(eq=False)                     # hashable by identity: a proposer keeps one cache per loop
class _Loop:
    """What a proposer sees of this loop: the target (no paged cache here)."""

    target: LoadedModel


@torch.no_grad()
def speculative_generate(target: LoadedModel, proposer: Proposer, prompt: str | Sequence[int],
                         params: SamplingParams = GREEDY, *, max_new_tokens: int | None = None,
                         generator: torch.Generator | None = None) -> SpeculativeResult:
    """Generate with speculative decoding: draft γ, verify in one target forward, roll back.

    The target's KV cache holds every committed token but the last; each round feeds
    ``[last, d_1..d_k]`` (k+1 tokens), verifies and commits with :func:`finish_round` (tokens
    after the stopping point are discarded), then crops the KV of rejected tokens.

    Args:
        target: the target model.
        proposer: a chain proposer that needs nothing of the target's cache — a
            :class:`~.proposers.DraftModelProposer` or :class:`~.proposers.NgramProposer`
            (γ is its ``num_speculative_tokens``; a round never drafts more than it could emit).
        prompt: text or token ids.
        params: sampling settings, applied identically to target and draft (penalties,
            ``min_tokens``, stop ids and strings, structured output — the grammar masks every
            verified row); greedy → output token-identical to greedy target decoding. One call
            makes one sample (``params.n`` is for the engines).
        max_new_tokens: default ``params.max_tokens``; cut to the context window.
        generator: for drafting and verification (default: seeded from ``params.seed``).

    Returns:
        :class:`SpeculativeResult` with per-round records and :class:`SpecStats`.

    Raises:
        TypeError: ``target`` not a LoadedModel, ``params`` not SamplingParams, ``proposer`` not a Proposer.
        ValueError: empty prompt, a prompt that fills the context window, a draft whose
            vocabulary differs from the target's, or a proposer that needs the paged engine
            (self-speculation, Medusa, lookahead: use :class:`~.engine.SpeculativeEngine`).
    """
    check_type("target", target, LoadedModel)
    check_type("params", params, SamplingParams)
    if not isinstance(proposer, Proposer):
        raise TypeError(f"proposer must be a Proposer, got {type(proposer).__name__}")
    proposer.check_target(target)
    if proposer.needs_paged_target:
        raise ValueError(f"the {proposer.name} proposer reads the target's paged cache or hidden states; "
                         "run it with SpeculativeEngine")
    ids = prompt_token_ids(target, prompt)
    max_new = max_new_tokens_for(target, len(ids), params.max_tokens if max_new_tokens is None else max_new_tokens)
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=target.device).manual_seed(params.seed)
    loop = _Loop(target)
    stop_rule = StopRule.from_params(params, target.eos_token_ids, max_new, target.model.config.vocab_size)
    seq = Seq("0", list(ids), max_new, params=params, generator=generator, stop_rule=stop_rule,
              grammar=grammar_for(target, params, max_new))
    s = SpecSequence(seq, SpecStats(num_speculative_tokens=proposer.num_speculative_tokens))
    t0 = time.perf_counter()
    tgt = CachedLM(target)
    if len(ids) > 1:
        tgt.forward(ids[:-1])                                   # prefill
    proposer.start(loop, [s])
    s.stats.prefill_seconds = time.perf_counter() - t0
    forwards0 = proposer.forwards
    while s.finish_reason is None:
        t1 = time.perf_counter()
        draft = clip_draft(proposer.propose(loop, [s]).get("0", Draft()), s.room, s.token_ids[-1],
                           proposer.max_draft_tokens)
        if draft.parents is not None:
            raise ValueError(f"the {proposer.name} proposer drafted a token tree; trees need SpeculativeEngine")
        t2 = time.perf_counter()
        seq = s.token_ids
        tgt.sync(seq)
        logits = tgt.forward(seq[len(tgt.cached):] + draft.tokens)[-(len(draft.tokens) + 1):]   # (k+1, V)
        _, path = finish_round(logits, draft, s, target.decode)
        s.stats.draft_seconds += t2 - t1
        s.stats.target_seconds += time.perf_counter() - t2
        if s.finish_reason is None:
            proposer.observe(loop, s, draft, path, None, logits)
    proposer.finish(loop, s)
    s.stats.draft_forwards = proposer.forwards - forwards0
    return SpeculativeResult(prompt_ids=ids, token_ids=s.output_ids,
                             text=s.stop_rule.text(s.output_ids, s.finish_reason, target.decode),
                             finish_reason=s.finish_reason, rounds=s.rounds, stats=s.stats,
                             seconds=time.perf_counter() - t0)
