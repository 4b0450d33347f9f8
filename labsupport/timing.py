"""Wall-clock timings that hold on a busy laptop: warm-up, repeats, the median and the spread.

A single ``time.perf_counter()`` difference on a 2-core machine shared with a browser can be
off by a factor of two. A chapter's timing cell therefore runs the work once untimed (caches,
allocator, lazy imports), then ``repeats`` times, and reports the **median** with the range
(fastest … slowest). A sentence that interprets two timings asks :func:`clearly_faster`, which
says "faster" only when the two ranges do not overlap, so noise cannot flip the prose.

The timing helpers of the package: :func:`time_call` (one piece of work, repeated) and
:func:`time_interleaved` (several, in turn — a method against its baseline, the sizes of one
forward). What they do not cover is timed where it happens, and says so: a request's token
timestamps (TTFT, TPOT: the engine's metrics, ``bench.kv_cache.request_token_times``), a peer
that times itself (vLLM, Hugging Face's batching), per-step averages over a variable number of
steps (the grammar benchmarks).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .i18n import tr
from .validation import check_callable, check_int, check_type

K = TypeVar("K")


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock measurements of one piece of work, in seconds."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample, got none")
        if any(not s >= 0 for s in self.samples):            # also rejects NaN
            raise ValueError(f"timing samples must be seconds >= 0, got {self.samples}")

    @property
    def median(self) -> float:
        """The median sample (seconds): what one run typically costs."""
        return float(statistics.median(self.samples))

    @property
    def low(self) -> float:
        """The fastest sample (seconds)."""
        return float(min(self.samples))

    @property
    def high(self) -> float:
        """The slowest sample (seconds)."""
        return float(max(self.samples))

    @property
    def spread(self) -> float:
        """(slowest − fastest) / median: 0.1 means the runs lie within ±5 % or so of each other."""
        return (self.high - self.low) / self.median if self.median > 0 else 0.0

    def ms(self, digits: int = 1) -> str:
        """``"12.3 ms (11.9–14.0, 5 runs)"``: median, range and count, in milliseconds."""
        f = f"{{:.{digits}f}}"
        return tr("{median} ms ({low}–{high}, {n} runs)", median=f.format(1e3 * self.median),
                  low=f.format(1e3 * self.low), high=f.format(1e3 * self.high), n=len(self.samples))


def time_call(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> Timing:
    """Run ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed (``time.perf_counter``).

    Raises:
        TypeError: ``fn`` not callable, or ``repeats`` / ``warmup`` not integers.
        ValueError: ``repeats < 1`` or ``warmup < 0``.
    """
    check_callable("fn", fn)
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples))


def time_interleaved(jobs: Mapping[K, Callable[[], object]], *, repeats: int = 5, warmup: int = 1,
                     before: Callable[[K], object] | None = None,
                     after: Callable[[K], object] | None = None) -> dict[K, Timing]:
    """Time several jobs in turn — a, b, c, a, b, c, … — so that what drifts on a busy machine (a
    browser, the clock speed, another process) falls on all of them alike: the benchmarks' way of
    comparing a method with a baseline, or sizes of one forward, in one run. ``warmup`` rounds run
    untimed first; ``before(key)`` / ``after(key)`` run untimed around each call (evict the caches,
    undo the K/V a call appended).

    Returns:
        ``{key: Timing}`` in the jobs' order (``.low`` the fastest sample, ``.median`` the typical one).

    Raises:
        TypeError: a job that is not callable, counts that are not integers.
        ValueError: no jobs, ``repeats < 1`` or ``warmup < 0``.
    """
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    if not jobs:
        raise ValueError("jobs must hold at least one job, got none")
    for key, fn in jobs.items():
        check_callable(f"jobs[{key!r}]", fn)
    samples: dict[K, list[float]] = {key: [] for key in jobs}
    for r in range(warmup + repeats):
        for key, fn in jobs.items():
            if before is not None:
                before(key)
            start = time.perf_counter()
            fn()
            if r >= warmup:
                samples[key].append(time.perf_counter() - start)
            if after is not None:
                after(key)
    return {key: Timing(tuple(v)) for key, v in samples.items()}


def timing_of(samples: Sequence[float]) -> Timing:
    """A :class:`Timing` of samples (seconds) measured elsewhere, e.g. one per engine step.

    Raises:
        TypeError: not a sequence of numbers.
        ValueError: empty, negative or NaN.
    """
    check_type("samples", samples, (list, tuple))
    return Timing(tuple(float(s) for s in samples))


def median_range(values: Sequence[float], *, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """``"1.42× (1.30–1.51, 3 runs)"``: the median of repeated measurements (times, rates or ratios),
    their range and count — the one formatter of the chapters and the benchmarks.

    Args:
        values: the repeats. scale: multiply before printing (1e3 for ms). digits: decimals.
        unit: appended to the median (``"×"``, ``" ms"``).

    Raises:
        ValueError: no values.
    """
    if len(values) == 0:
        raise ValueError("values must hold at least one measurement, got none")
    f = f"{{:.{int(digits)}f}}"
    med, lo, hi = (scale * float(x) for x in (statistics.median(values), min(values), max(values)))
    if len(values) == 1:
        return tr("{median}{unit} (1 run)", median=f.format(med), unit=unit)
    return tr("{median}{unit} ({low}–{high}, {n} runs)", median=f.format(med), unit=unit, low=f.format(lo),
              high=f.format(hi), n=len(values))


def clearly_faster(a: Timing, b: Timing) -> bool:
    """True when ``a`` is faster than ``b`` beyond the noise: a's slowest run beats b's fastest.

    Raises:
        TypeError: an argument not a :class:`Timing`.
    """
    check_type("a", a, Timing)
    check_type("b", b, Timing)
    return a.high < b.low


__all__ = ["Timing", "clearly_faster", "median_range", "time_call", "timing_of"]
