"""A request inside the engine: the sequence plus everything needed to sample and finish it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import SamplingParams
from ..stopping import StopRule
from .metrics import RequestMetrics
from .sequence import Sequence


@dataclass
class Request:
    """One request inside the engine: its sequence, settings, stop rule, generator, metrics and,
    with structured output, its grammar (vLLM v1 keeps the same in ``Request``)."""

    seq: Sequence
    params: SamplingParams
    prompt: str
    generator: torch.Generator | None
    stop_rule: StopRule
    metrics: RequestMetrics
    order: int
    forked: bool = False
    children: list[str] = field(default_factory=list)     # ids of its forks, in fork order
    grammar: object = None                                 # compiled structured output, or None
    grammar_at: tuple[int, int] = (0, 0)                   # (output tokens consumed, grammar state)

    def grammar_state(self) -> int:
        """The grammar state after the output so far: a cached look-up, replayed from the output
        tokens whenever they are not the ones last consumed (a fork, a preempted request)."""
        done, state = self.grammar_at
        if done != len(self.seq.output_ids):
            state = self.grammar.state_after(self.seq.output_ids)
            self.grammar_at = (len(self.seq.output_ids), state)
        return state
