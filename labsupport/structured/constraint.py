"""What every compiled constraint shares: the token-level loop a decoder drives.

:class:`~.grammar.StructuredOutput` (a DFA) and :class:`~.pushdown.PushdownOutput` (a stack of
DFAs) differ in how they find the next state, the allowed tokens and the distance to a complete
output; how EOS ends an output, when an output must end, how the budget of ``fit_max_tokens``
narrows a mask, and how a state is replayed are the same, and live here.
"""

from __future__ import annotations

import numpy as np
import torch

from ..validation import check_int


class TokenConstraint:
    """Base of the compiled constraints. A subclass gives ``vocab_size``, ``eos_token_id``,
    ``initial_state()``, ``_check_state(state)``, ``_grammar_mask(state)`` (the grammar's own mask),
    ``_token_reach(state)`` (the fewest tokens to finish after each token, ``inf`` where not
    allowed), ``is_accepting(state)`` and ``_next(state, token_id) -> int`` (``-1``: not allowed),
    and sets ``fit_max_tokens``."""

    fit_max_tokens = False

    def allowed_token_mask(self, state: int, tokens_left: int | None = None) -> torch.Tensor:
        """``(vocab,)`` bool tensor: True for every token that keeps the output valid.

        EOS is True exactly when ``state`` is accepting (the text so far is complete). With
        ``fit_max_tokens`` and ``tokens_left`` (tokens the request may still make, this one
        included) only tokens after which a completion and its EOS fit stay allowed; when none
        does (``max_tokens`` below the shortest completion) the tokens nearest to one are.

        The tensor is the cache's own (no copy per step): read it, or ``.clone()`` it before
        writing to it.

        Raises:
            TypeError / ValueError: ``state`` or ``tokens_left`` (an integer >= 0) is not valid.
        """
        state = self._check_state(state)
        base = self._grammar_mask(state)
        if tokens_left is not None:
            tokens_left = check_int("tokens_left", tokens_left, 0)
        if not self.fit_max_tokens or tokens_left is None:
            return base
        budget = self.__dict__.setdefault("_budget_masks", {})
        reaches = self.__dict__.setdefault("_reaches", {})
        if state not in reaches:                                     # once per state
            reach = self._token_reach(state)
            reaches[state] = (reach, float(reach.max(initial=0, where=np.isfinite(reach))))
        reach, worst = reaches[state]
        if worst <= tokens_left - 2:                                 # the budget does not bite
            return base
        key = (state, tokens_left)
        if key not in budget:
            accepting = self.is_accepting(state)
            fits = reach <= tokens_left - 2
            if not fits.any() and not accepting:                     # cannot fit: head for the nearest end
                fits = np.isfinite(reach) & (reach == reach.min())
            mask = torch.from_numpy(fits).to(base.device)
            if self.eos_token_id is not None:
                mask[self.eos_token_id] = accepting
            budget[key] = mask
        return budget[key]

    def check_budget(self, max_tokens: int) -> None:
        """With ``fit_max_tokens``, refuse a request whose ``max_tokens`` (cut to the context window)
        is below the shortest complete output: it could only end invalid, at ``"length"``.

        Raises:
            ValueError: naming ``max_tokens``, the tokens the grammar needs and the value.
        """
        if not self.fit_max_tokens:
            return
        need = self.tokens_to_finish(self.initial_state())
        if max_tokens < need:
            raise ValueError(f"max_tokens must be at least {int(need)} for this structured_output: its shortest "
                             f"complete output takes {int(need)} tokens and fit_max_tokens is on, got {max_tokens} "
                             "(after the cut to the context window)")

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
