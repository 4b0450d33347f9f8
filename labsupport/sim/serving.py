"""Prefill/decode interference on one GPU vs chunked prefill vs disaggregated pools.

A discrete-time model of an LLM server with a roofline cost model (``labsupport.kv``):

* a decode step of a batch reads the weights once and every request's KV:
  ``t = (W + Σ context·kv_per_token) / BW`` (memory-bound decoding, Pope et al., 2022);
* a prefill is compute-bound: ``tokens · 2N / (peak · MFU)`` (the roofline, Williams et al., 2009);
* moving a prompt's KV between machines takes ``tokens · kv_per_token / link_bandwidth``.

Three ways to serve the same requests:

* ``colocated`` — continuous batching that runs a waiting prompt's whole prefill in its own
  step (every decoding request waits: a TBT spike);
* ``chunked`` — each step carries every decode token plus at most ``chunk`` prompt tokens
  (Sarathi, Agrawal et al., 2023);
* ``disaggregated`` — a prefill machine computes prompts first come first served and ships
  the KV to a decode machine that only decodes (DistServe, Zhong et al., 2024; Splitwise, Patel et al., 2024).

Colocated and chunked serving can use several replicas (requests dealt round-robin) so
that the comparison with disaggregation (one prefill + one decode machine) uses the same
number of machines. Times are seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.metrics import RequestMetrics
from ..kv import H100_SXM, PRESETS, kv_bytes_per_token, weight_bytes
from ..validation import check_int, check_real, is_int


@dataclass(frozen=True)
class CostModel:
    """Roofline costs of one machine (bytes, bytes/s, seconds)."""

    weight_bytes: float
    kv_bytes_per_token: float
    bandwidth: float
    prefill_s_per_token: float
    link_bandwidth: float

    def decode_step(self, contexts: Sequence[int]) -> float:
        """Seconds of one decode step for requests holding ``contexts`` tokens: ``(W + Σ ctx·kv) / BW``."""
        return (self.weight_bytes + sum(contexts) * self.kv_bytes_per_token) / self.bandwidth

    def prefill(self, tokens: int) -> float:
        """Seconds to compute ``tokens`` prompt tokens (compute-bound)."""
        return tokens * self.prefill_s_per_token

    def transfer(self, tokens: int) -> float:
        """Seconds to ship ``tokens`` tokens of KV to another machine."""
        return tokens * self.kv_bytes_per_token / self.link_bandwidth


def llama3_8b_h100_cost_model(mfu: float = 0.5, link_bandwidth: float = 50e9) -> CostModel:
    """Llama 3 8B (bf16, fp16 KV) on an H100 SXM — the course's running example.

    Args:
        mfu: fraction of peak FLOP/s a prefill reaches (40–60 % is typical for large prefills).
        link_bandwidth: KV transfer between machines, bytes/s (50 GB/s ≈ 400 Gb/s RDMA).

    Raises:
        TypeError: a parameter not a number.
        ValueError: ``mfu`` outside (0, 1] or ``link_bandwidth`` not > 0.
    """
    check_real("mfu", mfu, 0, 1, low_open=True)
    check_real("link_bandwidth", link_bandwidth, 0, low_open=True, hint=" bytes/s")
    shape = PRESETS["Llama 3 8B"]
    return CostModel(weight_bytes=weight_bytes(shape, "bf16"), kv_bytes_per_token=kv_bytes_per_token(shape, "fp16"),
                     bandwidth=H100_SXM.bandwidth,
                     prefill_s_per_token=2 * shape.n_params / (H100_SXM.peak_flops * mfu),
                     link_bandwidth=link_bandwidth)


@dataclass
class ServedRequest:
    """One request; ``metrics`` records its arrival and token times (the engine's
    :class:`~labsupport.engine.metrics.RequestMetrics`, so TTFT / TPOT / ITL / goodput are
    computed by the same code as for the real engine)."""

    request_id: int
    prompt_len: int
    output_len: int
    metrics: RequestMetrics

    @property
    def arrival(self) -> float:
        return self.metrics.arrival_time

    @property
    def token_times(self) -> list[float]:
        return self.metrics.token_times

    def emit(self, t: float) -> None:
        """Record a token sampled at time ``t`` (the first one also sets first_token_time)."""
        m = self.metrics
        if m.first_token_time is None:
            m.first_token_time = t
        m.token_times.append(t)
        if len(m.token_times) == self.output_len:
            m.finish_time = t


def poisson_requests(rate: float, num_requests: int, prompt_len: int | Sequence[int], output_len: int,
                     seed: int = 0) -> list[ServedRequest]:
    """``num_requests`` requests with exponential inter-arrival gaps of mean ``1/rate`` seconds.

    Args:
        rate: requests per second (> 0).
        num_requests: ≥ 1.
        prompt_len: one length for all, or a list to draw from uniformly.
        output_len: tokens each request generates (≥ 1).
        seed: for the ``numpy.random.Generator``.

    Raises:
        TypeError: a parameter of the wrong type.
        ValueError: a parameter out of range.
    """
    check_real("rate", rate, 0, low_open=True, hint=" requests/s")
    check_int("num_requests", num_requests, 1)
    check_int("output_len", output_len, 1)
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, size=num_requests))
    choices = [prompt_len] if is_int(prompt_len) else list(prompt_len)
    if not choices:
        raise ValueError("prompt_len must be an integer >= 1 or a non-empty list of them, got []")
    for c in choices:
        check_int("prompt_len", c, 1)
    lens = rng.choice(choices, size=num_requests)
    return [ServedRequest(i, int(lens[i]), output_len, RequestMetrics(float(t[i]))) for i in range(num_requests)]


def _fresh(requests: Sequence[ServedRequest]) -> list[ServedRequest]:
    return [ServedRequest(r.request_id, r.prompt_len, r.output_len, RequestMetrics(r.arrival)) for r in requests]


def _serve_one(reqs: list[ServedRequest], cost: CostModel, max_batch: int, chunk: int | None,
               ready: dict[int, float] | None = None) -> None:
    """One machine's continuous-batching loop. ``ready`` (disaggregated decode machine): the
    time each request's KV arrives; it then needs no prefill."""
    pending = deque(sorted(reqs, key=lambda r: ((ready or {}).get(r.request_id, r.arrival), r.request_id)))
    start = {r.request_id: (ready or {}).get(r.request_id, r.arrival) for r in reqs}
    waiting: deque[ServedRequest] = deque()
    done_prompt: dict[int, int] = {}
    running: list[ServedRequest] = []
    t = 0.0
    while pending or waiting or running:
        while pending and start[pending[0].request_id] <= t:
            waiting.append(pending.popleft())
        if ready is not None:                                   # KV already computed: decode only
            while waiting and len(running) < max_batch:
                running.append(waiting.popleft())
        if not running and (ready is not None or not waiting):
            t = max(t, start[pending[0].request_id])
            continue
        contexts = [r.prompt_len + len(r.token_times) for r in running]
        if chunk is None and waiting and len(running) < max_batch:
            batch = [waiting.popleft() for _ in range(min(len(waiting), max_batch - len(running)))]
            t += cost.prefill(sum(r.prompt_len for r in batch))  # decoders wait for the whole prefill
            for r in batch:
                r.emit(t)
            running += [r for r in batch if len(r.token_times) < r.output_len]
            continue
        budget = chunk if (chunk is not None and ready is None and len(running) < max_batch) else 0
        prefilled: list[ServedRequest] = []
        used = 0
        for r in list(waiting):
            if used >= budget or len(running) + len(prefilled) >= max_batch:
                break
            take = min(budget - used, r.prompt_len - done_prompt.get(r.request_id, 0))
            done_prompt[r.request_id] = done_prompt.get(r.request_id, 0) + take
            used += take
            if done_prompt[r.request_id] == r.prompt_len:
                waiting.popleft()
                prefilled.append(r)
            else:
                break
        t += cost.decode_step(contexts) + cost.prefill(used)
        for r in running + prefilled:
            r.emit(t)
        running = [r for r in running + prefilled if len(r.token_times) < r.output_len]


def simulate(requests: Sequence[ServedRequest], policy: str, cost: CostModel | None = None, max_batch: int = 64,
             chunk: int = 512, replicas: int = 2) -> list[ServedRequest]:
    """Serve ``requests`` under ``policy`` and return them with their token times filled in.

    Args:
        requests: from :func:`poisson_requests` (not modified; copies are returned).
        policy: ``"colocated"``, ``"chunked"`` or ``"disaggregated"``.
        cost: machine costs (default :func:`llama3_8b_h100_cost_model`).
        max_batch: most requests decoded together per machine.
        chunk: prompt tokens per step for ``"chunked"``.
        replicas: machines for the colocated policies (disaggregated always uses one
            prefill + one decode machine).

    Raises:
        TypeError: a size not an integer.
        ValueError: unknown policy or a size < 1.

    Source: Agrawal et al., 2023 (Sarathi, chunked prefill); Zhong et al., 2024 (DistServe) and
    Patel et al., 2024 (Splitwise) for prefill/decode disaggregation.
    """
    if policy not in ("colocated", "chunked", "disaggregated"):
        raise ValueError(f"policy must be 'colocated', 'chunked' or 'disaggregated', got {policy!r}")
    for name, v in (("max_batch", max_batch), ("chunk", chunk), ("replicas", replicas)):
        check_int(name, v, 1)
    cost = cost or llama3_8b_h100_cost_model()
    reqs = _fresh(requests)
    if policy == "disaggregated":
        free_at, ready = 0.0, {}
        for r in sorted(reqs, key=lambda r: (r.arrival, r.request_id)):
            free_at = max(free_at, r.arrival) + cost.prefill(r.prompt_len)
            r.emit(free_at)                                     # the prefill machine emits token 1
            ready[r.request_id] = free_at + cost.transfer(r.prompt_len)
        _serve_one([r for r in reqs if r.output_len > 1], cost, max_batch, None, ready)
    else:
        for k in range(replicas):
            _serve_one(reqs[k::replicas], cost, max_batch, chunk if policy == "chunked" else None)
    return reqs


def latency_stats(served: Sequence[ServedRequest]) -> dict[str, float]:
    """Median and 90th percentile of TTFT and TPOT, 99th percentile and maximum of the gaps
    between consecutive tokens (ITL), in milliseconds.

    Raises:
        ValueError: no served requests.
    """
    served = list(served)
    if not served:
        raise ValueError("served must hold at least one ServedRequest, got none")
    ttft = np.array([r.metrics.ttft for r in served]) * 1e3
    tpot = np.array([r.metrics.tpot for r in served if r.output_len > 1]) * 1e3
    gaps = np.array([g for r in served for g in r.metrics.itl] + [0.0]) * 1e3
    return {"TTFT p50": float(np.percentile(ttft, 50)), "TTFT p90": float(np.percentile(ttft, 90)),
            "TPOT p50": float(np.percentile(tpot, 50)) if tpot.size else 0.0,
            "TPOT p90": float(np.percentile(tpot, 90)) if tpot.size else 0.0,
            "ITL p99": float(np.percentile(gaps, 99)), "max ITL": float(gaps.max())}
