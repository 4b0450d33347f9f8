"""A Hugging Face model with its ``DynamicCache`` and the ids it holds — rolled back by cropping.

Speculative decoding feeds tokens that may be rejected; their keys and values must leave
the cache again. ``DynamicCache.crop(-k)`` drops the last ``k`` positions, so keeping the
list of cached ids next to the cache is all the bookkeeping a single sequence needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..models import LoadedModel, model_forward


class CachedLM:
    """A model with a KV cache and the ids it holds; syncs to a new sequence by cropping.

    Attributes:
        lm: the model. cache: its ``DynamicCache`` (``None`` before the first forward).
        cached: the token ids whose keys and values the cache holds, in order.
    """

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.cache = None
        self.cached: list[int] = []

    def reset(self) -> None:
        """Forget everything (the next forward starts a new cache)."""
        self.cache, self.cached = None, []

    def sync(self, seq: Sequence[int]) -> None:
        """Keep the KV of the longest common prefix of the cached ids and ``seq`` (minus its last
        token, which must be fed again to get logits); drop the rest (``crop(-k)``)."""
        keep = 0
        limit = min(len(self.cached), len(seq) - 1)
        while keep < limit and self.cached[keep] == seq[keep]:
            keep += 1
        self.drop(len(self.cached) - keep)

    def drop(self, k: int) -> None:
        """Forget the last ``k`` cached tokens (``k = 0`` does nothing)."""
        if k > 0:
            self.cache.crop(-k)
            del self.cached[-k:]

    def forward(self, new_ids: Sequence[int]) -> torch.Tensor:
        """Feed ``new_ids`` after the cached ones; returns logits ``(len(new_ids), V)`` float32."""
        inp = torch.tensor([list(new_ids)], device=self.lm.device)
        logits, self.cache = model_forward(self.lm.model, inp, self.cache)
        self.cached.extend(int(t) for t in new_ids)
        return logits[0].float()
