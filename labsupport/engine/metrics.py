"""Serving metrics: TTFT, TPOT, ITL, throughput and goodput (Zhong et al. 2024, DistServe, for goodput).

Per request the engine records the arrival time, the time it was first scheduled, the time
of every generated token and the finish time (all in seconds of one clock: wall time in the
engine, a virtual clock in the simulators). From them:

- **TTFT** (time to first token) = first token time − arrival time: queueing + prefill.
- **TPOT** (time per output token) = (finish − first token) / (n − 1): the mean decode gap.
- **ITL** (inter-token latency) = the individual gaps between consecutive tokens.
- end-to-end latency ≈ TTFT + TPOT · (n − 1).
- **throughput** = generated tokens / (last finish − first arrival), tokens per second.
- **goodput** = requests per second that met the service-level objective (SLO), e.g.
  TTFT ≤ 0.5 s and TPOT ≤ 50 ms: batching raises throughput but can lower goodput.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Timestamps of one request (seconds on the engine's clock).

    Attributes:
        arrival_time: when it was added.
        first_scheduled_time: when it first ran (None until then).
        first_token_time: when its first token was sampled.
        finish_time: when it finished.
        token_times: when each generated token was sampled.
        num_preemptions: times it was preempted.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated (one time stamp each)."""
        return len(self.token_times)

    @property
    def ttft(self) -> float | None:
        """Time to first token (s), or None before it."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (s); None with fewer than 2 tokens."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive tokens (s), ``n − 1`` values."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def e2e_latency(self) -> float | None:
        """Finish − arrival (s)."""
        return None if self.finish_time is None else self.finish_time - self.arrival_time


def meets_slo(m: RequestMetrics, ttft_slo: float | None = None, tpot_slo: float | None = None) -> bool:
    """Whether a finished request met the SLO (a ``None`` bound is not checked).

    A request without tokens (e.g. finished with an error) never meets it.
    """
    if m.first_token_time is None:
        return False
    if ttft_slo is not None and m.ttft > ttft_slo:
        return False
    return tpot_slo is None or m.tpot is None or m.tpot <= tpot_slo


def _window(metrics: list[RequestMetrics]) -> float:
    finished = [m.finish_time for m in metrics if m.finish_time is not None]
    if not finished:
        return 0.0
    return max(finished) - min(m.arrival_time for m in metrics)


def throughput(metrics: Iterable[RequestMetrics]) -> float:
    """Generated tokens per second over the window first arrival → last finish (0 if empty)."""
    metrics = list(metrics)
    span = _window(metrics)
    return sum(m.num_output_tokens for m in metrics) / span if span > 0 else 0.0


def request_throughput(metrics: Iterable[RequestMetrics]) -> float:
    """Finished requests per second over the same window."""
    metrics = list(metrics)
    span = _window(metrics)
    return sum(m.finish_time is not None for m in metrics) / span if span > 0 else 0.0


def goodput(metrics: Iterable[RequestMetrics], ttft_slo: float | None = None,
            tpot_slo: float | None = None) -> float:
    """Requests per second that met the SLO (Zhong et al. 2024: count only what meets the target).

    Raises:
        ValueError: an SLO bound that is not > 0.
    """
    for name, value in (("ttft_slo", ttft_slo), ("tpot_slo", tpot_slo)):
        if value is not None and not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                                      and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}")
    metrics = list(metrics)
    span = _window(metrics)
    good = sum(meets_slo(m, ttft_slo, tpot_slo) for m in metrics)
    return good / span if span > 0 else 0.0


def summarize(metrics: Iterable[RequestMetrics], ttft_slo: float | None = None,
              tpot_slo: float | None = None) -> dict[str, float]:
    """Mean / p50 / p90 TTFT and TPOT, throughput and goodput of a run, as a flat dict.

    A statistic with no data (no request has a first token, or none has two tokens for TPOT)
    is ``nan``: "no value", not 0 s. Throughput and goodput are 0 when nothing finished.
    """
    metrics = list(metrics)

    def pct(values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        values = sorted(values)
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]

    ttfts = [m.ttft for m in metrics if m.ttft is not None]
    tpots = [m.tpot for m in metrics if m.tpot is not None]
    return {
        "requests": len(metrics),
        "ttft_mean": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        "ttft_p50": pct(ttfts, 0.5), "ttft_p90": pct(ttfts, 0.9),
        "tpot_mean": sum(tpots) / len(tpots) if tpots else float("nan"),
        "tpot_p50": pct(tpots, 0.5), "tpot_p90": pct(tpots, 0.9),
        "throughput": throughput(metrics),
        "goodput": goodput(metrics, ttft_slo, tpot_slo),
    }
