"""A request inside the engine: its tokens and status, what the scheduler queues, and what it needs to be
sampled and finished — settings, stop rule, generator, metrics, grammar (nano-vllm's ``Sequence``; vLLM v1
keeps the same in its ``Request``; vLLM's ``SequenceStatus``).

The name is vLLM's even though ``collections.abc.Sequence`` has it too: a module that needs both
(``engine.py``) imports this one as ``Seq``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from .metrics import RequestMetrics

if TYPE_CHECKING:
    import torch

    from ..sampling import SamplingParams
    from ..stopping import StopRule
    from ..structured.cursor import GrammarCursor


class SequenceStatus(str, Enum):
    """Where a sequence is: in a queue of the scheduler, or done.

    A ``str`` enum, so ``status == "running"`` and figures that print it read naturally.
    """

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"

    def __str__(self) -> str:
        return self.value


@dataclass(eq=False)
class Sequence:
    """One request being generated (or one sample of a request with n > 1): the one object the
    scheduler queues, the block manager names by ``seq_id`` and the engine samples and finishes.

    Attributes:
        seq_id: its id (the request id).
        prompt_ids: the prompt's token ids.
        max_new_tokens: most tokens to generate (already cut to the context window).
        output_ids: tokens generated so far.
        status: a :class:`SequenceStatus`.
        num_computed_tokens: tokens whose K/V is in the cache. A decoding sequence has all its
            tokens but the newest computed; prefill and recompute start from 0 (or from the
            prefix-cache hits).
        finish_reason: ``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` once finished.
        error: why, for ``"error"``.
        num_preemptions: times it was preempted.
        num_prefix_hit_tokens: prompt tokens served from the prefix cache at the last admission.

    What the engine adds when a request comes in (``LLMEngine.add_request``; a scheduler alone needs none):
        params: its :class:`~labsupport.sampling.SamplingParams`. prompt: the prompt's text.
        generator: for its draws (``None`` = greedy or the engine's own). stop_rule: its
        :class:`~labsupport.stopping.StopRule`. metrics: its :class:`RequestMetrics`.
        order: its place in add order. forked / children: a request with n > 1 and the ids of its
        samples, in fork order. grammar / cursor: compiled structured output and where the output
        stands in it (:class:`~labsupport.structured.cursor.GrammarCursor`), or ``None``.
    """

    seq_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0
    num_prefix_hit_tokens: int = 0
    params: SamplingParams | None = None
    prompt: str = ""
    generator: torch.Generator | None = None
    stop_rule: StopRule | None = None
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))
    order: int = 0
    forked: bool = False
    children: list[str] = field(default_factory=list)
    grammar: object = None
    cursor: GrammarCursor | None = None

    def __post_init__(self) -> None:
        if self.grammar is not None and self.cursor is None:
            from ..structured.cursor import GrammarCursor
            self.cursor = GrammarCursor(self.grammar)

    def grammar_state(self) -> int:
        """The grammar state after the output so far (:class:`~labsupport.structured.cursor.GrammarCursor`)."""
        return self.cursor.state_for(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while (re)computing a prompt, False when decoding one token a step."""
        return self.num_uncomputed_tokens > 1 or not self.output_ids

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
