"""Lifting a byte DFA to the tokenizer's vocabulary: per-state token masks and next states.

A token is allowed in DFA state ``s`` when walking *all* of its bytes from ``s`` stays alive;
the state it leads to is where the walk ends (Willard & Louf, 2023). Because one token may
cross several grammar pieces (``{"`` is an opening brace *and* the start of a key), the
walk, not the grammar, decides — that is the token-boundary problem solved by construction.

The walk is vectorised over the whole vocabulary: the token bytes sit in a padded array
``(vocab, max_len)``, and ``max_len`` table look-ups move all 4,096 tokens at once. A row
(mask + next states for one DFA state) is computed the first time that state is met and
cached, so a decode step afterwards costs one dictionary look-up.
"""

from __future__ import annotations

import numpy as np
import torch

from .automaton import DFA

WARM_UP_STATES = 2048
"""DFAs up to this many states get every token-index row at compile time (about half a second)."""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode → byte table (``bytes_to_unicode`` inverted; Radford et al., 2019)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokenizer, vocab_size: int | None = None) -> list[bytes | None]:
    """The raw bytes of every token id (``None`` for special tokens such as EOS).

    Works for byte-level BPE tokenizers (GPT-2 family): each token string is mapped back
    through GPT-2's byte table. Ids beyond the tokenizer (padding rows of the embedding)
    are ``None``.
    """
    size = len(tokenizer) if vocab_size is None else vocab_size
    decoder = _byte_decoder()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out: list[bytes | None] = []
    for i in range(size):
        if i in special or i >= len(tokenizer):
            out.append(None)
            continue
        piece = tokenizer.convert_ids_to_tokens(i)
        if piece is None:
            out.append(None)
        elif all(ch in decoder for ch in piece):
            out.append(bytes(decoder[ch] for ch in piece))
        else:
            out.append(tokenizer.decode([i]).encode())
    return out


class TokenIndex:
    """Allowed tokens and next states for every DFA state, computed on first use and cached.

    Args:
        dfa: the byte automaton.
        tokens: ``token_bytes(tokenizer)`` — one entry per vocabulary id.
        eos_token_id: the end-of-sequence id, allowed exactly in accepting states.
        device: where the boolean masks live (the logits' device).
    """

    def __init__(self, dfa: DFA, tokens: list[bytes | None], eos_token_id: int | None,
                 device: torch.device | str = "cpu") -> None:
        self.dfa = dfa
        self.vocab_size = len(tokens)
        self.eos_token_id = eos_token_id
        self.device = torch.device(device)
        lengths = np.array([0 if t is None else len(t) for t in tokens], dtype=np.int64)
        self._order = np.argsort(-lengths, kind="stable")          # longest tokens first
        sorted_len = lengths[self._order]
        width = max(1, int(lengths.max()))
        data = np.zeros((self.vocab_size, width), dtype=np.int64)
        for row, i in enumerate(self._order):
            t = tokens[i]
            if t:
                data[row, :len(t)] = np.frombuffer(t, dtype=np.uint8)
        self._bytes, self._lengths = data, lengths
        self._active = [int((sorted_len > j).sum()) for j in range(width)]   # tokens longer than j
        dead = dfa.num_states                                       # an extra absorbing state
        table = np.where(dfa.transitions >= 0, dfa.transitions, dead)
        self._table = np.vstack([table, np.full((1, 256), dead)]).astype(np.int64)
        self._next: dict[int, np.ndarray] = {}          # state -> (vocab,) next state, -1 = not allowed
        self._mask: dict[int, torch.Tensor] = {}        # state -> (vocab,) bool

    def _walk(self, states: np.ndarray) -> np.ndarray:
        """Next states ``(len(states), vocab)`` after each token from each state (-1 = dies).

        Tokens are sorted longest first, so byte ``j`` only moves the first ``active[j]``
        columns; a dead walk sits in the extra absorbing state.
        """
        cur = np.repeat(states[:, None], self.vocab_size, axis=1).astype(np.int64)
        for j, n in enumerate(self._active):
            cur[:, :n] = self._table[cur[:, :n], self._bytes[None, :n, j]]
        dead = self.dfa.num_states
        cur[cur == dead] = -1
        cur[:, self._lengths[self._order] == 0] = -1      # special tokens carry no text
        out = np.empty_like(cur)
        out[:, self._order] = cur                         # back to vocabulary order
        return out

    def _fill(self, states) -> None:
        todo = np.array([s for s in states if s not in self._next], dtype=np.int64)
        if len(todo) == 0:
            return
        rows = self._walk(todo)
        for s, row in zip(todo.tolist(), rows):
            mask = row >= 0
            if self.eos_token_id is not None:
                mask[self.eos_token_id] = bool(self.dfa.accepting[s])
            self._next[s] = row
            self._mask[s] = torch.from_numpy(mask).to(self.device)

    def warm_up(self, chunk: int = 256, max_states: int = WARM_UP_STATES) -> None:
        """Compute every state's row now (a constant-time mask at every later step), when the DFA has
        at most ``max_states`` states; a larger one fills each row on first use instead (a request
        visits at most ``max_tokens`` states, so the compile stays short and the memory small)."""
        if self.dfa.num_states > max_states:
            return
        for lo in range(0, self.dfa.num_states, chunk):
            self._fill(range(lo, min(lo + chunk, self.dfa.num_states)))

    @property
    def cached_states(self) -> int:
        return len(self._mask)

    def mask(self, state: int) -> torch.Tensor:
        """``(vocab,)`` bool: which tokens may come next in ``state``."""
        if state not in self._mask:
            self._fill([state])
        return self._mask[state]

    def next_rows(self, state: int) -> np.ndarray:
        """``(vocab,)`` the DFA state after each token from ``state`` (-1 = not allowed)."""
        if state not in self._next:
            self._fill([state])
        return self._next[state]

    def next_state(self, state: int, token_id: int) -> int:
        """The DFA state after ``token_id`` (-1 when the token is not allowed)."""
        if state not in self._next:
            self._fill([state])
        return int(self._next[state][token_id])
