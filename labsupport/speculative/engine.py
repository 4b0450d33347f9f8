"""Speculative decoding on the paged KV cache: draft, verify a whole batch in one forward, roll back.

Built on two operations of the paged cache:

* :func:`~labsupport.engine.extend.extend` reserves slots for several new tokens per sequence
  (``BlockManager.reserve``) and runs them in **one** forward
  (``ModelRunner.extend``), returning the logits of every one — the verification of
  ``[last, d_1..d_γ]`` for every running sequence at once;
* ``BlockManager.truncate(seq_id, n)`` keeps the first ``n`` tokens: the slots of rejected
  draft tokens are overwritten next round and blocks past the new end go back to the pool.

A draft model gets its own runner and block manager (its own paged KV cache); n-gram prompt
lookup needs none. Drafting is :func:`~labsupport.speculative.proposers.draft_tokens` (one
batched draft forward per step for every sequence), verification
:func:`~labsupport.speculative.rounds.verify_round` and committing
:func:`~labsupport.speculative.rounds.commit_round` under each request's
:class:`~labsupport.stopping.StopRule` — the same code as the plain loop — with a
``torch.Generator`` per request.

Scheduling is deliberately simple (the subject here is the round, not the scheduler):
requests are admitted first come first served while the pool can *reserve* every block
they could ever need (prompt + ``max_new_tokens`` + γ), so no preemption is needed; a
request that could never fit finishes with ``finish_reason="error"``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..engine.block_manager import BlockManager
from ..engine.extend import extend
from ..engine.model_runner import ModelRunner
from ..generation import _prompt_ids
from ..models import LoadedModel
from ..sampling import GREEDY, SamplingParams
from ..stopping import StopRule
from ..validation import check_int, check_type
from .proposers import DraftRequest, Proposal, check_same_vocabulary, draft_tokens, lookup_ngram
from .rounds import RoundRecord, commit_round, verify_round
from .stats import SpecStats


@dataclass
class SpecRequestOutput:
    """A finished request: ids, text (EOS and stop string cut as in ``generate``), reason, rounds."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    error: str | None = None
    rounds: list[RoundRecord] = field(default_factory=list)
    stats: SpecStats | None = None


@dataclass
class _Seq:
    rid: str
    prompt_ids: list[int]
    max_new: int
    params: SamplingParams
    generator: torch.Generator | None
    rule: StopRule
    reserved: int
    stats: SpecStats
    seq: list[int] = field(default_factory=list)
    new: list[int] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    finish: str | None = None


class SpecDecodeEngine:
    """Batched speculative decoding over paged KV caches.

    Args:
        target: the target model (GPT-2 family).
        draft: a draft model sharing the target's vocabulary, or ``None`` for n-gram lookup.
        gamma: draft length γ ≥ 1 (``0`` = plain decoding through the same code path).
        block_size, num_blocks: the target's KV pool (the draft gets a pool of the same shape).
        max_num_seqs: most sequences in one round.
        max_ngram: longest n-gram suffix tried by prompt lookup.
        seed: base seed of per-request generators (request i uses ``params.seed`` or seed + i).

    Attributes:
        block_manager / runner: the target's; ``draft_block_manager`` / ``draft_runner`` the
        draft's (None for n-gram). ``eos_token_ids``: every end-of-sequence id of the target
        (config, generation config, tokenizer — as ``LLMEngine``). ``num_rounds``: verification forwards so far;
        ``peak_blocks``: most target blocks in use at once.

    Raises:
        TypeError: a size that is not an integer.
        ValueError: draft and target vocabularies differ, or a size out of range.
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, *, gamma: int = 4,
                 block_size: int = 16, num_blocks: int = 256, max_num_seqs: int = 8, max_ngram: int = 3,
                 seed: int = 0):
        gamma = check_int("gamma", gamma, 0)
        max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        max_ngram = check_int("max_ngram", max_ngram, 1)
        seed = check_int("seed", seed, 0, 2 ** 63 - 1)
        if draft is not None:
            check_same_vocabulary(target, draft)
        self.target, self.draft, self.gamma = target, draft, gamma
        self.max_num_seqs, self.max_ngram, self.seed = max_num_seqs, max_ngram, seed
        self.runner = ModelRunner(target, block_size, num_blocks)
        self.block_manager = BlockManager(num_blocks, block_size)
        self.draft_runner = ModelRunner(draft, block_size, num_blocks) if draft is not None else None
        self.draft_block_manager = BlockManager(num_blocks, block_size) if draft is not None else None
        self.eos_token_ids = target.eos_token_ids         # every EOS id, as LLMEngine counts them
        self.num_rounds = 0
        self.peak_blocks = 0
        self.draft_seconds = 0.0
        self.target_seconds = 0.0

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams = GREEDY,
                 max_new_tokens: int | None = None) -> list[SpecRequestOutput]:
        """Run every prompt to the end; outputs in prompt order.

        Raises:
            TypeError: ``params`` not a SamplingParams, ``max_new_tokens`` not an integer.
            ValueError: an empty prompt, ids outside the vocabulary, ``max_new_tokens < 1``, or
            ``params.structured_output`` set (not supported with speculative decoding).
            A prompt that fills the context window finishes with ``"error"``; one that fits runs
            until ``max_tokens`` or the window is full (``"length"``).
        """
        check_type("params", params, SamplingParams)
        if params.structured_output is not None:
            raise ValueError("structured_output is not supported by SpecDecodeEngine; use LLMEngine")
        requested = check_int("max_new_tokens", params.max_tokens if max_new_tokens is None else max_new_tokens, 1)
        limit = self.runner.max_positions
        waiting = []
        for i, prompt in enumerate(prompts):
            ids = _prompt_ids(self.target, prompt)
            max_new = max(1, min(requested, limit - len(ids)))      # the context window: run until it is full
            seed = params.seed if params.seed is not None else self.seed + i
            gen = torch.Generator(device=self.target.device).manual_seed(seed)
            need = self.block_manager.blocks_needed(len(ids) + max_new + self.gamma)
            rule = StopRule.from_params(params, self.eos_token_ids, max_new)
            waiting.append(_Seq(rid=str(i), prompt_ids=ids, max_new=max_new, params=params, generator=gen,
                                rule=rule, reserved=need, stats=SpecStats(gamma=self.gamma), seq=list(ids)))
        done: dict[str, SpecRequestOutput] = {}
        running: list[_Seq] = []
        while waiting or running:
            admitted = []
            while waiting and len(running) < self.max_num_seqs:
                s = waiting[0]
                if len(s.prompt_ids) >= limit or s.reserved > self.block_manager.num_blocks:
                    waiting.pop(0)
                    done[s.rid] = self._output(s, error=f"needs {s.reserved} blocks / "
                                               f"{len(s.prompt_ids) + s.max_new} positions; the pool has "
                                               f"{self.block_manager.num_blocks} blocks, n_positions {limit}")
                    continue
                if sum(r.reserved for r in running) + s.reserved > self.block_manager.num_blocks:
                    break
                running.append(waiting.pop(0))
                admitted.append(s)
            if not running:
                continue
            self._prefill(admitted)
            self._round(running)
            for s in [r for r in running if r.finish]:
                self.block_manager.free(s.rid)
                if self.draft_block_manager is not None and self.draft_block_manager.has_seq(s.rid):
                    self.draft_block_manager.free(s.rid)
                running.remove(s)
                done[s.rid] = self._output(s)
        return [done[str(i)] for i in range(len(prompts))]

    # ------------------------------------------------------------------ one round for the batch
    def _prefill(self, seqs: list[_Seq]) -> None:
        """Put every prompt but its last token into the target's (and draft's) paged cache."""
        todo = {s.rid: s.prompt_ids[:-1] for s in seqs if len(s.prompt_ids) > 1}
        if todo:
            extend(self.runner, self.block_manager, todo, all_logits=False)
            if self.draft_runner is not None:
                extend(self.draft_runner, self.draft_block_manager, todo, all_logits=False)

    def _propose(self, seqs: list[_Seq], gammas: dict[str, int]) -> dict[str, Proposal]:
        """Draft for every sequence: n-gram lookup, or the draft model in one forward per step."""
        t0 = time.perf_counter()
        if self.draft_runner is None:
            props = {s.rid: Proposal(lookup_ngram(s.seq, gammas[s.rid], self.max_ngram)) for s in seqs}
        else:
            bm = self.draft_block_manager
            requests = {s.rid: DraftRequest(feed=s.seq[bm.num_tokens(s.rid) if bm.has_seq(s.rid) else 0:],
                                            history=s.seq, gamma=gammas[s.rid], params=s.params,
                                            generator=s.generator, prompt_len=len(s.prompt_ids),
                                            end_ids=s.rule.end_ids) for s in seqs}

            def next_logits(feed: dict[str, list[int]]) -> dict[str, torch.Tensor]:
                return {rid: rows[-1] for rid, rows in extend(self.draft_runner, bm, feed, all_logits=False).items()}

            props = draft_tokens(next_logits, requests)
        self.draft_seconds += time.perf_counter() - t0
        return props

    def _round(self, seqs: list[_Seq]) -> None:
        """Draft for every sequence, verify all of them in one target forward, commit, roll back."""
        gammas = {s.rid: min(self.gamma, s.max_new - len(s.new) - 1) for s in seqs}
        props = self._propose(seqs, gammas)
        t0 = time.perf_counter()
        bm = self.block_manager
        feed = {s.rid: s.seq[bm.num_tokens(s.rid) if bm.has_seq(s.rid) else 0:] + props[s.rid].tokens for s in seqs}
        logits = extend(self.runner, bm, feed)                                      # {rid: (len, V)}
        self.peak_blocks = max(self.peak_blocks, bm.num_used_blocks)
        self.num_rounds += 1
        for s in seqs:
            prop, before = props[s.rid], len(s.seq)
            rec = verify_round(logits[s.rid][-(len(prop.tokens) + 1):], prop, s.seq, s.params, s.generator,
                               prompt_len=len(s.prompt_ids), end_ids=s.rule.end_ids)
            s.finish = commit_round(rec, s.seq, s.new, s.rule, self.target.decode)
            s.rounds.append(rec)
            s.stats.add(rec)
            s.stats.target_forwards += 1
            # the cache keeps the committed prefix; the rejected drafts' slots are given back
            keep = before + rec.num_accepted
            bm.truncate(s.rid, keep)
            if self.draft_block_manager is not None and self.draft_block_manager.has_seq(s.rid):
                dbm = self.draft_block_manager
                dbm.truncate(s.rid, min(keep, dbm.num_tokens(s.rid)))
        self.target_seconds += time.perf_counter() - t0

    def _output(self, s: _Seq, error: str | None = None) -> SpecRequestOutput:
        if error is not None:
            return SpecRequestOutput(s.rid, s.prompt_ids, [], "", "error", error)
        return SpecRequestOutput(s.rid, s.prompt_ids, list(s.new), s.rule.text(s.new, s.finish, self.target.decode),
                                 s.finish, None, s.rounds, s.stats)
