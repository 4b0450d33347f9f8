"""Proposers: who drafts the tokens of a round — one protocol for every method — and the draft loop.

Every method implements :class:`Proposer` (vLLM calls them proposers too):

* ``num_speculative_tokens`` — γ, the most draft tokens along one path (vLLM's name);
  ``max_draft_tokens`` — the most tokens one draft holds (γ for a chain, the node count of a tree);
* ``start(engine, seqs)`` — new requests (prefill a draft cache, set up per-request state);
* ``propose(engine, seqs) -> {request_id: Draft}`` — one round's drafts for the batch;
* ``observe(engine, s, draft, path, hidden, logits)`` — after verification: the accepted node
  indices and the target's hidden states and logits over the verified tokens;
* ``finish(engine, s)`` — a request ended (give back its draft cache).

``engine`` is the caller: :class:`~labsupport.speculative.engine.SpeculativeEngine` (paged
cache: ``engine.runner``, ``engine.block_manager``) or the Hugging Face loop of
:func:`~labsupport.speculative.decode.speculative_generate` (``engine.target`` only; a proposer
with ``needs_paged_target`` refuses it). This module holds the two methods that need nothing of
the target: a draft model with its own paged KV cache (Leviathan et al. 2023; Chen et al. 2023)
and n-gram prompt lookup (vLLM's ``ngram``; Hugging Face's ``prompt_lookup_num_tokens``), and
:func:`draft_tokens`, the one loop that drafts with any model, one batched forward per step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence

import torch

from ..engine.block_manager import BlockManager
from ..engine.extend import extend
from ..engine.model_runner import ModelRunner
from ..kv import blocks_needed
from ..models import LoadedModel
from ..validation import check_int, check_type
from ..sampling import sample_from
from .rounds import Draft, SpecSequence, draft_distribution

__all__ = ["DraftModelProposer", "NgramProposer", "Proposer", "check_same_vocabulary", "draft_tokens",
           "lookup_ngram"]


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


class Proposer:
    """The proposer protocol, with do-nothing hooks (see the module docstring).

    Attributes:
        name: shown in tables and panels.
        num_speculative_tokens: γ ≥ 1. max_draft_tokens: most tokens one draft holds.
        needs_paged_target: True when the proposer reads the target's paged cache or hidden states.
        forwards: draft forwards run so far (0 for proposers without a draft model).
    """

    name = "proposer"
    needs_paged_target = False

    def __init__(self, num_speculative_tokens: int):
        self.num_speculative_tokens = check_int("num_speculative_tokens", num_speculative_tokens, 1)
        self.forwards = 0

    @property
    def max_draft_tokens(self) -> int:
        return self.num_speculative_tokens

    def check_target(self, target: LoadedModel) -> None:
        """Raise ``ValueError`` unless this proposer can draft for ``target``; called when an engine
        (or :func:`~labsupport.speculative.speculative_generate`) is given the proposer, before any
        request runs."""

    def start(self, engine, seqs: Sequence[SpecSequence]) -> None:
        """New requests are running (their prompts, all but the last token, are in the target's cache)."""

    def propose(self, engine, seqs: Sequence[SpecSequence]) -> dict[str, Draft]:
        raise NotImplementedError

    def observe(self, engine, s: SpecSequence, draft: Draft, path: list[int], hidden: torch.Tensor | None,
                logits: torch.Tensor) -> None:
        """After the round of ``s`` was verified and committed (``s.rounds[-1]``)."""

    def finish(self, engine, s: SpecSequence) -> None:
        """``s`` ended (finished or aborted)."""


NextLogits = Callable[[dict[str, list[int]]], Mapping[str, torch.Tensor]]


def draft_tokens(next_logits: NextLogits, seqs: Sequence[SpecSequence], feeds: Mapping[str, list[int]],
                 num_tokens: Mapping[str, int]) -> dict[str, Draft]:
    """Draft ``num_tokens[id]`` tokens for every sequence, all of them in lockstep.

    Each step feeds every unfinished sequence its new ids in one call of ``next_logits`` and
    picks one token per sequence: the arg-max of the raw logits when the params are plain
    greedy (``q`` is one-hot there, nothing to keep), else a draw from ``q`` = the processed
    draft distribution (:func:`~.rounds.draft_distribution`), whose rows are kept for verification.

    Args:
        next_logits: ``{id: ids} → {id: logits (V,)}`` — feed ``ids`` to that sequence's draft
            cache and return the logits after the last of them.
        seqs: the sequences. feeds: per sequence the ids its draft cache lacks (at least the
            last committed token). num_tokens: per sequence how many to draft (0 = none).

    Returns:
        ``{id: Draft}`` (chains) with ``q (k, V)``, or ``q = None`` for plain greedy.
    """
    drafts = {s.request_id: Draft() for s in seqs}
    active = [s for s in seqs if num_tokens[s.request_id] > 0]
    rows: dict[str, list[torch.Tensor]] = {s.request_id: [] for s in active}
    feed = {s.request_id: list(feeds[s.request_id]) for s in active}
    for i in range(max((num_tokens[s.request_id] for s in active), default=0)):
        logits = next_logits(feed)
        feed = {}
        for s in active:
            rid, gamma = s.request_id, num_tokens[s.request_id]
            if i >= gamma:
                continue
            tokens = drafts[rid].tokens
            if s.params.is_plain_greedy:                      # q is one-hot at the arg-max: skip it
                tokens.append(int(logits[rid].argmax()))
            else:
                q = draft_distribution(logits[rid], s, tokens)
                tokens.append(int(sample_from(q, s.generator)))
                rows[rid].append(q)
            if i < gamma - 1:
                feed[rid] = [tokens[-1]]
    for s in active:
        if rows[s.request_id]:
            drafts[s.request_id].q = torch.stack(rows[s.request_id])
    return drafts


def pool_shape(engine) -> tuple[int, int]:
    """``(block_size, num_blocks)`` for a proposer's own paged cache: the engine's pool, or (for
    the Hugging Face loop) 16-token blocks enough for one sequence of the model's ``n_positions``."""
    bm = getattr(engine, "block_manager", None)
    if bm is not None:
        return bm.block_size, bm.num_blocks
    return 16, blocks_needed(engine.target.model.config.n_positions, 16) + 1


class DraftModelProposer(Proposer):
    """A small draft model with its own paged KV cache (the independent-draft method).

    Args:
        draft: the draft model (e.g. ``load_model("tiny-gpt2-draft")``).
        target: the target it drafts for; checked with :func:`check_same_vocabulary` (without it,
            the engine or ``speculative_generate`` given this proposer checks its own target).
        num_speculative_tokens: γ ≥ 1.

    Attributes:
        runner, block_manager: the draft's cache for the engine it served last (one cache per
            engine, made at its first :meth:`start` and shaped like its pool, so one proposer can
            serve several engines at once). forwards: draft forwards since construction.

    Raises:
        TypeError / ValueError: γ out of range; ``draft`` / ``target`` not LoadedModels; draft and
            target do not share a vocabulary.
    """

    name = "draft model"

    def __init__(self, draft: LoadedModel, target: LoadedModel | None = None, num_speculative_tokens: int = 4):
        super().__init__(num_speculative_tokens)
        check_type("draft", draft, LoadedModel)
        if target is not None:
            check_type("target", target, LoadedModel)
            check_same_vocabulary(target, draft)
        self.draft = draft
        self.runner: ModelRunner | None = None
        self.block_manager: BlockManager | None = None
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # engine → (runner, manager)

    def check_target(self, target: LoadedModel) -> None:
        """Draft and target must share a vocabulary (:func:`check_same_vocabulary`)."""
        check_same_vocabulary(target, self.draft)

    def _cache(self, engine) -> BlockManager:
        """The draft's paged cache for ``engine`` (made on first use, shaped like its pool)."""
        block_size, num_blocks = pool_shape(engine)
        cache = self._caches.get(engine)
        if cache is None or (cache[1].block_size, cache[1].num_blocks) != (block_size, num_blocks):
            cache = (ModelRunner(self.draft, block_size, num_blocks), BlockManager(num_blocks, block_size))
            self._caches[engine] = cache
        self.runner, self.block_manager = cache
        return cache[1]

    def start(self, engine, seqs) -> None:
        """Prefill every new prompt (all but its last token) into the draft's cache in one forward."""
        check_same_vocabulary(engine.target, self.draft)
        bm = self._cache(engine)
        for s in seqs:
            if bm.has_seq(s.request_id):
                bm.free(s.request_id)
        todo = {s.request_id: s.prompt_ids[:-1] for s in seqs if len(s.prompt_ids) > 1}
        if todo:
            extend(self.runner, bm, todo, all_logits=False)

    @torch.no_grad()
    def propose(self, engine, seqs) -> dict[str, Draft]:
        """γ draft forwards for the whole batch (the first feeds whatever each cache lacks)."""
        bm = self._cache(engine)
        feeds = {s.request_id: s.token_ids[bm.num_slots(s.request_id) if bm.has_seq(s.request_id) else 0:]
                 for s in seqs}
        counts = {s.request_id: min(self.num_speculative_tokens, max(s.room, 0)) for s in seqs}

        def next_logits(feed):
            self.forwards += 1
            return {rid: rows[-1] for rid, rows in extend(self.runner, bm, feed, all_logits=False).items()}

        return draft_tokens(next_logits, seqs, feeds, counts)

    def observe(self, engine, s, draft, path, hidden, logits) -> None:
        """Keep the draft's KV of the committed prefix only: drafts after the first rejection go."""
        rec, bm = s.rounds[-1], self._cache(engine)
        if bm.has_seq(s.request_id):
            bm.truncate(s.request_id, min(rec.position + rec.num_accepted, bm.num_slots(s.request_id)))

    def finish(self, engine, s) -> None:
        bm = self._cache(engine)
        if bm.has_seq(s.request_id):
            bm.free(s.request_id)


class NgramProposer(Proposer):
    """Prompt lookup (n-gram drafting): copy what followed the latest earlier occurrence of the
    longest matching suffix n-gram in prompt + output (vLLM's ``ngram`` method, with its names).

    Args:
        num_speculative_tokens: γ ≥ 1.
        prompt_lookup_max: longest suffix tried (≥ ``prompt_lookup_min``); shorter ones next.
        prompt_lookup_min: shortest suffix accepted as a match (≥ 1).

    Raises:
        TypeError: a size that is not an integer.
        ValueError: γ < 1, ``prompt_lookup_min < 1`` or ``prompt_lookup_max < prompt_lookup_min``.
    """

    name = "n-gram"

    def __init__(self, num_speculative_tokens: int = 4, prompt_lookup_max: int = 3, prompt_lookup_min: int = 1):
        super().__init__(num_speculative_tokens)
        self.prompt_lookup_min = check_int("prompt_lookup_min", prompt_lookup_min, 1)
        self.prompt_lookup_max = check_int("prompt_lookup_max", prompt_lookup_max, self.prompt_lookup_min,
                                           hint=" (prompt_lookup_min)")

    def propose(self, engine, seqs) -> dict[str, Draft]:
        """Up to γ tokens each (none when no n-gram matches); deterministic, so ``q`` is one-hot."""
        return {s.request_id: Draft(lookup_ngram(s.token_ids, min(self.num_speculative_tokens, max(s.room, 0)),
                                                 self.prompt_lookup_max, self.prompt_lookup_min)) for s in seqs}


def lookup_ngram(seq: Sequence[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The continuation (≤ γ tokens) after an earlier match of the longest suffix n-gram.

    The latest match with a full γ-token continuation wins, else the match with the longest
    one (a match near the end has only a few tokens after it).
    ``lookup_ngram([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]``. Returns ``[]`` when nothing matches.
    """
    seq = list(seq)
    if gamma <= 0:
        return []
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
