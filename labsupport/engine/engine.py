"""``LLMEngine``: add requests, then ``step()`` = schedule → move blocks → run the model → sample → finish.

The names follow vLLM (``SamplingParams``, ``add_request``, ``abort_request``, ``step``,
``RequestOutput`` with a finish reason, ``block_size``, ``num_blocks``, preemption mode), so
what a student learns here carries over to a real serving engine (Kwon et al. 2023). One step::

    out = scheduler.schedule()                 # who runs, how many tokens, preemptions
    runner.swap_out / swap_in / copy_blocks    # move the KV blocks the decisions require
    logits = runner.forward(...)               # one forward over every scheduled token
    sample a token for each sequence whose prompt is complete; finish on EOS / stop / length

The context window: a prompt that alone fills the model's ``n_positions`` can never run and
finishes at once with ``finish_reason="error"`` (the others go on); a prompt that fits runs
until ``max_tokens`` or the window is full, then finishes with ``"length"`` (vLLM's rule).
A request that could never fit the pool or, without chunked prefill, a step's token budget
also finishes with ``"error"``.

Requests come in and go out through the methods of :class:`~labsupport.engine.intake.RequestIntake`
(``add_request``, ``add_prefilled_request``, ``abort_request``, ``fork``), mixed into ``LLMEngine``;
this module is the step loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ..sampling import GREEDY, SamplingParams
from ..stopping import model_eos_ids
from ..validation import is_int, renamed
from .block_manager import BlockManager
from .config import EngineConfig, make_config
from .intake import RequestIntake
from .model_runner import ModelRunner
from .outputs import EngineSnapshot, RequestOutput
from .sampler import SampleRow, sample_rows
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .sequence import Sequence as Seq
from .sequence import SequenceStatus

__all__ = ["EngineConfig", "EngineSnapshot", "LLMEngine", "RequestOutput"]


class LLMEngine(RequestIntake):
    """A paged-KV inference engine for GPT-2-family models with continuous batching.

    Args:
        lm: a :class:`~labsupport.models.LoadedModel` (or a bare GPT-2 model; then prompts
            must be token ids and ``text`` is empty).
        config: an :class:`EngineConfig`; keyword arguments override its fields
            (``LLMEngine(lm, block_size=4, num_blocks=64)`` also works).

    Raises:
        TypeError / ValueError: an unknown keyword, or a setting of the wrong type or range.

    Attributes:
        block_manager, scheduler, runner: the three parts (``runner`` is the :class:`ModelRunner`).
        eos_token_ids: every end-of-sequence id of the model (tokenizer and generation config).
        history: one :class:`EngineSnapshot` per step when ``record_history`` is on.
        kv_connector: ``None``, or an object whose ``request_finished(engine, seq, block_ids)`` is
            called when a request finishes, before its blocks are freed (disaggregated serving:
            :class:`~labsupport.serving.kv_transfer.KVConnector` ships the prompt's KV there).
    """

    def __init__(self, lm, config: EngineConfig | None = None, **overrides):
        self.config = cfg = make_config(config, overrides)
        self.lm = lm
        self.tokenizer = getattr(lm, "tokenizer", None)
        model = getattr(lm, "model", lm)
        self.runner = ModelRunner(model, cfg.block_size, cfg.num_blocks, cfg.num_cpu_blocks,
                                  kv_cache_dtype=cfg.kv_cache_dtype, quantization=cfg.quantization,
                                  attention_backend=cfg.attention_backend, batch_invariant=cfg.batch_invariant)
        self.block_manager = BlockManager(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching,
                                          cfg.num_cpu_blocks if cfg.preemption_mode == "swap" else 0)
        budget = cfg.max_num_batched_tokens or max(self.runner.max_positions, cfg.max_num_seqs)
        self.scheduler = Scheduler(SchedulerConfig(cfg.max_num_seqs, budget, cfg.preemption_mode,
                                                   cfg.enable_chunked_prefill, cfg.max_prefill_chunk),
                                   self.block_manager)
        self.eos_token_ids = model_eos_ids(model, self.tokenizer)
        self.generator = torch.Generator(device=self.runner.device).manual_seed(cfg.seed)
        self.requests: dict[str, Seq] = {}
        self.history: list[EngineSnapshot] = []
        self.step_count = 0
        self._ids = itertools.count()
        self._order = itertools.count()
        self._reported: list[str] = []           # finished outside a step (error, abort), not yet reported
        self._last: SchedulerOutput = SchedulerOutput()
        self._last_finished: list[str] = []
        self.kv_connector = None                 # KV transfer hook: see _append_and_finish

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's EOS id (one of :attr:`eos_token_ids`), or ``None``."""
        tok = getattr(self.tokenizer, "eos_token_id", None)
        return int(tok) if tok is not None else min(self.eos_token_ids, default=None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._reported)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """Schedule, move blocks, run one forward over every scheduled token, sample, finish.

        Returns:
            outputs of the requests that got a token or finished in this step (and of
            requests that finished with an error since the last step).

        Raises:
            RuntimeError: the scheduler could make no progress (a bug, never expected).
        """
        reported, self._reported = self._reported, []
        out = self.scheduler.schedule()                                        # 1. schedule
        if out.is_empty and not reported and self.scheduler.has_unfinished():
            raise RuntimeError("the scheduler made no progress although requests are unfinished")
        try:
            return self._run_step(out, reported)
        except Exception as err:                                               # no request left half-updated
            self._end_with_error([s.seq.seq_id for s in out.scheduled], err, reported)
            raise

    def _end_with_error(self, seq_ids: list[str], err: Exception, reported: list[str]) -> None:
        """An exception escaped a step: every request the step touched ends with ``"error"`` and the
        message (its blocks freed, reported by the next step, with those not yet reported), so the
        engine never goes on with a request half-updated; the other requests go on."""
        now, why = self.config.clock(), f"the engine step failed: {type(err).__name__}: {err}"
        self._reported = reported + self._reported
        for rid in dict.fromkeys(seq_ids):
            seq = self.requests.get(rid)
            if seq is None or seq.is_finished:
                continue
            self.scheduler.finish(seq, "error")
            seq.error, seq.metrics.finish_time = why, now
            self._reported.append(rid)

    def _run_step(self, out: SchedulerOutput, reported: list[str]) -> list[RequestOutput]:
        self.runner.swap_out(out.blocks_to_swap_out)                           # 2. move blocks: out, in, copies
        self.runner.swap_in(out.blocks_to_swap_in)
        self.runner.copy_blocks(out.blocks_to_copy)
        logits = None
        if out.scheduled:                                                      # 3. run the model
            logits = self.runner.forward([s.seq.token_ids[s.start:s.start + s.num_new_tokens] for s in out.scheduled],
                                         [s.start for s in out.scheduled],
                                         [self.block_manager.block_table(s.seq.seq_id) for s in out.scheduled])
        self.scheduler.on_step_done(out)
        now = self.config.clock()
        rows = self._rows_to_sample(out, now)                                  # 4. sample
        rows, masks, failed = self._grammar_masks(rows, now)                   # structured output: per-request masks
        reported += failed
        tokens = sample_rows(logits, [SampleRow(i, r.params, r.generator, r.token_ids, len(r.prompt_ids),
                                                r.stop_rule.end_ids) for i, r in rows], masks)
        finished = self._append_and_finish(rows, tokens, now)                  # 5. finish
        for rid in out.preempted:
            self.requests[rid].metrics.num_preemptions = self.requests[rid].num_preemptions
        self.step_count += 1
        self._last, self._last_finished = out, finished + reported
        if self.config.record_history:
            self.history.append(self.snapshot())
        return [self.output(rid) for rid in reported + [r.seq_id for _, r in rows]]

    def _grammar_masks(self, rows: list[tuple[int, Seq]], now: float):
        """Each row's allowed-token mask (``None`` without a grammar). A grammar that cannot go on
        (e.g. a pushdown grammar with too many parses at once) ends its own request with
        ``finish_reason="error"`` and the message; the other requests go on."""
        kept, masks, failed = [], [], []
        for row in rows:
            req = row[1]
            mask = None if req.grammar is None else \
                self._mask_or_fail(req, req.grammar_state(), req.max_new_tokens - len(req.output_ids), now)
            if req.grammar is not None and mask is None:
                failed.append(req.seq_id)
                continue
            kept.append(row)
            masks.append(mask)
        return kept, masks, failed

    def _mask_or_fail(self, req: Seq, state: int, tokens_left: int, now: float) -> torch.Tensor | None:
        """``req``'s grammar mask at ``state``, or None once the grammar raised: the request is then
        finished with ``"error"`` and the message (its blocks freed)."""
        try:
            return req.grammar.allowed_token_mask(state, tokens_left)
        except ValueError as err:
            self._finish_request(req, "error", now)
            req.error = f"structured output: {err}"
            return None

    def _rows_to_sample(self, out: SchedulerOutput, now: float) -> list[tuple[int, Seq]]:
        """``(logits row, request)`` for every sequence whose prompt is complete; a request with
        ``n > 1`` forks its other samples here, once its prompt is computed (they share its row)."""
        rows: list[tuple[int, Seq]] = []
        for i, s in enumerate(out.scheduled):
            req = s.seq
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = now
            if not s.completes_prompt:
                continue
            rows.append((i, req))
            if req.params.n > 1 and not req.forked and not req.output_ids:
                children = [self.requests[c] for c in self._fork(req, req.params.n - 1)]
                rows += [(i, c) for c in children if c.status == SequenceStatus.RUNNING]
        return rows

    def _append_and_finish(self, rows: list[tuple[int, Seq]], tokens: list[int], now: float) -> list[str]:
        finished = []
        for (_, seq), token in zip(rows, tokens):
            if seq.grammar is not None:                                # advance before appending
                seq.cursor.advance(seq.output_ids, token)
            seq.output_ids.append(token)
            seq.metrics.token_times.append(now)
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            reason = seq.stop_rule.check(seq.output_ids, self.tokenizer.decode if self.tokenizer else None)
            if reason is not None:
                self._finish_request(seq, reason, now)
                finished.append(seq.seq_id)
        return finished

    def _finish_request(self, seq: Seq, reason: str, now: float) -> None:
        """A request ends with ``reason``: the KV connector sees it first (e.g. ships its KV to a decode
        engine), then its blocks are freed."""
        if self.kv_connector is not None:
            self.kv_connector.request_finished(self, seq, self.block_manager.block_table(seq.seq_id))
        self.scheduler.finish(seq, reason)
        seq.metrics.finish_time = now

    def _fail(self, seq: Seq, why: str, now: float) -> None:
        """A request that can never run finishes at once with ``"error"`` (reported by the next step);
        the scheduler drops it if it was queued."""
        self.scheduler.finish(seq, "error")
        seq.error = why
        seq.metrics.finish_time = now
        self._reported.append(seq.seq_id)

    def output(self, request_id: str) -> RequestOutput:
        """The current :class:`RequestOutput` of a request.

        Raises:
            ValueError: unknown id.
        """
        seq = self.requests.get(request_id)
        if seq is None:
            raise ValueError(f"request_id {request_id!r} is unknown")
        ids, reason = list(seq.output_ids), seq.finish_reason
        decode = (lambda: seq.stop_rule.text(ids, reason, self.tokenizer.decode)) if self.tokenizer else (lambda: "")
        return RequestOutput(request_id=request_id, prompt=seq.prompt, prompt_ids=list(seq.prompt_ids),
                             token_ids=ids, finished=reason is not None, finish_reason=reason,
                             error=seq.error, metrics=seq.metrics, decode_text=decode)

    # ------------------------------------------------------------------ whole runs
    def run(self) -> list[RequestOutput]:
        """Step until every request is finished; the requests finished in this run, in add order."""
        done: set[str] = set()
        while self.has_unfinished_requests():
            done.update(o.request_id for o in self.step() if o.finished)
        return [self.output(r) for r in sorted(done, key=lambda r: self.requests[r].order)]

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, params: SamplingParams = GREEDY,
                 max_tokens: int | None = None, *, max_new_tokens: int | None = None) -> list[RequestOutput]:
        """Add every prompt, run to the end, return their outputs in prompt order
        (with ``params.n > 1`` each prompt's samples follow it).

        Args:
            prompts: one prompt (text or ids) or a list of them. params: their sampling settings.
            max_tokens: most new tokens each (default ``params.max_tokens``; :meth:`add_request`'s name).
            max_new_tokens: the old name of ``max_tokens``, kept working with a ``DeprecationWarning``.

        Raises:
            TypeError / ValueError: as :meth:`add_request`.
        """
        max_tokens = renamed("max_tokens", max_tokens, "max_new_tokens", max_new_tokens)
        if hasattr(prompts, "tolist"):                              # a tensor / array of ids
            prompts = prompts.tolist()
        if isinstance(prompts, str) or (len(prompts) > 0 and is_int(prompts[0])):     # one prompt
            prompts = [prompts]
        ids = [self.add_request(p, params, max_tokens) for p in prompts]
        self.run()
        result = []
        for rid in ids:
            result.append(self.output(rid))
            result += [self.output(c) for c in self.requests[rid].children]
        return result

    # ------------------------------------------------------------------ state for figures
    def snapshot(self) -> EngineSnapshot:
        """The current state (queues, pool, block tables) and the last step's decisions."""
        return EngineSnapshot.capture(self.block_manager, self.scheduler, self._last, self.step_count,
                                      self.config.clock(), self._last_finished)
