"""A request inside the engine: the sequence plus everything needed to sample and finish it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import SamplingParams
from ..stopping import StopRule
from ..structured.cursor import GrammarCursor
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
    cursor: GrammarCursor | None = None                    # where the output stands in the grammar

    def __post_init__(self) -> None:
        if self.grammar is not None and self.cursor is None:
            self.cursor = GrammarCursor(self.grammar)

    def grammar_state(self) -> int:
        """The grammar state after the output so far (:class:`~labsupport.structured.cursor.GrammarCursor`)."""
        return self.cursor.state_for(self.seq.output_ids)
