"""The speculative decoding loop over Hugging Face models, with KV rollback by cropping.

One *round* (Leviathan et al. 2023; Chen et al. 2023; vLLM's names):

1. the proposer drafts ``γ`` tokens ``d_1..d_γ`` (draft model: sampled from its ``q``;
   n-gram prompt lookup: copied from earlier text, ``q`` one-hot);
2. the target runs **one** forward over ``[last, d_1..d_γ]`` and gives ``γ+1`` rows ``p``;
3. :func:`~labsupport.speculative.rounds.verify_round` accepts a prefix of the drafts and adds
   the target's own token (the replacement at the first rejection, or the bonus token);
4. the KV of rejected tokens is rolled back in both models (``DynamicCache.crop(-k)``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..generation import _check_length, _prompt_ids
from ..models import LoadedModel
from ..sampling import GREEDY, SamplingParams
from ..stopping import StopRule
from ..validation import check_int, check_type
from .cache import CachedLM
from .proposers import Proposal, check_same_vocabulary
from .rounds import RoundRecord, commit_round, verify_round
from .stats import SpecStats


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


@torch.no_grad()
def speculative_generate(target: LoadedModel, proposer, prompt: str | Sequence[int],
                         params: SamplingParams = GREEDY, *, gamma: int = 4,
                         max_new_tokens: int | None = None,
                         generator: torch.Generator | None = None) -> SpeculativeResult:
    """Generate with speculative decoding: draft γ, verify in one target forward, roll back.

    The target's KV cache holds every committed token but the last; each round feeds
    ``[last, d_1..d_k]`` (k+1 tokens), verifies with :func:`verify_round`, appends the accepted
    prefix and the target's token under the request's :class:`~labsupport.stopping.StopRule`
    (:func:`commit_round`: anything after the stopping point in the block is discarded), then crops the KV of
    rejected tokens from both caches (``DynamicCache.crop(-k)``).

    Args:
        target: the target model.
        proposer: :class:`DraftModelProposer` or :class:`NgramProposer` (anything with
            ``start(prompt_ids)``, ``propose(seq, γ, params, generator) -> Proposal``,
            ``forwards``, ``seconds``).
        prompt: text or token ids.
        params: sampling settings, applied identically to target and draft; greedy →
            output token-identical to greedy target decoding.
        gamma: draft length γ ≥ 1 (shortened near ``max_new_tokens``: a round never drafts
            more than it could emit).
        max_new_tokens: default ``params.max_tokens``.
        generator: for drafting and verification (default: seeded from ``params.seed``).

    Returns:
        :class:`SpeculativeResult` with per-round records and :class:`SpecStats`.

    Raises:
        TypeError: γ not an integer.
        ValueError: empty prompt, γ < 1, a prompt that fills the context window, a draft
            whose vocabulary differs from the target's, or ``params.structured_output`` set.
    """
    gamma = check_int("gamma", gamma, 1)
    check_type("params", params, SamplingParams)
    if params.structured_output is not None:
        raise ValueError("structured_output is not supported with speculative decoding "
                         "(the draft would need the grammar too); use generate() or LLMEngine")
    if getattr(proposer, "draft", None) is not None:          # however the proposer was built
        check_same_vocabulary(target, proposer.draft)
    ids = _prompt_ids(target, prompt)
    max_new = _check_length(target, len(ids), params.max_tokens if max_new_tokens is None else max_new_tokens)
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=target.device).manual_seed(params.seed)
    rule = StopRule.from_params(params, target.eos_token_ids, max_new)
    t0 = time.perf_counter()
    tgt = CachedLM(target)
    if len(ids) > 1:
        tgt.forward(ids[:-1])                                   # prefill
    proposer.start(ids)
    stats = SpecStats(gamma=gamma)
    stats.prefill_seconds = time.perf_counter() - t0
    seq, new, rounds = list(ids), [], []
    finish = None
    while finish is None:
        g = min(gamma, max_new - len(new) - 1)                  # never draft more than can be emitted
        prop = (proposer.propose(seq, g, params, generator, prompt_len=len(ids), end_ids=rule.end_ids)
                if g > 0 else Proposal([]))
        t1 = time.perf_counter()
        tgt.sync(seq)
        logits = tgt.forward(seq[len(tgt.cached):] + prop.tokens)[-(len(prop.tokens) + 1):]   # (k+1, V)
        rec = verify_round(logits, prop, seq, params, generator, prompt_len=len(ids), end_ids=rule.end_ids)
        stats.target_seconds += time.perf_counter() - t1
        stats.target_forwards += 1
        finish = commit_round(rec, seq, new, rule, target.decode)
        rounds.append(rec)
        stats.add(rec)
    stats.draft_forwards, stats.draft_seconds = proposer.forwards, proposer.seconds
    return SpeculativeResult(prompt_ids=ids, token_ids=new, text=rule.text(new, finish, target.decode),
                             finish_reason=finish, rounds=rounds, stats=stats,
                             seconds=time.perf_counter() - t0)
