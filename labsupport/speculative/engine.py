"""The speculative engine: :class:`~labsupport.engine.LLMEngine` whose step is a draft-verify round.

One class runs every method — a draft model, n-gram prompt lookup, self-speculation, Medusa
heads, lookahead — through one :class:`~labsupport.speculative.proposers.Proposer` protocol,
as vLLM runs them behind ``speculative_config={"method": …, "num_speculative_tokens": γ}``.
Requests, ids, sampling settings, the context window, stop rules, structured output, ``n``
samples, aborts and :class:`~labsupport.engine.RequestOutput` are the plain engine's; only
``step`` differs. One step:

1. admit waiting requests first come first served while the pool can *reserve* every block
   they could ever need (prompt + ``max_tokens`` + the largest draft), so no preemption is
   ever needed; prefill each admitted prompt but its last token (:func:`~labsupport.engine.extend.extend`);
2. the proposer drafts for every running sequence (a :class:`~.rounds.Draft`: a chain, or a
   token tree under greedy settings), cut to what each request may still emit;
3. the target verifies every sequence's ``[last, draft…]`` in **one** forward through the paged
   cache (``extend`` with the tree attention mask where needed, hidden states returned);
4. :func:`~.rounds.finish_round` — the exact rejection rule (a chain) or the longest agreeing
   greedy path (a tree), then the commit under the request's stop rule;
5. the accepted tree nodes' K/V move into place (:func:`~.tree.compact_kv`), the rejected
   slots go back to the pool (``BlockManager.truncate``), and the proposer observes the round.

A :class:`~.policy.SpecPolicy` sets γ by batch size and switches drafting off when the batch is
large (vLLM's dynamic speculative decoding, ``num_speculative_tokens_per_batch_size``); a smaller
γ cuts each draft to that many tokens along any path; ``proposer=None`` is plain decoding through
the same code (the fair baseline of every measurement).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from ..engine.engine import LLMEngine
from ..engine.extend import extend
from ..engine.outputs import RequestOutput
from ..validation import check_bool
from .config import SpeculativeConfig, make_proposer
from .policy import SpecPolicy
from .proposers import Proposer
from .rounds import Draft, SpecSequence, clip_draft, finish_round
from .stats import SpecStats
from .tree import compact_kv

__all__ = ["SpeculativeEngine"]


class SpeculativeEngine(LLMEngine):
    """A paged-KV engine that drafts and verifies every step (speculative decoding).

    Args:
        lm: the target (a :class:`~labsupport.models.LoadedModel` of the GPT-2 family).
        proposer: a :class:`~.proposers.Proposer`, a ``speculative_config`` (a
            :class:`~.config.SpeculativeConfig` or its dict, e.g. ``{"method": "ngram",
            "num_speculative_tokens": 4}``), or ``None`` (plain decoding, same code path).
        policy: a :class:`~.policy.SpecPolicy`, γ by batch size (default: always the proposer's γ).
        keep_trees: keep every tree round's tree and accepted path (for the chapter's panel).
        config / overrides: :class:`~labsupport.engine.EngineConfig` settings, as ``LLMEngine``
            (``block_size``, ``num_blocks``, ``max_num_seqs``, ``seed`` …). Prefix caching,
            chunked prefill and swapping are not combined with speculation here.

    Attributes:
        proposer, policy, speculative_config: as given (``speculative_config`` None for an object).
        num_rounds: verification forwards. speculative_rounds: rounds the policy let draft.
        num_verified_tokens: tokens fed to verification forwards (roots included), all sequences.
        draft_seconds / target_seconds: time drafting (the proposer's ``propose`` and ``observe``) /
            verifying (the target forward, acceptance, KV compaction) since construction.
        prefill_seconds: time prefilling admitted prompts — the target's forward over each prompt
            and the proposer's ``start`` (a draft model prefilling the prompt too, EAGLE its head's
            window) — since construction: paid once per request, not sped up by speculation.
        peak_blocks: most target blocks in use at once.

    Raises:
        TypeError: a proposer that is not a Proposer, config or None; a flag that is not a bool.
        ValueError: an unknown method or setting, ``enable_prefix_caching``,
            ``enable_chunked_prefill`` or ``preemption_mode="swap"``.
    """

    def __init__(self, lm, proposer: Proposer | SpeculativeConfig | Mapping | None = None, *,
                 policy: SpecPolicy | None = None, keep_trees: bool = False, config=None, **overrides):
        super().__init__(lm, config, **overrides)
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            if getattr(self.config, name):
                raise ValueError(f"{name}=True is not supported by SpeculativeEngine; use LLMEngine")
        if self.config.preemption_mode != "recompute":
            raise ValueError("preemption_mode='swap' is not supported by SpeculativeEngine (it never preempts)")
        if self.tokenizer is None:
            raise ValueError("SpeculativeEngine needs a LoadedModel (model + tokenizer), got a bare model")
        self.speculative_config = None
        if isinstance(proposer, (SpeculativeConfig, Mapping)):
            self.speculative_config = SpeculativeConfig.from_any(proposer)
            proposer = make_proposer(self.speculative_config, lm)
        if proposer is not None and not isinstance(proposer, Proposer):
            raise TypeError(f"proposer must be a Proposer, a speculative_config or None, got {type(proposer).__name__}")
        if policy is not None and not isinstance(policy, SpecPolicy):
            raise TypeError(f"policy must be a SpecPolicy or None, got {type(policy).__name__}")
        if proposer is not None:
            proposer.check_target(lm)                               # here, not in the first step
        self.proposer, self.policy = proposer, policy
        self.keep_trees = check_bool("keep_trees", keep_trees)
        self.target = lm
        self.spec: dict[str, SpecSequence] = {}
        self._reserved: dict[str, int] = {}
        self.num_rounds = self.speculative_rounds = self.num_verified_tokens = self.peak_blocks = 0
        self.draft_seconds = self.target_seconds = self.prefill_seconds = 0.0

    @property
    def num_speculative_tokens(self) -> int:
        """γ of the proposer (0 without one)."""
        return 0 if self.proposer is None else self.proposer.num_speculative_tokens

    @property
    def max_draft_tokens(self) -> int:
        return 0 if self.proposer is None else self.proposer.max_draft_tokens

    # ------------------------------------------------------------------ requests
    def abort_request(self, request_id) -> list[RequestOutput]:
        """As :meth:`LLMEngine.abort_request`; the proposer's state of each request goes too."""
        outs = super().abort_request(request_id)
        for o in outs:
            self._release(o.request_id)
        return outs

    def _release(self, rid: str) -> None:
        self._reserved.pop(rid, None)
        s = self.spec.get(rid)
        if s is not None and self.proposer is not None:
            self.proposer.finish(self, s)

    def output(self, request_id: str) -> RequestOutput:
        """The request's :class:`RequestOutput`, with its ``spec_stats``, ``rounds`` and ``trees``."""
        out = super().output(request_id)
        s = self.spec.get(request_id)
        if s is not None:
            out.spec_stats, out.rounds, out.trees = s.stats, s.rounds, s.trees
        return out

    # ------------------------------------------------------------------ one step
    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        """Admit and prefill, then one draft-verify round over every running sequence.

        Returns:
            outputs of the requests that got tokens or finished in this step.
        """
        reported, self._reported = self._reported, []
        try:
            self._admit(self.config.clock())
            running = [self.spec[s.seq_id] for s in self.scheduler.running]
            running = [s for s in running if self._grammar_can_go_on(s, reported)]
            finished = self._round(running) if running else []
        except Exception as err:                                    # no request left half-updated
            self._end_with_error([s.seq_id for s in self.scheduler.running], err, reported)
            raise
        self.step_count += 1
        self._last_finished = finished + reported
        return [self.output(rid) for rid in reported + [s.request_id for s in running]]

    def _grammar_can_go_on(self, s: SpecSequence, reported: list[str]) -> bool:
        """False (and the request ended with ``"error"``, as in :class:`LLMEngine`) when its grammar
        cannot give a mask at the current state."""
        if s.grammar is None or self._mask_or_fail(self.requests[s.request_id], s.grammar_state(),
                                                    s.max_tokens - len(s.output_ids), self.config.clock()) is not None:
            return True
        reported.append(s.request_id)
        return False

    def _admit(self, now: float) -> list[str]:
        """Move waiting requests to running while their whole reservation fits; prefill them.

        A request with ``n > 1`` puts its other samples at the front of the queue (each is then
        admitted and prefilled like a request of its own, with its own seed)."""
        sched, bm, cfg = self.scheduler, self.block_manager, self.config
        admitted = []
        while sched.waiting and len(sched.running) < cfg.max_num_seqs:
            seq = sched.waiting[0]
            need = bm.blocks_needed(seq.num_tokens + seq.max_new_tokens + self.max_draft_tokens)
            if need > bm.num_blocks:
                self._fail(seq, f"request needs {need} blocks (prompt + max_tokens + a draft of "
                                f"{self.max_draft_tokens}) but the pool has {bm.num_blocks}", now)
                continue
            if sum(self._reserved.values()) + need > bm.num_blocks:
                break
            sched.start_running(seq)
            self._reserved[seq.seq_id] = need
            admitted.append(seq.seq_id)
            if seq.params.n > 1 and not seq.forked:
                self._fork(seq, seq.params.n - 1, share_blocks=False)
        if not admitted:
            return []
        todo = {rid: self.requests[rid].token_ids[:-1] for rid in admitted
                if len(self.requests[rid].token_ids) > 1}
        every_row = bool(getattr(self.proposer, "needs_prompt_hidden", False))   # EAGLE reads every feature
        t0 = time.perf_counter()
        out = extend(self.runner, bm, todo, all_logits=every_row, return_hidden=True) if todo else {}
        new = []
        for rid in admitted:
            self.requests[rid].metrics.first_scheduled_time = now
            s = self._spec_sequence(self.requests[rid])
            s.state["prefill_hidden"] = out[rid][0][-1] if rid in out else None
            if every_row:
                s.state["prompt_hidden"] = out[rid][0] if rid in out else None
            new.append(s)
        if self.proposer is not None:                                # a draft model's prefill, EAGLE's window
            self.proposer.start(self, new)
        self.prefill_seconds += time.perf_counter() - t0
        return admitted

    def _spec_sequence(self, req) -> SpecSequence:
        s = SpecSequence(req, SpecStats(num_speculative_tokens=max(1, self.num_speculative_tokens)))
        self.spec[s.request_id] = s
        return s

    def _round(self, seqs: list[SpecSequence]) -> list[str]:
        """Draft, verify all sequences in one target forward, commit, give back rejected slots."""
        t0 = time.perf_counter()
        gamma = self.num_speculative_tokens if self.policy is None else \
            self.policy.num_speculative_tokens(len(seqs), self.num_speculative_tokens)   # γ for this batch size
        speculate = self.proposer is not None and gamma > 0
        drafts = self.proposer.propose(self, seqs) if speculate else {}
        bm = self.block_manager
        drafts = {s.request_id: clip_draft(drafts.get(s.request_id, Draft()), min(s.room, gamma), s.token_ids[-1],
                                           self.max_draft_tokens, self._slots_left(s)) for s in seqs}
        t1 = time.perf_counter()
        self.draft_seconds += t1 - t0
        self.speculative_rounds += int(speculate)
        feeds = {s.request_id: s.token_ids[bm.num_slots(s.request_id) if bm.has_seq(s.request_id) else 0:]
                 + drafts[s.request_id].tokens for s in seqs}
        out = extend(self.runner, bm, feeds, tree_parents=self._tree_parents(feeds, drafts), return_hidden=True)
        self.peak_blocks = max(self.peak_blocks, bm.num_used_blocks)
        self.num_rounds += 1
        self.num_verified_tokens += sum(1 + len(d.tokens) for d in drafts.values())
        now, finished, observing = self.config.clock(), [], 0.0
        for s in seqs:
            d, (hidden, logits) = drafts[s.request_id], out[s.request_id]
            k = 1 + len(d.tokens)
            hidden, logits = hidden[-k:], logits[-k:]
            before = len(s.prompt_ids) + len(s.output_ids)
            rec, path = finish_round(logits, d, s, self.tokenizer.decode, self.keep_trees)
            if d.parents is not None:
                compact_kv(self.runner, bm, s.request_id, before - 1, path)
            bm.truncate(s.request_id, before + rec.num_accepted)
            metrics = self.requests[s.request_id].metrics
            metrics.token_times.extend([now] * len(rec.emitted))
            if metrics.first_token_time is None and rec.emitted:
                metrics.first_token_time = now
            if s.finish_reason is not None:
                self._finish_request(self.requests[s.request_id], s.finish_reason, now)
                finished.append(s.request_id)
            elif self.proposer is not None:                      # the proposer's own work (EAGLE runs its head)
                t2 = time.perf_counter()
                self.proposer.observe(self, s, d, path, hidden, logits)
                observing += time.perf_counter() - t2
        self.draft_seconds += observing                          # drafting work, not verification
        self.target_seconds += time.perf_counter() - t1 - observing
        return finished

    def _slots_left(self, s: SpecSequence) -> int:
        """Draft tokens the context window has slots for this round: every fed token takes one."""
        bm = self.block_manager
        cached = bm.num_slots(s.request_id) if bm.has_seq(s.request_id) else 0
        return self.runner.max_positions - cached - (len(s.prompt_ids) + len(s.output_ids) - cached)

    @staticmethod
    def _tree_parents(feeds, drafts):
        """Parents over each sequence's fed tokens (``[uncached…, root, nodes…]``) for tree drafts."""
        if all(d.parents is None for d in drafts.values()):
            return None
        parents = {}
        for rid, d in drafts.items():
            if d.parents is None:
                continue
            lead = len(feeds[rid]) - 1 - len(d.tokens)                 # committed tokens fed before the root
            chain = list(range(-1, lead))                              # …a causal chain up to the root
            parents[rid] = chain + [lead + p if p >= 0 else -1 for p in d.parents[1:]]
        return parents

    def _end_with_error(self, seq_ids, err: Exception, reported: list[str]) -> None:
        super()._end_with_error(seq_ids, err, reported)
        for rid in seq_ids:
            self._release(rid)

    def _finish_request(self, req, reason: str, now: float) -> None:
        """As the plain engine's, and the proposer's state of the request goes too."""
        self._release(req.seq_id)
        super()._finish_request(req, reason, now)
