"""CacheBlend (Yao et al. 2024): join separately cached chunks, recompute a few tokens.

RAG puts several retrieved chunks into one prompt. Prefix caching helps only the first
chunk: the second chunk's K/V depend on the first (its tokens attend to them), so a chunk
cached on its own is *not* the K/V it has inside the joined prompt. Reusing the cached K/V
as-is loses the cross-chunk attention; recomputing everything loses the cache.

CacheBlend recomputes a fraction ``r`` of the context tokens: those whose K/V deviate the
most from the full prefill. The deviation is measured at an early layer — here: run layer 0
fresh over the whole joined context, project layer 1's K/V, compare with the cached ones —
and the selected tokens are then recomputed through every layer, attending to a cache that
holds fresh K/V for selected tokens and reused K/V for the others::

    for layer l:   K_l = reused K_l;  K_l[S] = k_l(x_S);   x_S ← block_l(x_S | K_l, V_l)

``r = 0`` is reuse as-is, ``r = 1`` is exactly a full prefill.

Positions: GPT-2 has *learned absolute* position embeddings, added to the token embedding
before layer 0. A chunk's K/V computed at positions ``0 … n-1`` are wrong at every layer when
the chunk sits at offset 1,000 of the joined prompt, and nothing can shift them afterwards
(with RoPE the keys can be re-rotated, which CacheBlend does). ``positions="final"`` computes
each chunk at its final offset (a cache entry is then tied to an offset); ``"zero"`` computes
it at 0 and shows the error that leaves.

This module runs the real model's weights (those of a :class:`~labsupport.engine.ModelRunner`)
in a dense per-token forward, because the selective recompute touches non-contiguous tokens.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..validation import check_choice, check_int, check_real, check_token_ids, is_int

__all__ = ["BlendResult", "CacheBlend"]


@dataclass
class BlendResult:
    """One blend's error against the full prefill.

    Attributes:
        r: fraction of context tokens recomputed; method: ``"deviation"``, ``"random"`` or ``"none"``.
        kl: mean KL(full ‖ blend) of the next-token distribution over the answer positions (nats).
        top1: fraction of answer positions whose argmax equals the full prefill's.
        compute_fraction: token·layers computed for the context (selection pass included) over
            a full prefill's ``T · L``.
        seconds: wall time of the blend and the question's prefill (one run).
        selected: the recomputed context positions.
    """

    r: float
    method: str
    kl: float
    top1: float
    compute_fraction: float
    seconds: float
    selected: list[int]


class CacheBlend:
    """Chunks cached separately, joined for a question, compared with a full prefill.

    Args:
        runner: a :class:`~labsupport.engine.ModelRunner` (its weights are used), or an engine.
        chunks: token ids of each context chunk (≥ 1 chunk, none empty).
        question: token ids of the question (≥ 1).
        answer_len: answer tokens scored (the full prefill's greedy answer, teacher-forced).
        positions: ``"final"`` (each chunk cached at its offset) or ``"zero"`` (cached at 0).
        select_layer: the layer whose K/V deviation picks the tokens (≥ 1).

    Raises:
        TypeError / ValueError: empty chunks or question, too long for ``n_positions``, a bad
            ``positions`` or ``select_layer``.
    """

    def __init__(self, runner, chunks: list[list[int]], question: list[int], answer_len: int = 16,
                 positions: str = "final", select_layer: int = 1):
        self.run_ = getattr(runner, "runner", runner)
        self.positions = check_choice("positions", positions, ("final", "zero"))
        self.select_layer = check_int("select_layer", select_layer, 1, self.run_.num_layers - 1)
        self.answer_len = check_int("answer_len", answer_len, 1)
        if not isinstance(chunks, (list, tuple)) or not chunks:
            raise ValueError(f"chunks must be a non-empty list of token-id lists, got {chunks!r:.60}")
        vocab = self.run_.vocab_size
        self.chunks = [check_token_ids(f"chunks[{i}]", c, vocab) for i, c in enumerate(chunks)]
        self.question = check_token_ids("question", question, vocab)
        self.context = [t for c in self.chunks for t in c]
        self.T = len(self.context)
        if self.T + len(self.question) + self.answer_len > self.run_.max_positions:
            raise ValueError(f"context + question + answer must fit n_positions={self.run_.max_positions}, "
                             f"got {self.T + len(self.question) + self.answer_len}")
        self.ctx_pos = torch.arange(self.T)
        # the chunks' own caches (each prefilled alone)
        ks, vs, off = [], [], 0
        for c in self.chunks:
            start = off if self.positions == "final" else 0
            k, v = self.prefill(c, torch.arange(start, start + len(c)))
            ks.append(k)
            vs.append(v)
            off += len(c)
        self.reused_k, self.reused_v = torch.cat(ks, 1), torch.cat(vs, 1)     # (L, T, H, D)
        # the reference: a full prefill of the joined context, and its greedy answer
        t0 = time.perf_counter()
        self.full_k, self.full_v = self.prefill(self.context, self.ctx_pos)
        logits = self.extend(self.question, self.full_k, self.full_v)
        self.full_seconds = time.perf_counter() - t0
        answer = []
        for _ in range(self.answer_len - 1):
            answer.append(int(logits[-1].argmax()))
            logits = self.extend(self.question + answer, self.full_k, self.full_v)
        self.answer = answer
        self.full_logprobs = F.log_softmax(logits, -1)[len(self.question) - 1:]   # (answer_len, V)

    # ------------------------------------------------------------------ the dense forward
    def _qkv(self, layer, x: torch.Tensor):
        r = self.run_
        h = F.layer_norm(x, x.shape[-1:], *layer.ln_1, eps=r.eps)
        qkv = layer.c_attn(h)
        return qkv.view(len(x), 3, r.num_heads, r.head_dim).unbind(1)          # (n, H, D) each

    def _finish(self, layer, x, q, keys, values, q_pos, k_pos) -> torch.Tensor:
        """Attention of ``q`` over ``keys`` (causal by position), then the MLP: the new ``x``."""
        mask = (k_pos[None, :] <= q_pos[:, None])[None, None]                    # (1, 1, n, K)
        a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                           values.transpose(0, 1)[None], attn_mask=mask, scale=layer.scale)
        a = a[0].transpose(0, 1).reshape(len(x), -1)
        x = x + layer.attn_proj(a)
        h = F.layer_norm(x, x.shape[-1:], *layer.ln_2, eps=self.run_.eps)
        return x + layer.mlp_proj(layer.act(layer.c_fc(h)))

    @torch.inference_mode()
    def prefill(self, ids: list[int], pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V ``(L, n, H, D)`` of ``ids`` at positions ``pos``, computed alone (a chunk's cache)."""
        r = self.run_
        x = r.wte[torch.tensor(ids)] + r.wpe[pos]
        ks, vs = [], []
        for layer in r.layers:
            q, k, v = self._qkv(layer, x)
            ks.append(k)
            vs.append(v)
            x = self._finish(layer, x, q, k, v, pos, pos)
        return torch.stack(ks), torch.stack(vs)

    @torch.inference_mode()
    def extend(self, ids: list[int], ctx_k: torch.Tensor, ctx_v: torch.Tensor,
               ctx_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(n, V)`` of ``ids`` placed after a context cache ``(L, T', H, D)`` at ``ctx_pos``
        (default the whole context's positions); ``ids`` stay at positions ``T …``."""
        r = self.run_
        pos = torch.arange(self.T, self.T + len(ids))
        k_pos = torch.cat([self.ctx_pos if ctx_pos is None else ctx_pos, pos])
        x = r.wte[torch.tensor(ids)] + r.wpe[pos]
        for i, layer in enumerate(r.layers):
            q, k, v = self._qkv(layer, x)
            x = self._finish(layer, x, q, torch.cat([ctx_k[i], k]), torch.cat([ctx_v[i], v]), pos, k_pos)
        x = F.layer_norm(x, x.shape[-1:], *r.ln_f, eps=r.eps)
        return r.lm_head_linear(x).float()

    # ------------------------------------------------------------------ blending
    @torch.inference_mode()
    def deviation(self) -> torch.Tensor:
        """``(T,)`` K/V deviation of each context token at ``select_layer``: run the layers below it
        fresh over the whole context, project that layer's K/V, take ``‖ΔK‖ + ‖ΔV‖``."""
        r = self.run_
        x = r.wte[torch.tensor(self.context)] + r.wpe[self.ctx_pos]
        for layer in r.layers[:self.select_layer]:
            q, k, v = self._qkv(layer, x)
            x = self._finish(layer, x, q, k, v, self.ctx_pos, self.ctx_pos)
        _, k, v = self._qkv(r.layers[self.select_layer], x)
        ls = self.select_layer
        return (k - self.reused_k[ls]).flatten(1).norm(dim=1) + (v - self.reused_v[ls]).flatten(1).norm(dim=1)

    def select(self, r: float, method: str = "deviation", seed: int = 0) -> list[int]:
        """Context positions to recompute: ``round(r·T)`` of them, by largest deviation or at random.

        Raises:
            TypeError / ValueError: ``r`` outside [0, 1], an unknown method.
        """
        r = check_real("r", r, 0.0, 1.0)
        method = check_choice("method", method, ("deviation", "random", "none"))
        n = 0 if method == "none" else round(r * self.T)
        if n == 0:
            return []
        if method == "random":
            g = torch.Generator().manual_seed(seed)
            return sorted(torch.randperm(self.T, generator=g)[:n].tolist())
        return sorted(torch.topk(self.deviation(), n).indices.tolist())

    @torch.inference_mode()
    def blend(self, selected: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The joined context cache ``(L, T, H, D)`` with ``selected`` tokens recomputed.

        Args:
            selected: context positions in ``[0, T)``, each at most once (as :meth:`select` returns).

        Raises:
            TypeError: ``selected`` not a list, tuple or 1-D array of integers.
            ValueError: a position outside ``[0, T)`` (negative ones included: no wrap-around) or a
                position given twice.
        """
        if isinstance(selected, torch.Tensor) or hasattr(selected, "tolist"):
            selected = selected.tolist()
        if not isinstance(selected, (list, tuple)) or any(not is_int(i) for i in selected):
            raise TypeError(f"selected must be a list of context positions (integers), got {selected!r}")
        selected = [int(i) for i in selected]
        outside = [i for i in selected if not 0 <= i < self.T]
        if outside:
            raise ValueError(f"selected must hold context positions in [0, {self.T}), got {outside[:5]}")
        if len(set(selected)) != len(selected):
            twice = sorted({i for i in selected if selected.count(i) > 1})
            raise ValueError(f"selected must name each context position once, got {twice[:5]} more than once")
        r = self.run_
        keys, values = self.reused_k.clone(), self.reused_v.clone()
        if not selected:
            return keys, values
        s = torch.tensor(selected)
        pos = self.ctx_pos[s]
        x = r.wte[torch.tensor(self.context)[s]] + r.wpe[pos]
        for i, layer in enumerate(r.layers):
            q, k, v = self._qkv(layer, x)
            keys[i, s], values[i, s] = k, v
            x = self._finish(layer, x, q, keys[i], values[i], pos, self.ctx_pos)
        return keys, values

    def _kl_top1(self, logits: torch.Tensor) -> tuple[float, float]:
        logprobs = F.log_softmax(logits, -1)[len(self.question) - 1:]
        kl = (self.full_logprobs.exp() * (self.full_logprobs - logprobs)).sum(-1).clamp_min(0).mean().item()
        return kl, (logprobs.argmax(-1) == self.full_logprobs.argmax(-1)).float().mean().item()

    def context_only(self, keep: list[int]) -> tuple[float, float]:
        """``(KL, top-1)`` of the answer against the full prefill when the question sees only the
        chunks ``keep`` (indices; each fully prefilled alone at its final offset, as reuse does) —
        ``[]``: no context at all. The yardstick for how much the answer reads from the chunks
        themselves, against what reuse as-is (r = 0) loses: their attention to each other.

        Raises:
            TypeError: ``keep`` not a list, tuple or 1-D array of integers.
            ValueError: a chunk index out of range.
        """
        if isinstance(keep, torch.Tensor) or hasattr(keep, "tolist"):
            keep = keep.tolist()
        if not isinstance(keep, (list, tuple)) or any(not is_int(i) for i in keep):
            raise TypeError(f"keep must be a list of chunk indices (integers), got {keep!r}")
        if any(not 0 <= i < len(self.chunks) for i in keep):
            raise ValueError(f"keep must hold chunk indices in [0, {len(self.chunks)}), got {keep!r}")
        starts = [0, *itertools.accumulate(len(c) for c in self.chunks)]
        kept = sorted(set(keep))
        parts = [self.prefill(self.chunks[i], torch.arange(starts[i], starts[i + 1])) for i in kept]
        L, _, H, D = self.full_k.shape
        keys = torch.cat([p[0] for p in parts], 1) if parts else self.full_k.new_zeros(L, 0, H, D)
        values = torch.cat([p[1] for p in parts], 1) if parts else self.full_v.new_zeros(L, 0, H, D)
        pos = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in kept]) if kept else self.ctx_pos[:0]
        return self._kl_top1(self.extend(self.question + self.answer, keys, values, pos))

    def run(self, r: float, method: str = "deviation", seed: int = 0) -> BlendResult:
        """Blend with a fraction ``r`` recomputed and score the answer against the full prefill.

        Raises:
            TypeError / ValueError: as :meth:`select`.
        """
        t0 = time.perf_counter()
        selected = self.select(r, method, seed)
        keys, values = self.blend(selected)
        logits = self.extend(self.question + self.answer, keys, values)
        seconds = time.perf_counter() - t0
        kl, top1 = self._kl_top1(logits)
        L = self.run_.num_layers
        selection = self.T * self.select_layer if method == "deviation" and selected else 0
        return BlendResult(float(r), method, kl, top1, (selection + len(selected) * L) / (self.T * L), seconds, selected)
