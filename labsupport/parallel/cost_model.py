"""From a laptop to a GPU cluster: the measured communication volumes priced on H100 nodes.

Volumes per token (``E`` = d_model, ``b`` = bytes per element, ``L`` layers):

* tensor parallelism (Megatron-LM, Shoeybi et al. 2019): two all-reduces of ``E`` numbers
  per layer; a ring all-reduce makes each rank send ``2(p − 1)/p`` of the message
  (Patarasuk & Yuan 2009) → ``2 · L · E · b · 2(p − 1)/p``;
* pipeline parallelism (GPipe, Huang et al. 2019): one activation of ``E`` numbers per stage
  boundary, plus the bubble ``(p − 1)/(m + p − 1)``;
* expert parallelism (GShard, Lepikhin et al. 2020): each of the ``k`` token copies leaves its
  rank with probability ``(p − 1)/p`` and comes back → ``2 · k · (p − 1)/p · E · b``.

A decode step at batch ``B`` is priced as a sum of times (no overlap assumed):
weights read from HBM ``W / (tp · HBM)`` (each of the ``pp`` stages reads its share in turn),
the KV cache read likewise, ``2L`` all-reduces ``2(tp − 1) · α + 2(tp − 1)/tp · B·E·b / β``
on the TP link, and ``pp − 1`` hops ``α + B·E·b / β`` on the pipeline link. The H100 figures:
HBM3 3.35 TB/s, 80 GB; NVLink 4: NVIDIA quotes 900 GB/s per GPU, but that counts both directions
together — one rank *sends* at most 450 GB/s, the figure used here; 8 GPUs per node; InfiniBand NDR
≈ 50 GB/s per GPU and direction between nodes. The per-message latencies ``α`` are assumed orders
of magnitude (a few µs), not measurements. The all-reduce is priced as a ring (``2(p − 1)``
messages); for the few kilobytes of a decode step a one-shot all-reduce (every rank sends its
vector to every other at once: one message latency, ``(p − 1)×`` the bytes) is faster, and NCCL
picks its algorithm by message size — so the ring's ``2(p − 1)·α`` is an upper bound there.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import kv
from ..validation import check_int, check_real
from .comm import ring_factor


@dataclass(frozen=True)
class Link:
    """An interconnect: ``bandwidth`` bytes/s per GPU, ``latency_s`` seconds per message (α)."""

    name: str
    bandwidth: float
    latency_s: float


@dataclass(frozen=True)
class GPU:
    """One accelerator: HBM bandwidth (bytes/s), memory (bytes), GPUs per node."""

    name: str
    hbm_bandwidth: float
    memory: float
    gpus_per_node: int = 8


H100 = GPU("H100 SXM", hbm_bandwidth=3.35e12, memory=80e9, gpus_per_node=8)
NVLINK = Link("NVLink 4 (450 GB/s each way)", 450e9, 3e-6)
PCIE5 = Link("PCIe 5 x16 (64 GB/s)", 64e9, 5e-6)
INFINIBAND = Link("InfiniBand NDR (50 GB/s)", 50e9, 10e-6)
LINKS = {link.name: link for link in (NVLINK, PCIE5, INFINIBAND)}

#: Model shapes for the cluster panel (kv presets plus Llama 3.1 405B's published configuration).
MODELS: dict[str, kv.ModelShape] = dict(kv.PRESETS, **{
    "Llama 3.1 405B": kv.ModelShape("Llama 3.1 405B", n_layers=126, n_heads=128, n_kv_heads=8, head_dim=128,
                                    n_params=405_000_000_000, non_layer_params=2 * 128_256 * 16_384 + 16_384)})


def d_model(shape: kv.ModelShape) -> int:
    """Width of the residual stream: ``n_heads · head_dim``."""
    return shape.n_heads * shape.head_dim


def tp_bytes_per_token(n_layers: int, d_model: int, tp: int, bytes_per_element: int = 4) -> float:
    """Bytes one rank sends per token under tensor parallelism: ``2 · L · E · b · 2(p − 1)/p``.

    Raises:
        TypeError / ValueError: arguments not integers >= 1.
    """
    check_int("n_layers", n_layers, 1)
    check_int("d_model", d_model, 1)
    check_int("bytes_per_element", bytes_per_element, 1)
    return 2 * n_layers * d_model * bytes_per_element * ring_factor(tp)


def pp_bytes_per_token(d_model: int, bytes_per_element: int = 4) -> int:
    """Bytes a pipeline stage sends to the next per token: one activation, ``E · b``."""
    return check_int("d_model", d_model, 1) * check_int("bytes_per_element", bytes_per_element, 1)


def ep_bytes_per_token(d_model: int, top_k: int, ep: int, bytes_per_element: int = 4) -> float:
    """Expected bytes a rank sends per token it owns, uniform routing: ``2 · k · (p − 1)/p · E · b``."""
    check_int("top_k", top_k, 1)
    p = check_int("ep", ep, 1)
    return 2 * top_k * (p - 1) / p * pp_bytes_per_token(d_model, bytes_per_element)


def allreduce_time(message_bytes: float, p: int, link: Link) -> float:
    """Seconds of one ring all-reduce of ``message_bytes`` over ``p`` ranks: ``2(p−1)·α + 2(p−1)/p · n / β``."""
    check_real("message_bytes", message_bytes, 0)
    check_int("p", p, 1)
    if p == 1:
        return 0.0
    return 2 * (p - 1) * link.latency_s + ring_factor(p) * message_bytes / link.bandwidth


@dataclass(frozen=True)
class StepEstimate:
    """Priced decode step (seconds) and memory per GPU (bytes) of one TP × PP layout."""

    tp: int
    pp: int
    weights_s: float
    kv_s: float
    tp_comm_s: float
    pp_comm_s: float
    memory_per_gpu: float
    capacity: float
    tp_link: str
    pp_link: str

    @property
    def total_s(self) -> float:
        return self.weights_s + self.kv_s + self.tp_comm_s + self.pp_comm_s

    @property
    def fits(self) -> bool:
        return self.memory_per_gpu <= self.capacity

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


def decode_step(shape: kv.ModelShape, tp: int = 1, pp: int = 1, batch: int = 1, context: int = 4096,
                link: Link = NVLINK, gpu: GPU = H100, inter_node: Link = INFINIBAND,
                weight_dtype: str = "bf16", kv_dtype: str = "fp16", intra_node: Link = NVLINK) -> StepEstimate:
    """Price one decode step of ``batch`` requests with ``context`` tokens each on ``tp × pp`` GPUs.

    The TP all-reduces use ``link`` (``inter_node`` when the TP group is larger than a node);
    pipeline hops use ``intra_node`` (NVLink) while ``tp · pp`` fits one node, else ``inter_node``. KV heads split
    over TP up to ``n_kv_heads`` ranks (beyond that they are replicated).

    Raises:
        TypeError / ValueError: degrees, batch or context not integers >= 1; unknown dtype.
    """
    check_int("tp", tp, 1)
    check_int("pp", pp, 1, shape.n_layers)
    check_int("batch", batch, 1)
    check_int("context", context, 1)
    bytes_el = kv.dtype_bits(weight_dtype) // 8 or 1
    weights = kv.weight_bytes(shape, weight_dtype)
    kv_total = kv.kv_bytes(shape, context, batch, kv_dtype)
    kv_split = min(tp, shape.n_kv_heads)
    tp_link = link if tp <= gpu.gpus_per_node else inter_node
    pp_link = intra_node if tp * pp <= gpu.gpus_per_node else inter_node
    message = batch * d_model(shape) * bytes_el
    return StepEstimate(
        tp=tp, pp=pp,
        weights_s=weights / tp / gpu.hbm_bandwidth,
        kv_s=kv_total / kv_split / gpu.hbm_bandwidth,
        tp_comm_s=2 * shape.n_layers * allreduce_time(message, tp, tp_link),
        pp_comm_s=(pp - 1) * (pp_link.latency_s + message / pp_link.bandwidth) if pp > 1 else 0.0,
        memory_per_gpu=weights / (tp * pp) + kv_total / (kv_split * pp), capacity=gpu.memory,
        tp_link=tp_link.name, pp_link=pp_link.name if pp > 1 else "—")


def tp_layer_tradeoff(shape: kv.ModelShape, tp: int, batch: int = 1, link: Link = NVLINK, gpu: GPU = H100,
                      weight_dtype: str = "bf16") -> tuple[float, float]:
    """Per layer: (weight-read seconds TP saves, seconds its two all-reduces cost). TP pays when the first is larger."""
    per_layer = kv.layer_weight_bytes(shape, weight_dtype)          # a decoder layer: no embeddings, no LM head
    saved = per_layer / gpu.hbm_bandwidth * (1 - 1 / check_int("tp", tp, 1))
    message = check_int("batch", batch, 1) * d_model(shape) * (kv.dtype_bits(weight_dtype) // 8)
    return saved, 2 * allreduce_time(message, tp, link)


def fit_link(message_bytes: list[float], seconds: list[float], p: int = 2, name: str = "measured") -> Link:
    """A :class:`Link` from timed all-reduces: least squares of ``t = 2(p−1)·α + 2(p−1)/p · n / β``.

    On a busy machine the timings may not grow with the size (a negative slope); then the
    link is estimated coarsely instead: ``β`` from the largest message alone and ``α`` from the
    fastest run.

    Raises:
        ValueError: fewer than two sizes, sizes and times of different lengths, or times not > 0.
    """
    if len(message_bytes) != len(seconds) or len(seconds) < 2:
        raise ValueError(f"need at least two (size, time) pairs, got {len(message_bytes)} and {len(seconds)}")
    if min(seconds) <= 0 or min(message_bytes) < 0:
        raise ValueError(f"seconds must be > 0 and sizes >= 0, got {seconds!r}, {message_bytes!r}")
    n = len(seconds)
    x = [ring_factor(p) * b for b in message_bytes]
    mx, my = sum(x) / n, sum(seconds) / n
    spread = sum((a - mx) ** 2 for a in x)
    if spread == 0:
        raise ValueError(f"message_bytes must hold at least two different sizes, got {message_bytes!r}")
    slope = sum((a - mx) * (b - my) for a, b in zip(x, seconds)) / spread
    if slope <= 0:                                        # noisy timings: coarse estimate
        big = max(range(n), key=x.__getitem__)
        return Link(name, x[big] / seconds[big], min(seconds) / (2 * (p - 1)))
    intercept = max(0.0, my - slope * mx)
    return Link(name, 1.0 / slope, intercept / (2 * (p - 1)))


def calibration_gpu(weight_bytes: float, compute_s: float, name: str = "this CPU (measured)") -> GPU:
    """A :class:`GPU` whose 'HBM' bandwidth reproduces a measured decode compute time: ``W / t``."""
    check_real("weight_bytes", weight_bytes, 0, low_open=True)
    check_real("compute_s", compute_s, 0, low_open=True)
    return GPU(name, hbm_bandwidth=weight_bytes / compute_s, memory=16e9, gpus_per_node=2)
