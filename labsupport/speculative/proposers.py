"""Proposers: who drafts the γ tokens of a round, and the one loop that drafts them.

* :class:`DraftModelProposer` — a small model sharing the target's vocabulary, with its own
  KV cache (Leviathan et al. 2023; Chen et al. 2023);
* :class:`NgramProposer` — prompt lookup: copy what followed an earlier occurrence of the
  text's last n-gram (no model at all; vLLM's ``ngram`` speculator, Hugging Face's
  ``prompt_lookup_num_tokens``).

:func:`draft_tokens` is the draft loop for any draft model — this module's proposer over a
Hugging Face cache and :class:`~labsupport.speculative.engine.SpecDecodeEngine` over a paged
cache both call it with their own ``next_logits``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..models import LoadedModel
from ..sampling import SamplingParams, probs_from_logits
from ..validation import check_int
from .cache import CachedLM
from .rejection import sample_from


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise unless draft and target share one tokenizer and vocabulary.

    Speculative verification compares ``p(x)`` and ``q(x)`` for the same id ``x``: the ids
    must mean the same strings and the logits must have the same width.

    Raises:
        ValueError: different logits width, token→id maps, or end-of-sequence id.
    """
    vt, vd = int(target.model.config.vocab_size), int(draft.model.config.vocab_size)
    if vt != vd:
        raise ValueError(f"draft and target must share a vocabulary: target vocab_size {vt}, draft {vd}")
    mt, md = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if mt != md:
        diff = sorted(set(mt.items()) ^ set(md.items()))[:3]
        raise ValueError(f"draft and target must share a tokenizer: token→id maps differ "
                         f"({len(mt)} vs {len(md)} entries, e.g. {diff})")
    if target.eos_token_id != draft.eos_token_id:
        raise ValueError(f"draft and target must share the end-of-sequence id: "
                         f"{target.eos_token_id} vs {draft.eos_token_id}")


@dataclass
class Proposal:
    """Draft tokens and the distributions they came from: ``tokens`` (k ≤ γ), ``q (k, V)`` or
    ``None`` for a deterministic proposer (``q`` is then one-hot)."""

    tokens: list[int]
    q: torch.Tensor | None = None



@dataclass
class DraftRequest:
    """One sequence's part of a drafting round.

    Attributes:
        feed: ids the draft's cache lacks (at least the last committed token); the first
            draft forward feeds them.
        history: the committed ids (prompt + output) for the penalties.
        gamma: how many tokens to draft (0 = none).
        params: sampling settings (the same the target is verified with).
        generator: for the draws when ``params`` sample.
        prompt_len: where the output starts in ``history`` (frequency / presence penalties and
            ``min_tokens`` look at the output only). end_ids: the ids ``min_tokens`` holds back.
    """

    feed: list[int]
    history: list[int]
    gamma: int
    params: SamplingParams
    generator: torch.Generator | None = None
    prompt_len: int | None = None
    end_ids: frozenset[int] = frozenset()


NextLogits = Callable[[dict[Hashable, list[int]]], Mapping[Hashable, torch.Tensor]]


def draft_tokens(next_logits: NextLogits, requests: Mapping[Hashable, DraftRequest]) -> dict[Hashable, Proposal]:
    """Draft ``requests[key].gamma`` tokens for every sequence, all of them in lockstep.

    Each step feeds every unfinished sequence its new ids in one call of ``next_logits``
    and picks one token per sequence: the arg-max of the raw logits when the params are
    plain greedy (``q`` is one-hot there, nothing to keep), else a draw from ``q`` = the
    processed draft distribution, whose rows are kept for verification.

    Args:
        next_logits: ``{key: ids} → {key: logits (V,)}`` — feed ``ids`` to that sequence's
            draft cache and return the logits after the last of them.
        requests: one :class:`DraftRequest` per sequence.

    Returns:
        ``{key: Proposal}`` with ``q (k, V)``, or ``q = None`` for plain greedy.
    """
    props = {key: Proposal([]) for key in requests}
    active = {key: r for key, r in requests.items() if r.gamma > 0}
    rows: dict[Hashable, list[torch.Tensor]] = {key: [] for key in active}
    feed = {key: list(r.feed) for key, r in active.items()}
    for i in range(max((r.gamma for r in active.values()), default=0)):
        logits = next_logits(feed)
        feed = {}
        for key, r in active.items():
            if i >= r.gamma:
                continue
            tokens = props[key].tokens
            if r.params.is_plain_greedy:                      # q is one-hot at the arg-max: skip it
                tokens.append(int(logits[key].argmax()))
            else:
                q = probs_from_logits(logits[key].unsqueeze(0), r.params, [list(r.history) + tokens],
                                      prompt_lens=r.prompt_len, end_ids=r.end_ids)[0]
                tokens.append(int(sample_from(q, r.generator)))
                rows[key].append(q)
            if i < r.gamma - 1:
                feed[key] = [tokens[-1]]
    for key in active:
        props[key].q = torch.stack(rows[key]) if rows[key] else None
    return props


class DraftModelProposer:
    """A small draft model with its own KV cache (the independent-draft variant).

    Args:
        draft: the draft model (e.g. ``load_model("tiny-gpt2-draft")``).
        target: the target it drafts for; checked at setup with :func:`check_same_vocabulary`.

    Attributes:
        kv: the draft's :class:`~labsupport.speculative.cache.CachedLM`.
        forwards, seconds: draft forwards and time spent drafting since :meth:`start`.

    Raises:
        ValueError: draft and target do not share a tokenizer and vocabulary.
    """

    name = "draft model"

    def __init__(self, draft: LoadedModel, target: LoadedModel | None = None):
        if target is not None:
            check_same_vocabulary(target, draft)
        self.draft = draft
        self.kv = CachedLM(draft)
        self.forwards = 0
        self.seconds = 0.0

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Reset and prefill the prompt (all but its last token)."""
        self.kv.reset()
        self.forwards, self.seconds = 0, 0.0
        if len(prompt_ids) > 1:
            self.kv.forward(prompt_ids[:-1])

    @torch.no_grad()
    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | None = None, *, prompt_len: int | None = None,
                end_ids: frozenset[int] = frozenset()) -> Proposal:
        """Draft ``gamma`` tokens after ``seq`` with :func:`draft_tokens`: γ draft forwards (the
        first feeds whatever the cache lacks, usually one token)."""
        start = time.perf_counter()
        self.kv.sync(seq)
        req = DraftRequest(feed=list(seq[len(self.kv.cached):]), history=list(seq), gamma=gamma,
                           params=params, generator=generator, prompt_len=prompt_len, end_ids=end_ids)
        prop = draft_tokens(lambda feed: {0: self.kv.forward(feed[0])[-1]}, {0: req})[0]
        self.forwards += gamma
        self.seconds += time.perf_counter() - start
        return prop


class NgramProposer:
    """Prompt lookup (n-gram drafting): copy what followed the latest earlier occurrence of the
    longest matching suffix n-gram in prompt + output (vLLM's ``ngram`` speculator; Hugging
    Face's ``prompt_lookup_num_tokens``).

    Args:
        max_ngram: longest suffix tried (≥ ``min_ngram``); shorter ones down to ``min_ngram`` next.
        min_ngram: shortest suffix accepted as a match (≥ 1).

    Raises:
        TypeError: a size that is not an integer.
        ValueError: ``min_ngram < 1`` or ``max_ngram < min_ngram``.
    """

    name = "n-gram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.min_ngram = check_int("min_ngram", min_ngram, 1)
        self.max_ngram = check_int("max_ngram", max_ngram, self.min_ngram, hint=" (min_ngram)")
        self.forwards = 0
        self.seconds = 0.0

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Reset the counters (there is no cache to fill)."""
        self.forwards, self.seconds = 0, 0.0

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams | None = None,
                generator: torch.Generator | None = None, *, prompt_len: int | None = None,
                end_ids: frozenset[int] = frozenset()) -> Proposal:
        """Up to ``gamma`` tokens (possibly none when no n-gram matches); the sampling settings are
        not needed (a lookup is deterministic: q is one-hot), they are taken for one interface."""
        start = time.perf_counter()
        tokens = lookup_ngram(seq, gamma, self.max_ngram, self.min_ngram)
        self.seconds += time.perf_counter() - start
        return Proposal(tokens, None)


def lookup_ngram(seq: Sequence[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The continuation (≤ γ tokens) after an earlier match of the longest suffix n-gram.

    The latest match with a full γ-token continuation wins, else the match with the longest
    one (a match near the end has only a few tokens after it).
    ``lookup_ngram([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]``. Returns ``[]`` when nothing matches.
    """
    seq = list(seq)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix, best = seq[-n:], []
        for j in range(len(seq) - n - 1, -1, -1):            # latest occurrence first, not the suffix
            if seq[j:j + n] == suffix and len(seq[j + n:j + n + gamma]) > len(best):
                best = seq[j + n:j + n + gamma]
                if len(best) == gamma:                       # a full-length continuation: take it
                    break
        if best:
            return best
    return []

