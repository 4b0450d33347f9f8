"""Expert parallelism of a mixture-of-experts MLP (GShard, Lepikhin et al. 2020).

A mixture-of-experts (MoE) layer replaces one MLP by ``n`` expert MLPs and a *router*: a
linear map ``E → n`` whose softmax picks, for every token, its **top-k** experts; the
token's output is the gate-weighted sum of those experts' outputs (gates renormalised over
the k chosen, as in Mixtral). Only ``k`` of ``n`` experts run per token.

With **expert parallelism** the experts live on different ranks (here experts
``[r·n/p, (r+1)·n/p)`` on rank ``r``) and each rank starts with its own share of the tokens. A
layer is then: route locally → **all-to-all #1** (dispatch: each token copy travels to the
rank of its expert) → experts run → **all-to-all #2** (combine: results travel back) →
gate-weighted sum. A token whose k experts sit on one remote rank is sent k times (no
de-duplication, as in GShard's dispatch tensor). With uniform routing a fraction
``(p − 1)/p`` of the ``k`` copies leaves the rank, so a rank sends
``2 · k · (p − 1)/p · E · bytes`` per token it owns.

The MoE weights here are **randomly initialised** (a seeded generator): the tiny GPT-2 has no
experts. The point is the routing and the traffic, measured on real hidden states.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..validation import check_int
from .comm import Comm, all_to_all_available


@dataclass
class MoEWeights:
    """Router ``(E, n)`` and ``n`` experts, each ``w1 (E, F), b1 (F,), w2 (F, E), b2 (E,)``."""

    router: torch.Tensor
    experts: list[dict[str, torch.Tensor]]
    top_k: int

    def to(self, device: torch.device) -> MoEWeights:
        """The same weights on ``device``."""
        return MoEWeights(self.router.to(device), [{k: v.to(device) for k, v in e.items()} for e in self.experts],
                          self.top_k)

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    @property
    def d_model(self) -> int:
        return self.router.shape[0]


def init_moe(d_model: int, num_experts: int = 4, top_k: int = 2, d_ff: int | None = None, seed: int = 0) -> MoEWeights:
    """Random MoE weights (normal, std 0.02 like GPT-2's initialiser) from ``torch.Generator(seed)``.

    Raises:
        TypeError / ValueError: sizes not integers >= 1, ``top_k > num_experts``.
    """
    check_int("d_model", d_model, 1)
    check_int("num_experts", num_experts, 1)
    check_int("top_k", top_k, 1, num_experts)
    d_ff = check_int("d_ff", 4 * d_model if d_ff is None else d_ff, 1)
    g = torch.Generator().manual_seed(check_int("seed", seed))

    def normal(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    router = torch.randn(d_model, num_experts, generator=g) / d_model ** 0.5
    experts = [{"w1": normal(d_model, d_ff), "b1": torch.zeros(d_ff), "w2": normal(d_ff, d_model),
                "b2": torch.zeros(d_model)} for _ in range(num_experts)]
    return MoEWeights(router, experts, top_k)


def route(x: torch.Tensor, moe: MoEWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of tokens ``x`` ``(N, E)`` → ``(experts (N, k) int64, gates (N, k))``, gates summing to 1."""
    probs = torch.softmax(x @ moe.router, dim=-1)                     # (N, n)
    gates, experts = probs.topk(moe.top_k, dim=-1)
    return experts, gates / gates.sum(-1, keepdim=True)


def expert_mlp(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """One expert on its tokens ``(n_e, E)`` → ``(n_e, E)``."""
    return F.gelu(x @ w["w1"] + w["b1"], approximate="tanh") @ w["w2"] + w["b2"]


def moe_forward(x: torch.Tensor, moe: MoEWeights) -> torch.Tensor:
    """The single-process MoE layer: ``(N, E)`` → ``(N, E)`` (the reference for expert parallelism)."""
    experts, gates = route(x, moe)
    y = torch.zeros_like(x)
    for e, w in enumerate(moe.experts):
        token, slot = (experts == e).nonzero(as_tuple=True)
        if len(token):
            y.index_add_(0, token, gates[token, slot, None] * expert_mlp(x[token], w))
    return y


def expert_owner(expert: torch.Tensor, num_experts: int, world_size: int) -> torch.Tensor:
    """Rank holding each expert id (contiguous blocks of ``num_experts / world_size`` experts)."""
    return expert // (num_experts // world_size)


def dispatch_table(experts: torch.Tensor, num_experts: int, world_size: int) -> list[list[int]]:
    """The first all-to-all's send counts: ``table[src][dst]`` token copies rank ``src`` sends to
    rank ``dst`` (the diagonal stays home), for the top-k ``experts (N, k)`` of all N tokens, rank
    ``r`` owning the ``r``-th of ``world_size`` near-equal slices of the tokens (as
    :func:`ep_forward`) and the experts in contiguous blocks (:func:`expert_owner`).

    Raises:
        TypeError: ``experts`` not an integer tensor.
        ValueError: ``experts`` not 2-D, an expert id outside ``[0, num_experts)``, or a world size
            that does not divide ``num_experts``.
    """
    n, p = check_int("num_experts", num_experts, 1), check_int("world_size", world_size, 1)
    if n % p:
        raise ValueError(f"world_size must divide num_experts={n}, got {p}")
    if not isinstance(experts, torch.Tensor) or experts.is_floating_point() or experts.is_complex() \
            or experts.dtype == torch.bool:
        raise TypeError(f"experts must be an integer tensor of expert ids, got {type(experts).__name__}"
                        + (f" of {experts.dtype}" if isinstance(experts, torch.Tensor) else ""))
    if experts.dim() != 2:
        raise ValueError(f"experts must be (N, k) expert ids, got shape {tuple(experts.shape)}")
    outside = experts[(experts < 0) | (experts >= n)]
    if outside.numel():
        raise ValueError(f"experts must hold ids in [0, {n}), got {int(outside[0])}")
    return [torch.bincount(expert_owner(mine.reshape(-1), n, p), minlength=p).tolist()
            for mine in experts.tensor_split(p)]


def ep_forward(rank: int, world_size: int, moe: MoEWeights, tokens: torch.Tensor,
               use_collective: bool | None = None) -> dict:
    """The MoE layer with experts spread over ranks (worker task ``labsupport.parallel.expert:ep_forward``).

    Args:
        moe: the full MoE (rank ``r`` uses only its experts).
        tokens: all tokens ``(N, E)``; rank ``r`` owns the ``r``-th of ``world_size`` near-equal slices.
        use_collective: ``True`` = ``all_to_all``, ``False`` = ``isend``/``recv`` pairs,
            ``None`` = ``all_to_all`` if the backend has it.

    Returns:
        ``output`` (this rank's tokens' outputs), ``bytes_sent`` (token payload to other ranks, both
        all-to-alls), ``remote_copies`` (token copies this rank sent away), ``expert_load``
        (copies this rank routed to each expert), ``received`` (copies its experts processed), ``received_remote`` (of those, from other ranks),
        ``collective`` (whether ``all_to_all`` was used), ``seconds``, ``comm_s``.

    Raises:
        ValueError: ``world_size`` does not divide the number of experts.
    """
    n = moe.num_experts
    if n % world_size:
        raise ValueError(f"world_size must divide num_experts={n}, got {world_size}")
    if use_collective is None:
        use_collective = world_size == 1 or all_to_all_available()
    comm = Comm(rank, world_size)
    moe = moe.to(comm.device)
    t0 = time.perf_counter()
    x = tokens.tensor_split(world_size)[rank].to(comm.device)          # (N_r, E): my tokens
    experts, gates = route(x, moe)                                     # (N_r, k) each
    flat_expert = experts.reshape(-1)                                  # one row per token copy
    flat_token = torch.arange(len(x), device=x.device).repeat_interleave(moe.top_k)
    dest = expert_owner(flat_expert, n, world_size)
    order = torch.argsort(dest * n + flat_expert, stable=True)         # group copies by rank, then expert
    flat_expert, flat_token, dest = flat_expert[order], flat_token[order], dest[order]
    counts = torch.bincount(dest, minlength=world_size).tolist()
    send_rows = list(x[flat_token].split(counts))                      # dispatch payload, per destination
    send_ids = list(flat_expert.split(counts))
    rows_in = comm.all_to_all(send_rows, use_collective)               # all-to-all #1: tokens to experts
    payload = comm.bytes_sent
    ids_in = Comm(rank, world_size).all_to_all([i.unsqueeze(1) for i in send_ids], use_collective)  # routing metadata
    results_in = []
    for rows, ids in zip(rows_in, ids_in):
        out = torch.empty_like(rows)
        for e in ids.unique().tolist():
            sel = (ids[:, 0] == e).nonzero(as_tuple=True)[0]
            out[sel] = expert_mlp(rows[sel], moe.experts[e])
        results_in.append(out)
    results_back = comm.all_to_all(results_in, use_collective)         # all-to-all #2: results home
    y = torch.zeros_like(x)
    back = torch.cat(results_back)                                     # rows in the order they were sent
    gate = gates.reshape(-1)[order]
    y.index_add_(0, flat_token, gate[:, None] * back)
    return {"rank": rank, "output": y.cpu(), "bytes_sent": comm.bytes_sent, "dispatch_bytes": payload,
            "remote_copies": sum(c for d, c in enumerate(counts) if d != rank),
            "local_copies": counts[rank], "send_counts": counts, "tokens": len(x),
            "expert_load": torch.bincount(experts.reshape(-1), minlength=n).tolist(),
            "received": sum(len(r) for r in rows_in),
            "received_remote": sum(len(r) for s, r in enumerate(rows_in) if s != rank), "collective": bool(use_collective),
            "seconds": time.perf_counter() - t0, "comm_s": comm.seconds}


def load_imbalance(load: list[int]) -> float:
    """``max / mean`` of the token copies per expert (1 = perfectly balanced).

    Raises:
        ValueError: empty, or no tokens at all.
    """
    if not load or sum(load) == 0:
        raise ValueError(f"load must hold at least one routed token copy, got {load!r}")
    return max(load) / (sum(load) / len(load))


def ep_bytes_exact(sent_away: int, received_remote: int, d_model: int, bytes_per_element: int = 4) -> int:
    """Payload one rank sends in the two all-to-alls: ``(sent_away + received_remote) · E · bytes``.

    Dispatch sends the ``sent_away`` copies of its own tokens routed to remote experts; combine
    sends back the results of the ``received_remote`` copies its experts got from other ranks.
    """
    check_int("sent_away", sent_away, 0)
    check_int("received_remote", received_remote, 0)
    return (sent_away + received_remote) * check_int("d_model", d_model, 1) * check_int("bytes_per_element",
                                                                                        bytes_per_element, 1)


def hidden_states_for_moe(model, ids: list[int], layer: int = 2) -> torch.Tensor:
    """Real hidden states for the router: the residual stream entering block ``layer`` for ``ids``,
    normalised by that block's ``ln_2`` (the scale an MLP sees) → ``(len(ids), E)``."""
    model = getattr(model, "model", model)
    check_int("layer", layer, 0, model.config.n_layer - 1)
    with torch.inference_mode():
        out = model(torch.tensor([ids]), use_cache=False, output_hidden_states=True)
        return model.transformer.h[layer].ln_2(out.hidden_states[layer][0]).detach().clone()
