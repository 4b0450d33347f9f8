"""Where a request's output stands in its grammar: the one cursor the engine, the speculative
engine and their requests share."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["GrammarCursor"]


class GrammarCursor:
    """The grammar state after a request's first ``consumed`` output tokens, kept so that a step
    looks it up instead of replaying the output. When the output is not the one last consumed —
    a fork's child, a preempted request recomputed, a speculative round's rejected drafts — the
    state is replayed from the tokens (``grammar.state_after``), the one rule every path follows.
    """

    __slots__ = ("consumed", "grammar", "state")

    def __init__(self, grammar, consumed: int = 0, state: int | None = None):
        self.grammar = grammar
        self.consumed = consumed
        self.state = grammar.initial_state() if state is None else state

    def state_for(self, output_ids: Sequence[int]) -> int:
        """The grammar state after ``output_ids`` (cached; replayed when they changed)."""
        if self.consumed != len(output_ids):
            self.consumed, self.state = len(output_ids), self.grammar.state_after(output_ids)
        return self.state

    def advance(self, output_ids: Sequence[int], token: int) -> int:
        """Consume ``token`` after ``output_ids`` (before it is appended to them); the new state."""
        self.consumed, self.state = len(output_ids) + 1, self.grammar.advance(self.state_for(output_ids), token)
        return self.state

    def copy(self) -> GrammarCursor:
        """An independent cursor at the same place (a fork's child starts where its parent is)."""
        return GrammarCursor(self.grammar, self.consumed, self.state)
