"""``LLMEngine``: add requests, then ``step()`` = schedule → run the model → sample and post-process.

The names follow vLLM (``SamplingParams``, ``add_request``, ``step``, ``RequestOutput`` with a
finish reason, ``block_size``, ``num_blocks``, preemption mode), so what a student learns
here carries over to a real serving engine. One step::

    out = scheduler.schedule()                 # who runs, how many tokens, preemptions
    runner.swap_out / swap_in / copy_blocks    # move KV blocks the decisions require
    logits = runner.forward(...)               # one forward over every scheduled token
    sample a token for each sequence whose prompt is complete; finish on EOS / stop / length

A request that could never fit (longer than the pool, the model's positions, or a step's
token budget without chunked prefill) finishes at once with ``finish_reason="error"`` and
the others go on.
"""

from __future__ import annotations

import itertools
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

import torch

from ..generation import token_id_list
from ..sampling import GREEDY, SamplingParams, sample
from .block_manager import BlockManager
from .metrics import RequestMetrics
from .model_runner import ModelRunner
from .scheduler import RUNNING, Scheduler, SchedulerConfig, SchedulerOutput
from .scheduler import Sequence as Seq


@dataclass
class EngineConfig:
    """Engine settings (vLLM's names).

    Attributes:
        block_size: token slots per KV block.
        num_blocks: blocks in the KV pool (its capacity is ``num_blocks · block_size`` tokens).
        max_num_seqs: most sequences running in one step.
        max_num_batched_tokens: token budget of one step; ``None`` = the model's ``n_positions``.
        preemption_mode: ``"recompute"`` or ``"swap"``.
        num_cpu_blocks: CPU swap space in blocks (used with ``"swap"``).
        enable_prefix_caching: reuse the KV of full blocks shared by prompts.
        enable_chunked_prefill: split long prompts into chunks that share steps with decodes.
        max_prefill_chunk: most prompt tokens of one sequence per step (``None`` = the budget).
        record_history: keep an :class:`EngineSnapshot` after every step in ``engine.history``.
        clock: seconds for the metrics (``time.perf_counter``; simulators pass a virtual clock).
        seed: seed of the engine's ``torch.Generator`` (requests without their own seed use it).
    """

    block_size: int = 16
    num_blocks: int = 256
    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    preemption_mode: str = "recompute"
    num_cpu_blocks: int = 256
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    max_prefill_chunk: int | None = None
    record_history: bool = False
    clock: Callable[[], float] = time.perf_counter
    seed: int = 0


class RequestOutput:
    """The state of one request after a step (or at the end).

    Attributes:
        request_id: its id.
        prompt: the prompt text (decoded when the prompt was given as ids).
        prompt_ids: prompt token ids.
        token_ids: generated token ids so far (an EOS that stopped it included, as in ``generate``).
        text: generated text (without the EOS, cut before a stop string); decoded on first
            access, so stepping the engine never pays for detokenising.
        finished: whether it is done.
        finish_reason: ``"stop"`` (EOS or stop string), ``"length"`` (max_new_tokens), ``"error"``
            (it could never fit), or ``None`` while running.
        error: why, for ``"error"``.
        metrics: its :class:`RequestMetrics`.
    """

    __slots__ = (
        "_text",
        "error",
        "finish_reason",
        "finished",
        "metrics",
        "prompt",
        "prompt_ids",
        "request_id",
        "token_ids",
    )

    def __init__(self, request_id: str, prompt: str, prompt_ids: list[int], token_ids: list[int],
                 text: str | Callable[[], str], finished: bool, finish_reason: str | None, error: str | None,
                 metrics: RequestMetrics):
        self.request_id, self.prompt, self.prompt_ids, self.token_ids = request_id, prompt, prompt_ids, token_ids
        self._text, self.finished, self.finish_reason = text, finished, finish_reason
        self.error, self.metrics = error, metrics

    @property
    def text(self) -> str:
        if callable(self._text):
            self._text = self._text()
        return self._text

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, token_ids={self.token_ids!r}, text={self.text!r}, "
                f"finished={self.finished}, finish_reason={self.finish_reason!r}, error={self.error!r})")

    def __eq__(self, other) -> bool:
        names = [n for n in self.__slots__ if n != "_text"]
        return (isinstance(other, RequestOutput) and self.text == other.text
                and all(getattr(self, n) == getattr(other, n) for n in names))


@dataclass
class EngineSnapshot:
    """The engine's state after a step, for figures (block tables, queues, pool).

    Attributes:
        step: steps done so far.
        time: the clock at the snapshot.
        block_tables: ``{request_id: [physical block ids]}`` of resident sequences.
        num_tokens: ``{request_id: tokens holding a slot}`` (slots used in its blocks).
        num_free_blocks / num_cached_blocks / num_used_blocks: the pool (free + cached + used = num_blocks).
        ref_counts: ref count of every block, by block id.
        waiting / running / swapped: request ids in each queue, in order.
        scheduled_tokens: ``{request_id: tokens run this step}`` (a prefill chunk or 1 to decode).
        preempted: ids preempted this step.
        finished: ids finished this step.
        swapped_out / swapped_in / copied: block moves of this step.
    """

    step: int
    time: float
    block_size: int
    num_blocks: int
    block_tables: dict[str, list[int]]
    num_tokens: dict[str, int]
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    ref_counts: list[int]
    waiting: list[str]
    running: list[str]
    swapped: list[str]
    scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    swapped_out: list[tuple[int, int]] = field(default_factory=list)
    swapped_in: dict[int, int] = field(default_factory=dict)
    copied: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_used(self) -> int:
        return self.num_used_blocks

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.scheduled_tokens.values())


@dataclass
class _Request:
    seq: Seq
    params: SamplingParams
    prompt: str
    generator: torch.Generator | None
    metrics: RequestMetrics
    order: int
    forked: bool = False
    children: list[str] = field(default_factory=list)     # ids of its forks, in fork order


class LLMEngine:
    """A paged-KV inference engine for GPT-2-family models with continuous batching.

    Args:
        lm: a :class:`~labsupport.models.LoadedModel` (or a bare GPT-2 model; then prompts
            must be token ids and ``text`` is empty).
        config: an :class:`EngineConfig`; keyword arguments override its fields
            (``LLMEngine(lm, block_size=4, num_blocks=64)`` also works).

    Raises:
        ValueError: an unknown keyword or a setting outside its range.

    Attributes:
        block_manager, scheduler, runner: the three parts (``runner`` is the :class:`ModelRunner`).
        history: one :class:`EngineSnapshot` per step when ``record_history`` is on.
    """

    def __init__(self, lm, config: EngineConfig | None = None, **overrides):
        names = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown engine settings {unknown}; valid ones are {sorted(names)}")
        self.config = cfg = replace(config or EngineConfig(), **overrides)
        for name, low in (("num_cpu_blocks", 0), ("seed", 0)):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self.lm = lm
        self.tokenizer = getattr(lm, "tokenizer", None)
        model = getattr(lm, "model", lm)
        self.runner = ModelRunner(model, cfg.block_size, cfg.num_blocks, cfg.num_cpu_blocks)
        self.block_manager = BlockManager(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching,
                                          cfg.num_cpu_blocks if cfg.preemption_mode == "swap" else 0)
        budget = cfg.max_num_batched_tokens
        if budget is None:
            budget = max(self.runner.max_positions, cfg.max_num_seqs)
        self.scheduler = Scheduler(SchedulerConfig(cfg.max_num_seqs, budget, cfg.preemption_mode,
                                                   cfg.enable_chunked_prefill, cfg.max_prefill_chunk),
                                   self.block_manager)
        self.eos_token_id = getattr(model.config, "eos_token_id", None)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_id = int(self.tokenizer.eos_token_id)
        self.generator = torch.Generator(device=self.runner.device).manual_seed(cfg.seed)
        self.requests: dict[str, _Request] = {}
        self.history: list[EngineSnapshot] = []
        self.step_count = 0
        self._ids = itertools.count()
        self._order = itertools.count()
        self._errors: list[str] = []                 # finished with an error, not yet reported
        self._last: SchedulerOutput = SchedulerOutput()
        self._last_finished: list[str] = []

    @property
    def model_runner(self) -> ModelRunner:
        return self.runner

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams = GREEDY,
                    max_new_tokens: int | None = None, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Queue a request; returns its id.

        Args:
            prompt: text, or token ids.
            params: sampling settings (``params.max_tokens`` unless ``max_new_tokens`` is given;
                ``params.n > 1`` forks n samples sharing the prompt's blocks).
            max_new_tokens: most new tokens (overrides ``params.max_tokens``).
            request_id: default ``"0"``, ``"1"``, … in add order (skipping ids already taken).
            arrival_time: on the engine's clock, not later than now (the engine admits a request
                at once; it cannot hold one back until a future arrival); default now.

        Raises:
            ValueError: bad input (empty prompt, ids outside the vocabulary, a text prompt
                without a tokenizer, ``max_new_tokens < 1``, a duplicate id, an arrival time in
                the future). A request that is valid but can never fit is *not* an exception:
                it finishes with "error".
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")  # noqa: TRY004
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt must be token ids when the engine has no tokenizer")
            ids, text = self.lm.encode(prompt), prompt
        else:
            ids = token_id_list(prompt)
            text = self.tokenizer.decode(ids) if self.tokenizer is not None else ""
        vocab = self.runner.vocab_size
        if not ids:
            raise ValueError("prompt must contain at least one token, got an empty prompt")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}")
        max_new = params.max_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(max_new, bool) or not isinstance(max_new, numbers.Integral) or max_new < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new!r}")
        max_new = int(max_new)
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:                    # the user took this one
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = self.config.clock()
        if arrival_time is not None and not (isinstance(arrival_time, numbers.Real) and arrival_time <= now):
            raise ValueError(f"arrival_time must be a time <= the engine clock now ({now}), got {arrival_time!r}")
        seq = Seq(request_id, ids, max_new)
        req = _Request(seq, params, text, self._generator_for(params, 0),
                       RequestMetrics(now if arrival_time is None else arrival_time), next(self._order))
        self.requests[request_id] = req
        problem = self.scheduler.why_never_fits(len(ids), max_new)
        if len(ids) + max_new > self.runner.max_positions:
            problem = (f"prompt length + max_new_tokens = {len(ids) + max_new} exceeds the model's "
                       f"n_positions = {self.runner.max_positions}")
        if problem is not None:
            seq.finish_reason, seq.error, seq.status = "error", problem, "finished"
            req.metrics.finish_time = now
            self._errors.append(request_id)
        else:
            self.scheduler.add(seq)
        return request_id

    def _generator_for(self, params: SamplingParams, k: int) -> torch.Generator | None:
        if params.greedy:
            return None
        if params.seed is not None:
            return torch.Generator(device=self.runner.device).manual_seed(params.seed + k)
        return self.generator

    def fork(self, request_id: str, n: int) -> list[str]:
        """Add ``n`` copies of a running, decoding request that share its blocks (copy-on-write).

        The children ``"{id}.1"``, … continue from the same tokens with their own generators
        (child k seeded ``seed + k`` when the request has a seed). A name already taken by
        another request is skipped (``"{id}.{k+1}"``, …); the seed still follows k.

        Raises:
            ValueError: ``n < 1``, unknown id, or a request that is not decoding right now.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"request_id {request_id!r} is unknown")
        seq = req.seq
        if seq.status != RUNNING or seq.is_prefill or not self.block_manager.has_seq(seq.seq_id):
            raise ValueError(f"request {request_id!r} must be running and decoding to fork, it is {seq.status}")
        return self._fork(req, n)

    def _fork(self, req: _Request, n: int) -> list[str]:
        parent, new_ids = req.seq, []
        position = self.scheduler.running.index(parent) + 1
        for _ in range(n):
            k = len(req.children) + 1                             # sample index: seed + k
            suffix = k
            while f"{parent.seq_id}.{suffix}" in self.requests:
                suffix += 1
            child_id = f"{parent.seq_id}.{suffix}"
            child = Seq(child_id, list(parent.prompt_ids), parent.max_new_tokens, list(parent.output_ids),
                        RUNNING, parent.num_computed_tokens)
            self.block_manager.fork(parent.seq_id, child_id)
            self.scheduler.running.insert(position, child)
            position += 1
            metrics = replace(req.metrics, token_times=list(req.metrics.token_times))
            self.requests[child_id] = _Request(child, req.params, req.prompt, self._generator_for(req.params, k),
                                               metrics, next(self._order), forked=True)
            req.children.append(child_id)
            new_ids.append(child_id)
        req.forked = True
        return new_ids

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._errors)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward over every scheduled token, sample, post-process.

        Returns:
            outputs of the requests that got a token or finished in this step (and of
            requests that finished with an error since the last step).

        Raises:
            RuntimeError: the scheduler could make no progress (a bug, never expected).
        """
        reported = list(self._errors)
        self._errors.clear()
        out = self.scheduler.schedule()
        if out.is_empty and not reported and self.scheduler.has_unfinished():
            raise RuntimeError("the scheduler made no progress although requests are unfinished")
        if out.blocks_to_swap_out:                                    # the order matters: out, in, copies
            self.runner.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            self.runner.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            self.runner.copy_blocks(out.blocks_to_copy)
        logits = None
        if out.scheduled:
            starts = [s.start for s in out.scheduled]
            tokens = [s.seq.token_ids[s.start:s.start + s.num_tokens] for s in out.scheduled]
            tables = [self.block_manager.block_table(s.seq.seq_id) for s in out.scheduled]
            logits = self.runner.forward(tokens, starts, tables)                   # (B, vocab)
        self.scheduler.on_step_done(out)
        now = self.config.clock()
        sampled, finished = self._sample_and_finish(out, logits, now)
        for rid in out.preempted:
            self.requests[rid].metrics.num_preemptions = self.requests[rid].seq.num_preemptions
        self.step_count += 1
        self._last, self._last_finished = out, finished + reported
        if self.config.record_history:
            self.history.append(self.snapshot())
        return [self.output(rid) for rid in reported + sampled]

    def _sample_and_finish(self, out: SchedulerOutput, logits: torch.Tensor | None,
                           now: float) -> tuple[list[str], list[str]]:
        """Sample one token for every sequence whose prompt is complete; returns (sampled, finished) ids."""
        rows = [i for i, s in enumerate(out.scheduled) if s.completes_prompt]
        for s in out.scheduled:
            m = self.requests[s.seq.seq_id].metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time = now
        todo: list[tuple[int, _Request]] = []
        for i in rows:
            req = self.requests[out.scheduled[i].seq.seq_id]
            todo.append((i, req))
            if req.params.n > 1 and not req.forked and not req.seq.output_ids:
                todo += [(i, self.requests[c]) for c in self._fork(req, req.params.n - 1)]
        plain = [(i, r) for i, r in todo if r.params.greedy and r.params.repetition_penalty == 1.0]
        if plain:                                                   # greedy rows: one argmax
            best = logits[[i for i, _ in plain]].argmax(dim=-1).tolist()
            tokens = {id(r): t for (_, r), t in zip(plain, best)}
        else:
            tokens = {}
        finished = []
        for i, req in todo:
            if id(req) not in tokens:
                tokens[id(req)] = int(sample(logits[i:i + 1], req.params, req.generator, [req.seq.token_ids])[0])
            seq, token = req.seq, tokens[id(req)]
            seq.output_ids.append(token)
            req.metrics.token_times.append(now)
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
            reason = self._finish_reason(req, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                req.metrics.finish_time = now
                finished.append(seq.seq_id)
        return [r.seq.seq_id for _, r in todo], finished

    def _finish_reason(self, req: _Request, token: int) -> str | None:
        if not req.params.ignore_eos and self.eos_token_id is not None and token == self.eos_token_id:
            return "stop"
        if (req.params.stop and self.tokenizer is not None
                and _stop_index(self.tokenizer.decode(req.seq.output_ids), req.params.stop) is not None):
            return "stop"
        if len(req.seq.output_ids) >= req.seq.max_new_tokens:
            return "length"
        return None

    def _text(self, req: _Request, ids: list[int], finish_reason: str | None) -> str:
        if self.tokenizer is None:
            return ""
        if finish_reason == "stop" and ids and ids[-1] == self.eos_token_id and not req.params.ignore_eos:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        cut = _stop_index(text, req.params.stop) if req.params.stop else None
        return text if cut is None else text[:cut]

    def output(self, request_id: str) -> RequestOutput:
        """The current :class:`RequestOutput` of a request.

        Raises:
            ValueError: unknown id.
        """
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"request_id {request_id!r} is unknown")
        seq = req.seq
        state = (list(seq.output_ids), seq.finish_reason)
        return RequestOutput(request_id=request_id, prompt=req.prompt, prompt_ids=list(seq.prompt_ids),
                             token_ids=state[0], text=lambda: self._text(req, *state),
                             finished=seq.finish_reason is not None, finish_reason=seq.finish_reason,
                             error=seq.error, metrics=req.metrics)

    # ------------------------------------------------------------------ whole runs
    def run(self) -> list[RequestOutput]:
        """Step until every request is finished; the requests finished in this run, in add order."""
        done: set[str] = set()
        while self.has_unfinished_requests():
            done.update(o.request_id for o in self.step() if o.finished)
        return [self.output(r) for r in sorted(done, key=lambda r: self.requests[r].order)]

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, params: SamplingParams = GREEDY,
                 max_new_tokens: int | None = None) -> list[RequestOutput]:
        """Add every prompt, run to the end, return their outputs in prompt order
        (with ``params.n > 1`` each prompt's samples follow it).

        Raises:
            ValueError: as :meth:`add_request`.
        """
        if hasattr(prompts, "tolist"):                              # a tensor / array of ids
            prompts = prompts.tolist()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]
        ids = [self.add_request(p, params, max_new_tokens) for p in prompts]
        self.run()
        result = []
        for rid in ids:
            result.append(self.output(rid))
            result += [self.output(c) for c in self.requests[rid].children]
        return result

    # ------------------------------------------------------------------ state for figures
    def snapshot(self) -> EngineSnapshot:
        """The current state (queues, pool, block tables) and the last step's decisions."""
        bm, sch, out = self.block_manager, self.scheduler, self._last
        tables = bm.block_tables()
        return EngineSnapshot(
            step=self.step_count, time=self.config.clock(), block_size=bm.block_size, num_blocks=bm.num_blocks,
            block_tables=tables, num_tokens={s: bm.num_tokens(s) for s in tables},
            num_free_blocks=bm.num_free_blocks, num_cached_blocks=bm.num_cached_blocks,
            num_used_blocks=bm.num_used_blocks, ref_counts=bm.ref_counts(),
            waiting=[s.seq_id for s in sch.waiting], running=[s.seq_id for s in sch.running],
            swapped=[s.seq_id for s in sch.swapped],
            scheduled_tokens={s.seq.seq_id: s.num_tokens for s in out.scheduled},
            preempted=list(out.preempted), finished=list(self._last_finished),
            swapped_out=list(out.blocks_to_swap_out), swapped_in=dict(out.blocks_to_swap_in),
            copied=list(out.blocks_to_copy))


def _stop_index(text: str, stops: Sequence[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
