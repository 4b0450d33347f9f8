"""Self-speculation: the draft is the target's own first k layers (early exit).

LayerSkip (Elhoushi et al. 2024) drafts with the first ``k`` of the target's ``L`` blocks
then the target's own final layer norm and LM head, and verifies with the full model; its
early exit works well only after LayerSkip's training recipe (layer dropout and an early-exit
loss). Draft & Verify (Zhang et al. 2024) and SWIFT (Xia et al. 2024) skip *intermediate*
layers instead. This course's simplification is the plain early exit on an untrained model:
no extra weights, no training, and no second KV cache — the draft's keys and values for
layers ``0..k-1`` *are* the target's: the committed prefix is in the target's paged cache
already, and the draft tokens' K/V it writes for those layers is exactly what the verifying
forward writes again.

Its cost per drafted token is about ``k / L`` of a target step plus the fixed per-forward
cost (embedding, the LM head, Python) — which at this model size is a large part of a step.
Its acceptance rate is low for ``k = 1`` (an early exit nobody trained for) and grows with ``k``.
"""

from __future__ import annotations

import torch

from ..engine.extend import extend
from ..validation import check_int
from .proposers import Proposer, draft_tokens
from .rounds import Draft

__all__ = ["SelfSpecProposer"]


class SelfSpecProposer(Proposer):
    """Draft γ tokens with the target's first ``num_layers`` blocks (+ its ``ln_f`` and LM head).

    Args:
        num_layers: k, blocks the draft runs (1 ≤ k < L is checked at :meth:`start`).
        num_speculative_tokens: γ ≥ 1.

    Raises:
        TypeError / ValueError: a size out of range.
    """

    name = "self-speculation"
    needs_paged_target = True

    def __init__(self, num_layers: int = 2, num_speculative_tokens: int = 3):
        super().__init__(num_speculative_tokens)
        self.num_layers = check_int("num_layers", num_layers, 1)

    def start(self, engine, seqs) -> None:
        if self.num_layers >= engine.runner.num_layers:
            raise ValueError(f"num_layers must be < the target's {engine.runner.num_layers} layers, "
                             f"got {self.num_layers}")

    @torch.no_grad()
    def propose(self, engine, seqs) -> dict[str, Draft]:
        """Draft for every sequence in lockstep (:func:`draft_tokens`, one early-exit forward per step)."""
        bm = engine.block_manager
        counts = {s.request_id: min(self.num_speculative_tokens, max(s.room, 0)) for s in seqs}

        def next_logits(feed):
            self.forwards += 1
            out = extend(engine.runner, bm, feed, all_logits=False, num_layers=self.num_layers)
            return {rid: rows[-1] for rid, rows in out.items()}

        drafts = draft_tokens(next_logits, seqs, {s.request_id: s.token_ids[-1:] for s in seqs}, counts)
        for s in seqs:                                   # give the draft's slots back; verification refills them
            bm.truncate(s.request_id, len(s.prompt_ids) + len(s.output_ids) - 1)
        return drafts
