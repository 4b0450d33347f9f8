"""Speculative decoding on the paged KV cache: draft, verify a whole batch in one forward, roll back.

Built on two operations of the paged cache:

* :func:`extend` reserves slots for several new tokens per sequence
  (``BlockManager.reserve``) and runs them in **one** forward
  (``ModelRunner.extend``), returning the logits of every one — the verification of
  ``[last, d_1..d_γ]`` for every running sequence at once;
* ``BlockManager.truncate(seq_id, n)`` keeps the first ``n`` tokens: the slots of rejected
  draft tokens are overwritten next round and blocks past the new end go back to the pool.

A draft model gets its own runner and block manager (its own paged KV cache); n-gram prompt
lookup needs none. Verification is :func:`labsupport.speculative.verify_round` — the same
exact rejection sampling as the plain loop — with a ``torch.Generator`` per request.

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

from ..models import LoadedModel
from ..sampling import GREEDY, SamplingParams, probs_from_logits
from ..speculative import (
    Proposal,
    RoundRecord,
    SpecStats,
    check_same_vocabulary,
    emit_block,
    lookup_ngram,
    sample_from,
    verify_round,
)
from .block_manager import BlockManager
from .extend import extend
from .model_runner import ModelRunner



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
        draft's (None for n-gram). ``num_rounds``: verification forwards so far;
        ``peak_blocks``: most target blocks in use at once.

    Raises:
        ValueError: draft and target vocabularies differ, or bad sizes.
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, *, gamma: int = 4,
                 block_size: int = 16, num_blocks: int = 256, max_num_seqs: int = 8, max_ngram: int = 3,
                 seed: int = 0):
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
            raise ValueError(f"gamma must be an integer >= 0, got {gamma!r}")
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
        if draft is not None:
            check_same_vocabulary(target, draft)
        self.target, self.draft, self.gamma = target, draft, gamma
        self.max_num_seqs, self.max_ngram, self.seed = max_num_seqs, max_ngram, seed
        self.runner = ModelRunner(target, block_size, num_blocks)
        self.block_manager = BlockManager(num_blocks, block_size)
        self.draft_runner = ModelRunner(draft, block_size, num_blocks) if draft is not None else None
        self.draft_block_manager = BlockManager(num_blocks, block_size) if draft is not None else None
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
            ValueError: an empty prompt or ids outside the vocabulary.
        """
        from ..generation import _prompt_ids

        max_new = params.max_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new!r}")
        waiting = []
        for i, prompt in enumerate(prompts):
            ids = _prompt_ids(self.target, prompt)
            seed = params.seed if params.seed is not None else self.seed + i
            gen = torch.Generator(device=self.target.device).manual_seed(seed)
            need = self.block_manager.blocks_needed(len(ids) + max_new + self.gamma)
            waiting.append(_Seq(rid=str(i), prompt_ids=ids, max_new=max_new, params=params, generator=gen,
                                reserved=need, stats=SpecStats(gamma=self.gamma, reached=[0] * self.gamma,
                                                               accepted=[0] * self.gamma), seq=list(ids)))
        done: dict[str, SpecRequestOutput] = {}
        running: list[_Seq] = []
        limit = self.runner.max_positions
        while waiting or running:
            admitted = []
            while waiting and len(running) < self.max_num_seqs:
                s = waiting[0]
                if len(s.prompt_ids) + s.max_new > limit or s.reserved > self.block_manager.num_blocks:
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
        t0 = time.perf_counter()
        props = {s.rid: Proposal([]) for s in seqs}
        if self.draft_runner is None:
            for s in seqs:
                props[s.rid] = Proposal(lookup_ngram(s.seq, gammas[s.rid], self.max_ngram))
        else:
            bm, active = self.draft_block_manager, [s for s in seqs if gammas[s.rid] > 0]
            rows: dict[str, list[torch.Tensor]] = {s.rid: [] for s in active}
            feed = {s.rid: s.seq[bm.num_tokens(s.rid) if bm.has_seq(s.rid) else 0:] for s in active}
            for i in range(max((gammas[s.rid] for s in active), default=0)):
                logits = extend(self.draft_runner, bm, feed, all_logits=False)        # {rid: (1, V)}
                feed = {}
                for s in active:
                    if i >= gammas[s.rid]:
                        continue
                    tokens = props[s.rid].tokens
                    if s.params.greedy and s.params.repetition_penalty == 1.0:     # q one-hot: skip it
                        tokens.append(int(logits[s.rid][0].argmax()))
                    else:
                        q = probs_from_logits(logits[s.rid], s.params, [s.seq + tokens])[0]
                        tokens.append(int(sample_from(q, s.generator)))
                        rows[s.rid].append(q)
                    if i < gammas[s.rid] - 1:
                        feed[s.rid] = [tokens[-1]]
            for s in active:
                props[s.rid].q = torch.stack(rows[s.rid]) if rows[s.rid] else None
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
            rec = verify_round(logits[s.rid][-(len(prop.tokens) + 1):], prop, s.seq, s.params, s.generator)
            eos = None if s.params.ignore_eos else self.target.eos_token_id
            s.finish = emit_block(rec, s.seq, s.new, eos=eos, stop=s.params.stop, max_new=s.max_new,
                                  decode=self.target.decode)
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
        from ..generation import _stop_hit

        if error is not None:
            return SpecRequestOutput(s.rid, s.prompt_ids, [], "", "error", error)
        eos = self.target.eos_token_id
        ids = s.new[:-1] if s.finish == "stop" and s.new and s.new[-1] == eos and not s.params.ignore_eos else s.new
        text = self.target.decode(ids)
        cut = _stop_hit(text, s.params.stop) if s.params.stop else None
        return SpecRequestOutput(s.rid, s.prompt_ids, list(s.new), text if cut is None else text[:cut], s.finish,
                                 None, s.rounds, s.stats)


@dataclass
class EngineComparison:
    """Plain ``LLMEngine`` vs :class:`SpecDecodeEngine` on one batch (fastest of the repeats)."""

    batch: int
    proposer: str
    gamma: int
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    speedup: float
    tokens_per_round: float
    identical: bool             # same token ids as the plain engine (expected for greedy)
    pool_whole: bool            # every block free again after the run


def compare_with_engine(target: LoadedModel, draft: LoadedModel | None, prompt: Sequence[int], batch: int, *,
                        gamma: int = 4, max_new_tokens: int = 32, params: SamplingParams = GREEDY,
                        block_size: int = 16, repeats: int = 2) -> EngineComparison:
    """Time ``batch`` copies of ``prompt`` through the plain engine and the speculative engine.

    Both get the same pool (enough blocks for every sequence at once) and ``max_num_seqs =
    batch``. Wall-clock; use one torch thread.

    Raises:
        ValueError: ``batch`` or ``repeats`` < 1.
    """
    from .engine import LLMEngine

    for name, value in (("batch", batch), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    prompts = [list(prompt)] * batch
    blocks = batch * ((len(prompt) + max_new_tokens + gamma) // block_size + 2)
    best_plain = best_spec = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        plain = LLMEngine(target, block_size=block_size, num_blocks=blocks, max_num_seqs=batch).generate(
            prompts, params, max_new_tokens)
        best_plain = min(best_plain, time.perf_counter() - t0)
        eng = SpecDecodeEngine(target, draft, gamma=gamma, block_size=block_size, num_blocks=blocks,
                               max_num_seqs=batch)
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params, max_new_tokens)
        best_spec = min(best_spec, time.perf_counter() - t0)
    tokens = sum(len(o.token_ids) for o in outs)
    return EngineComparison(batch=batch, proposer="draft model" if draft is not None else "n-gram", gamma=gamma,
                            plain_tokens_per_s=sum(len(o.token_ids) for o in plain) / best_plain,
                            spec_tokens_per_s=tokens / best_spec, speedup=best_plain / best_spec,
                            tokens_per_round=sum(o.stats.tokens_per_round for o in outs) / batch,
                            identical=[o.token_ids for o in outs] == [o.token_ids for o in plain],
                            pool_whole=eng.block_manager.num_free_blocks == blocks)
