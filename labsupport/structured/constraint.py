"""What every compiled constraint shares: the token-level loop a decoder drives.

:class:`~.grammar.StructuredOutput` (a DFA) and :class:`~.pushdown.PushdownOutput` (a stack of
DFAs) differ in how they find the next state and the allowed tokens; how EOS ends an output,
when an output must end, and how a state is replayed are the same, and live here.
"""

from __future__ import annotations

from ..validation import check_int


class TokenConstraint:
    """Base of the compiled constraints. A subclass gives ``vocab_size``, ``eos_token_id``,
    ``initial_state()``, ``_check_state(state)``, ``allowed_token_mask(state, tokens_left=None)``,
    ``is_accepting(state)`` and ``_next(state, token_id) -> int`` (``-1``: not allowed)."""

    def num_allowed(self, state: int) -> int:
        return int(self.allowed_token_mask(state).sum())

    def is_terminal(self, state: int) -> bool:
        """Accepting with nothing but EOS allowed: the output is complete and must end."""
        mask = self.allowed_token_mask(state)
        return self.is_accepting(state) and int(mask.sum()) == (1 if self.eos_token_id is not None else 0)

    def advance(self, state: int, token_id: int) -> int:
        """The state after ``token_id``; EOS in an accepting state leaves the state unchanged.

        Raises:
            ValueError: ``token_id`` is outside the vocabulary or not allowed in ``state``.
        """
        state = self._check_state(state)
        token_id = check_int("token_id", token_id, 0, self.vocab_size - 1)
        if token_id == self.eos_token_id:
            if not self.is_accepting(state):
                raise ValueError(f"token_id {token_id} (EOS) is not allowed in state {state}: the output is incomplete")
            return state
        nxt = self._next(state, token_id)
        if nxt < 0:
            raise ValueError(f"token_id {token_id} is not allowed by the grammar in state {state}")
        return nxt

    def state_after(self, token_ids) -> int:
        """Replay ``token_ids`` from the start (how a preempted request recovers its state)."""
        state = self.initial_state()
        for t in token_ids:
            state = self.advance(state, int(t))
        return state
