"""What the engine hands back: a request's output after a step, and snapshots for figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .metrics import RequestMetrics


@dataclass(eq=False)
class RequestOutput:
    """The state of one request after a step, or at the end (vLLM's ``RequestOutput``).

    Attributes:
        request_id: its id.
        prompt: the prompt text (decoded when the prompt was given as ids).
        prompt_ids: prompt token ids.
        token_ids: generated token ids so far (an EOS or stop id that ended it included).
        finished: whether it is done.
        finish_reason: ``"stop"`` (EOS, a stop id or a stop string), ``"length"`` (max_tokens or
            the context window), ``"abort"`` (``abort_request``), ``"error"`` (it could never
            fit), or ``None`` while running.
        error: why, for ``"error"``.
        metrics: its :class:`~labsupport.engine.metrics.RequestMetrics`.
        text: the generated text (without a final EOS / stop id, cut before a stop string);
            decoded on first access, so stepping the engine never pays for detokenising.
        spec_stats / rounds / trees: with speculative decoding (``SpeculativeEngine``) the
            request's acceptance statistics, its round records and (when kept) its verified
            token trees; ``None`` from the plain engine.
    """

    request_id: str
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    error: str | None
    metrics: RequestMetrics
    decode_text: Callable[[], str] = field(default=lambda: "", repr=False)
    spec_stats: object = field(default=None, repr=False)
    rounds: list | None = field(default=None, repr=False)
    trees: list | None = field(default=None, repr=False)
    _text: str | None = field(default=None, init=False, repr=False)

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.decode_text()
        return self._text

    def __eq__(self, other) -> bool:
        names = ("request_id", "prompt", "prompt_ids", "token_ids", "finished", "finish_reason", "error", "metrics")
        return (isinstance(other, RequestOutput) and self.text == other.text
                and all(getattr(self, n) == getattr(other, n) for n in names))


@dataclass
class EngineSnapshot:
    """The engine's state after a step, for figures (block tables, queues, pool).

    Attributes:
        step: steps done so far.
        time: the clock at the snapshot.
        block_tables: ``{request_id: [physical block ids]}`` of resident sequences.
        num_slots: ``{request_id: tokens holding a slot}`` (slots used in its blocks).
        num_free_blocks / num_evictable_blocks / num_used_blocks: the pool
            (free + evictable + used = num_blocks).
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
    num_slots: dict[str, int]
    num_free_blocks: int
    num_evictable_blocks: int
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
    def num_batched_tokens(self) -> int:
        return sum(self.scheduled_tokens.values())

    @classmethod
    def capture(cls, bm, scheduler, out, step: int, now: float, finished: list[str]) -> EngineSnapshot:
        """The snapshot of a block manager and scheduler after a step whose decisions were ``out``."""
        tables = bm.block_tables()
        return cls(step=step, time=now, block_size=bm.block_size, num_blocks=bm.num_blocks,
                   block_tables=tables, num_slots={s: bm.num_slots(s) for s in tables},
                   num_free_blocks=bm.num_free_blocks, num_evictable_blocks=bm.num_evictable_blocks,
                   num_used_blocks=bm.num_used_blocks, ref_counts=bm.ref_counts(),
                   waiting=[s.seq_id for s in scheduler.waiting], running=[s.seq_id for s in scheduler.running],
                   swapped=[s.seq_id for s in scheduler.swapped],
                   scheduled_tokens={s.seq.seq_id: s.num_new_tokens for s in out.scheduled},
                   preempted=list(out.preempted), finished=list(finished),
                   swapped_out=list(out.blocks_to_swap_out), swapped_in=dict(out.blocks_to_swap_in),
                   copied=list(out.blocks_to_copy))
