"""The client side of serving experiments: requests, what the client saw of them, a mixed
workload, and the colocated baseline (one engine in this process serving the same requests in
real time). :mod:`labsupport.serving.disagg` serves the same requests with two processes.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..sampling import GREEDY
from ..validation import check_int, check_real

__all__ = ["ServeRequest", "ServeResult", "latency_table", "mixed_workload", "run_colocated"]


@dataclass
class ServeRequest:
    """One request of a workload: ``arrival`` seconds after the start."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival: float = 0.0


@dataclass
class ServeResult:
    """What the client saw of one request (times on ``time.perf_counter``).

    Attributes:
        token_ids: generated tokens; finish_reason: the engine's; arrival_time, token_times.
        kv_bytes: bytes of KV shipped for it (0 colocated).
        transfer_time: seconds from the first token (end of the prefill) until the decode side
            had the whole KV: the transfer time the prefill did not hide (0 colocated).
    """

    request_id: str
    token_ids: list[int]
    finish_reason: str | None
    arrival_time: float
    token_times: list[float] = field(default_factory=list)
    kv_bytes: int = 0
    transfer_time: float = 0.0
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def itl(self) -> list[float]:
        return list(np.diff(self.token_times))


def mixed_workload(vocab_size: int, num_pairs: int = 4, long_prompt: int = 600, long_new: int = 4,
                   short_prompt: int = 16, short_new: int = 48, gap: float = 0.03, seed: int = 0) -> list[ServeRequest]:
    """Alternating requests: a short prompt with a long answer, then a long prompt with a short
    answer, ``gap`` seconds apart (random token ids from a seeded generator).

    Raises:
        TypeError / ValueError: a size < 1, a gap < 0.
    """
    num_pairs = check_int("num_pairs", num_pairs, 1)
    for name, v in (("long_prompt", long_prompt), ("long_new", long_new), ("short_prompt", short_prompt),
                    ("short_new", short_new), ("vocab_size", vocab_size)):
        check_int(name, v, 1)
    gap = check_real("gap", gap, 0.0)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num_pairs):
        for kind, plen, new in (("short", short_prompt, short_new), ("long", long_prompt, long_new)):
            ids = rng.integers(0, vocab_size, plen).tolist()
            out.append(ServeRequest(f"{kind}{i}", ids, new, gap * len(out)))
    return out


def result_of(engine, rid: str, kv_bytes: int = 0, transfer: float = 0.0) -> ServeResult:
    o = engine.output(rid)
    return ServeResult(rid, list(o.token_ids), o.finish_reason, o.metrics.arrival_time, list(o.metrics.token_times),
                       kv_bytes, transfer, o.error)


def run_colocated(lm, requests: list[ServeRequest], timeout: float = 120.0, **engine_kwargs) -> dict[str, ServeResult]:
    """One engine serves the workload in this process, in real time (one torch thread).

    Requests are added when their arrival time has come; the engine steps while it has work.

    Raises:
        TimeoutError: the run took longer than ``timeout`` seconds.
    """
    from ..engine import LLMEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = LLMEngine(lm, **engine_kwargs)
        todo = deque(sorted(requests, key=lambda r: r.arrival))
        start = time.perf_counter()
        while todo or engine.has_unfinished_requests():
            now = time.perf_counter()
            if now - start > timeout:
                raise TimeoutError(f"colocated run took longer than {timeout} s")
            while todo and start + todo[0].arrival <= now:
                r = todo.popleft()
                engine.add_request(r.prompt_ids, GREEDY, r.max_new_tokens, r.request_id, start + r.arrival)
            if engine.has_unfinished_requests():
                engine.step()
            elif todo:
                time.sleep(max(0.0, start + todo[0].arrival - time.perf_counter()))
        return {r.request_id: result_of(engine, r.request_id) for r in requests}
    finally:
        torch.set_num_threads(threads)


def latency_table(results: dict[str, ServeResult]) -> dict[str, float]:
    """TTFT and ITL of a run, p50 and p95, in milliseconds (numpy percentiles)."""
    ttft = [r.ttft for r in results.values() if r.token_times]
    itl = [g for r in results.values() for g in r.itl]
    pct = lambda v, q: 1e3 * float(np.percentile(v, q)) if v else float("nan")
    return {"ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "itl_p50": pct(itl, 50), "itl_p95": pct(itl, 95)}
