"""Tensor parallelism of GPT-2 (Megatron-LM, Shoeybi et al. 2019): every layer cut in width.

With ``p`` ranks each transformer block is split so that each rank holds ``1/p`` of its
matrices and only two all-reduces per block are needed:

* attention: the QKV projection ``c_attn`` (E → 3E) is **column-parallel** — rank ``r`` keeps
  the columns of its own ``H/p`` heads, so it computes their q, k, v and attention with no
  communication, and its **KV cache holds only its heads**; the output projection ``c_proj``
  (E → E) is **row-parallel** — rank ``r`` keeps the rows that read its heads and produces a
  *partial sum* of the output; **all-reduce #1** adds the partial sums;
* MLP: ``c_fc`` (E → 4E) column-parallel (GELU works element-wise on each rank's columns),
  ``c_proj`` (4E → E) row-parallel, **all-reduce #2**.

Biases of the row-parallel matrices are added once, after the all-reduce. Embeddings, layer
norms and the LM head are replicated (Megatron also splits the vocabulary; kept whole here).
Each all-reduce carries ``tokens × E`` numbers, so per token a rank sends
``2 · L · E · bytes · 2(p − 1)/p`` (:func:`labsupport.parallel.cost_model.tp_bytes_per_token`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..validation import check_int
from .comm import Comm


@dataclass
class GPT2Weights:
    """The weights of a GPT-2 as plain tensors (picklable; what a worker receives).

    ``layers[i]`` maps ``ln_1_w, ln_1_b, attn_w (E, 3E), attn_b (3E,), proj_w (E, E), proj_b,
    ln_2_w, ln_2_b, fc_w (E, 4E), fc_b (4E,), out_w (4E, E), out_b`` (GPT-2's Conv1D layout:
    ``y = x @ W + b``). ``wte`` is ``(V, E)`` and doubles as the LM head (tied).
    """

    n_layer: int
    n_head: int
    d_model: int
    eps: float
    wte: torch.Tensor
    wpe: torch.Tensor
    ln_f_w: torch.Tensor
    ln_f_b: torch.Tensor
    layers: list[dict[str, torch.Tensor]]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def to(self, device: torch.device) -> GPT2Weights:
        """The same weights on ``device`` (itself when they are already there)."""
        if self.wte.device == torch.device(device):
            return self
        move = lambda t: t.to(device)
        return GPT2Weights(self.n_layer, self.n_head, self.d_model, self.eps, move(self.wte), move(self.wpe),
                           move(self.ln_f_w), move(self.ln_f_b),
                           [{k: move(v) for k, v in layer.items()} for layer in self.layers])


_NAMES = {"ln_1_w": "ln_1.weight", "ln_1_b": "ln_1.bias", "attn_w": "attn.c_attn.weight",
          "attn_b": "attn.c_attn.bias", "proj_w": "attn.c_proj.weight", "proj_b": "attn.c_proj.bias",
          "ln_2_w": "ln_2.weight", "ln_2_b": "ln_2.bias", "fc_w": "mlp.c_fc.weight", "fc_b": "mlp.c_fc.bias",
          "out_w": "mlp.c_proj.weight", "out_b": "mlp.c_proj.bias"}


def weights_from_model(model) -> GPT2Weights:
    """Copy a ``GPT2LMHeadModel``'s (or a ``LoadedModel``'s) weights to CPU tensors.

    Raises:
        ValueError: not a GPT-2 with tanh-GELU, untied head or inverse-layer-index scaling
            (features this forward does not implement).
    """
    model = getattr(model, "model", model)
    cfg = model.config
    if (getattr(cfg, "model_type", None) != "gpt2" or cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh")
            or getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or not cfg.scale_attn_weights):
        raise ValueError(f"model must be a plain GPT-2 (tanh GELU, 1/sqrt(d_head) scaling), got {cfg.model_type!r}")
    state = {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.transformer.state_dict().items()}
    layers = [{short: state[f"h.{i}.{long}"] for short, long in _NAMES.items()} for i in range(cfg.n_layer)]
    return GPT2Weights(cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.layer_norm_epsilon, state["wte.weight"],
                       state["wpe.weight"], state["ln_f.weight"], state["ln_f.bias"], layers)


def head_range(n_head: int, rank: int, world_size: int) -> tuple[int, int]:
    """Heads ``[first, last)`` of ``rank`` when ``n_head`` heads are split over ``world_size`` ranks.

    Raises:
        ValueError: ``world_size`` does not divide ``n_head``.
    """
    if n_head % world_size:
        raise ValueError(f"world_size must divide n_head={n_head}, got {world_size}")
    per = n_head // world_size
    return rank * per, (rank + 1) * per


def shard_layer(layer: dict[str, torch.Tensor], n_head: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s slice of one block: columns of QKV and ``c_fc``, rows of both ``c_proj``.

    Returns the same keys as the block, sliced (``attn_w`` ``(E, 3E/p)``, ``proj_w``
    ``(E/p, E)``, ``fc_w`` ``(E, 4E/p)``, ``out_w`` ``(4E/p, E)``); layer norms and the
    row-parallel biases stay whole (the biases are added once, after the all-reduce).
    """
    e = layer["proj_w"].shape[0]
    d = e // n_head
    h0, h1 = head_range(n_head, rank, world_size)
    cols = torch.cat([torch.arange(part * e + h0 * d, part * e + h1 * d) for part in range(3)])   # q, k, v
    cols = cols.to(layer["attn_w"].device)
    f = layer["fc_w"].shape[1] // world_size
    shard = dict(layer)
    shard["attn_w"], shard["attn_b"] = layer["attn_w"][:, cols].contiguous(), layer["attn_b"][cols].contiguous()
    shard["proj_w"] = layer["proj_w"][h0 * d:h1 * d].contiguous()                    # rows of my heads
    shard["fc_w"] = layer["fc_w"][:, rank * f:(rank + 1) * f].contiguous()
    shard["fc_b"] = layer["fc_b"][rank * f:(rank + 1) * f].contiguous()
    shard["out_w"] = layer["out_w"][rank * f:(rank + 1) * f].contiguous()            # rows of my columns
    return shard


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    """Causal attention of ``T`` new queries over ``past + T`` keys: ``(B, h, T, D)`` → ``(B, h, T, D)``."""
    t = q.shape[2]
    if past == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if t == 1:
        return F.scaled_dot_product_attention(q, k, v)
    pos = torch.arange(past + t, device=q.device)
    allowed = pos[None, :] <= (past + pos[:t])[:, None]                                     # (T, past + T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def tp_block(x: torch.Tensor, w: dict[str, torch.Tensor], cache: list, comm: Comm, n_local_heads: int,
             eps: float) -> torch.Tensor:
    """One tensor-parallel GPT-2 block on ``x`` ``(B, T, E)``; appends this rank's K, V to ``cache``.

    ``cache`` is ``[]`` or ``[k, v]`` with ``k, v`` of shape ``(B, H/p, past, D)`` (my heads only).
    """
    b, t, e = x.shape
    h = F.layer_norm(x, (e,), w["ln_1_w"], w["ln_1_b"], eps)
    qkv = h @ w["attn_w"] + w["attn_b"]                                  # column-parallel: (B, T, 3E/p)
    q, k, v = qkv.view(b, t, 3, n_local_heads, -1).permute(2, 0, 3, 1, 4)  # each (B, H/p, T, D)
    past = 0
    if cache:
        past = cache[0].shape[2]
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    cache[:] = [k, v]
    a = attention(q, k, v, past).transpose(1, 2).reshape(b, t, -1)     # (B, T, E/p): my heads
    x = x + (comm.all_reduce(a @ w["proj_w"]) + w["proj_b"])           # row-parallel + all-reduce #1
    h = F.layer_norm(x, (e,), w["ln_2_w"], w["ln_2_b"], eps)
    u = F.gelu(h @ w["fc_w"] + w["fc_b"], approximate="tanh")          # column-parallel: (B, T, 4E/p)
    return x + (comm.all_reduce(u @ w["out_w"]) + w["out_b"])          # row-parallel + all-reduce #2


class TPModel:
    """Rank ``rank``'s share of a tensor-parallel GPT-2 (world size 1 = the whole model, no communication).

    Args:
        weights: the full model (each rank keeps only its slices).
        comm: this rank's :class:`~labsupport.parallel.comm.Comm`.

    Raises:
        ValueError: the world size does not divide the number of heads.
    """

    def __init__(self, weights: GPT2Weights, comm: Comm):
        self.comm, self.w = comm, weights.to(comm.device)
        head_range(weights.n_head, comm.rank, comm.world_size)               # validates the split
        self.n_local_heads = weights.n_head // comm.world_size
        self.layers = [shard_layer(layer, weights.n_head, comm.rank, comm.world_size) for layer in self.w.layers]
        self.caches: list[list] = [[] for _ in self.layers]

    def shard_bytes(self) -> int:
        """Bytes of this rank's block weights (embeddings and LM head excluded: replicated)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values())

    def kv_shapes(self) -> list[tuple[int, ...]]:
        """Shape of layer 0's K cache on this rank: ``(B, H/p, positions, D)``."""
        return [tuple(c[0].shape) for c in self.caches if c]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """New tokens ``ids`` ``(B, T)`` → logits ``(B, T, V)``, extending every layer's KV cache."""
        past = self.caches[0][0].shape[2] if self.caches[0] else 0
        positions = torch.arange(past, past + ids.shape[1], device=ids.device)
        x = self.w.wte[ids] + self.w.wpe[positions]
        for layer, cache in zip(self.layers, self.caches):
            x = tp_block(x, layer, cache, self.comm, self.n_local_heads, self.w.eps)
        x = F.layer_norm(x, (self.w.d_model,), self.w.ln_f_w, self.w.ln_f_b, self.w.eps)
        return x @ self.w.wte.T


def tp_generate(rank: int, world_size: int, weights: GPT2Weights, prompt_ids: list[int], max_new_tokens: int,
                allreduce: str = "ring") -> dict:
    """Greedy generation with tensor parallelism; also the worker task (``labsupport.parallel.tensor:tp_generate``).

    Returns:
        ``tokens`` (generated ids), ``logits`` ``(P + n − 1, V)`` (every position's logits: the
        prefill's then each decode step's), ``steps`` (per decode step: ``step_s``, ``comm_s``,
        ``bytes``, ``allreduces``), ``prefill`` (the same for the prefill), ``kv_shape``
        (layer 0's K cache on this rank), ``shard_bytes``, ``rank``, ``world_size``.

    Raises:
        ValueError: bad ``max_new_tokens``, an empty prompt, a world size not dividing the heads.
    """
    check_int("max_new_tokens", max_new_tokens, 1)
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token, got an empty list")
    comm = Comm(rank, world_size, allreduce)
    model = TPModel(weights, comm)
    device = comm.device
    ids = torch.tensor([prompt_ids], device=device)
    records, all_logits, tokens = [], [], []
    for _ in range(max_new_tokens):
        comm.reset()
        t0 = time.perf_counter()
        logits = model.forward(ids)[0].cpu()                             # (T, V); .cpu() waits for a GPU
        records.append({"tokens": ids.shape[1], "step_s": time.perf_counter() - t0, "comm_s": comm.seconds,
                        "bytes": comm.bytes_sent, "allreduces": comm.ops})
        all_logits.append(logits)
        tokens.append(int(logits[-1].argmax()))
        ids = torch.tensor([[tokens[-1]]], device=device)
    return {"rank": rank, "world_size": world_size, "tokens": tokens, "logits": torch.cat(all_logits),
            "prefill": records[0], "steps": records[1:], "kv_shape": model.kv_shapes()[0],
            "shard_bytes": model.shard_bytes(), "allreduce": allreduce}


def median(values) -> float:
    """Median of a non-empty sequence of numbers."""
    v = sorted(values)
    if not v:
        raise ValueError("median of an empty sequence")
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else 0.5 * (v[mid - 1] + v[mid])


def summarise_tp(result: dict) -> dict:
    """Median decode step of one rank's :func:`tp_generate` result: step, compute and comm seconds, bytes/token."""
    steps = result["steps"]
    step_s = median([s["step_s"] for s in steps])
    comm_s = median([s["comm_s"] for s in steps])
    return {"world_size": result["world_size"], "step_s": step_s, "comm_s": comm_s,
            "compute_s": median([s["step_s"] - s["comm_s"] for s in steps]),
            "bytes_per_token": median([s["bytes"] / s["tokens"] for s in steps]),
            "allreduces_per_step": steps[0]["allreduces"] if steps else 0,
            "prefill_bytes_per_token": result["prefill"]["bytes"] / result["prefill"]["tokens"]}


LOGITS_ATOL = 1e-4
"""How far a parallel run's float32 logits may sit from one process's (largest absolute difference).

The sums run in another order (a sharded matmul plus an all-reduce; a cached step against a full
forward; each CPU's BLAS blocks differently), so the last bits differ. The logits reach |x| ≈ 13,
where one float32 step is 9.5e-7: measured worst 1.2e-5 on an Intel Xeon (about 13 steps), under
1e-5 on an AMD EPYC. 1e-4 leaves room for other CPUs and is still far below the gap between two
tokens' logits — identical greedy tokens are checked on their own."""


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """The Hugging Face model's logits over ``ids`` in one forward pass: ``(len(ids), V)``."""
    model = getattr(model, "model", model)
    with torch.inference_mode():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()

