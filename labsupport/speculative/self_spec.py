"""Self-speculation: the draft is the target's own first k layers (early exit).

LayerSkip (Elhoushi et al. 2024) and Draft & Verify (Zhang et al. 2024): run only the
first ``k`` of the target's ``L`` blocks, then the target's own final layer norm and LM
head, to draft γ tokens; the full target verifies them. No extra weights, no training, and
no second KV cache: the draft's keys and values for layers ``0..k-1`` *are* the target's —
the committed prefix is in the target's paged cache already, and the draft tokens' K/V it
writes for those layers is exactly what the verifying forward writes again.

Its cost ratio is ``c ≈ k / L`` plus the fixed per-forward cost (embedding, LM head,
Python) — which at this model size is most of a step. Its acceptance rate is low for
``k = 1`` (an early exit nobody trained for) and grows with ``k``.
"""

from __future__ import annotations

import torch

from ..validation import check_int
from .proposers import DraftRequest, draft_tokens
from .tree import tree_forward
from .variants import Draft

__all__ = ["SelfSpecProposer"]


class SelfSpecProposer:
    """Draft γ tokens with the target's first ``num_layers`` blocks (+ its ``ln_f`` and LM head).

    Args:
        num_layers: k, blocks the draft runs (1 ≤ k < L is checked at :meth:`start`).
        gamma: draft length γ ≥ 1.

    Raises:
        TypeError / ValueError: a size out of range.
    """

    name = "self-speculation"

    def __init__(self, num_layers: int = 2, gamma: int = 3):
        self.num_layers = check_int("num_layers", num_layers, 1)
        self.gamma = check_int("gamma", gamma, 1)
        self.depth = self.gamma
        self.forwards = 0

    def start(self, engine, s) -> None:
        if self.num_layers >= engine.runner.num_layers:
            raise ValueError(f"num_layers must be < the target's {engine.runner.num_layers} layers, "
                             f"got {self.num_layers}")

    @torch.no_grad()
    def propose(self, engine, seqs) -> dict[str, Draft]:
        """Draft for every sequence in lockstep (:func:`draft_tokens`, one early-exit forward per step)."""
        bm = engine.block_manager
        requests = {s.rid: DraftRequest(feed=[s.seq[-1]], history=s.seq, gamma=self.gamma, params=s.params,
                                        generator=s.generator) for s in seqs}

        def next_logits(feed):
            self.forwards += 1
            out = tree_forward(engine.runner, bm, {rid: (ids, None) for rid, ids in feed.items()},
                               num_layers=self.num_layers)
            return {rid: logits[-1] for rid, (_, logits) in out.items()}

        props = draft_tokens(next_logits, requests)
        for s in seqs:                                   # give the draft's slots back; verification refills them
            bm.truncate(s.rid, len(s.seq) - 1)
        return {rid: Draft(p.tokens, None, p.q) for rid, p in props.items()}

    def observe(self, engine, s, draft, hidden, logits, last_node) -> None:
        """Nothing to keep: the next round starts from the committed tokens."""
