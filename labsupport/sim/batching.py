"""Static vs continuous batching on decode slots, step by step (Yu et al., 2022, Orca).

A *slot* is one place in the running batch. Each step, every occupied slot makes one token.
A request of output length ``n`` occupies a slot for ``n`` steps (its first step is the
prefill that emits token 1), then leaves.

* **static**: take up to ``batch_size`` arrived requests, run until the *longest* ends,
  then take the next batch — a finished request's slot idles until the batch ends;
* **continuous** (Orca's iteration-level scheduling): every step, fill each free slot with
  the next arrived request (first come, first served).

The simulator counts steps, not seconds: :func:`run_seconds` turns a run into time with a
step-time model such as :func:`labsupport.kv.step_time`. The real engine
(:class:`labsupport.engine.LLMEngine`) does the same with a model; this is the fast version
that a slider can re-run on every move.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..validation import check_int, check_real

POLICIES = ("static", "continuous")


@dataclass(frozen=True)
class SlotSegment:
    """Request ``request_id`` held slot ``slot`` during steps ``start ≤ step < end``."""

    slot: int
    request_id: int
    start: int
    end: int


@dataclass(frozen=True)
class BatchingRun:
    """The outcome of one simulated run.

    Attributes:
        policy: ``"static"`` or ``"continuous"``.
        batch_size: slots.
        output_lens: tokens each request produces (index = request id).
        arrival_steps: step at which each request can first be scheduled.
        segments: one :class:`SlotSegment` per request (the Gantt chart of slots).
        active_per_step: occupied slots at each step (length ``num_steps``).
    """

    policy: str
    batch_size: int
    output_lens: tuple[int, ...]
    arrival_steps: tuple[int, ...]
    segments: tuple[SlotSegment, ...]
    active_per_step: tuple[int, ...]

    @property
    def num_steps(self) -> int:
        """Steps until the last request finished."""
        return len(self.active_per_step)

    @property
    def useful_slot_steps(self) -> int:
        """Slot-steps that produced a token: Σ output lengths."""
        return sum(self.output_lens)

    @property
    def utilisation(self) -> float:
        """useful slot-steps / (batch_size × num_steps) — the slot utilisation."""
        return self.useful_slot_steps / (self.batch_size * self.num_steps)

    @property
    def tokens_per_step(self) -> float:
        """Throughput in tokens per step."""
        return self.useful_slot_steps / self.num_steps

    def first_token_step(self) -> list[int]:
        """For each request, the step (from its arrival) after which its first token exists: queueing + 1."""
        by_id = {s.request_id: s for s in self.segments}
        return [by_id[i].start - self.arrival_steps[i] + 1 for i in range(len(self.output_lens))]

    def finish_step(self) -> list[int]:
        """For each request, the step at which it finished (exclusive end of its segment)."""
        by_id = {s.request_id: s for s in self.segments}
        return [by_id[i].end for i in range(len(self.output_lens))]


MAX_STEP = 1_000_000   # latest arrival step: every step is recorded in ``active_per_step``


def _check(output_lens: Sequence[int], batch_size: int, arrival_steps: Sequence[int] | None):
    check_int("batch_size", batch_size, 1)
    if len(output_lens) == 0:
        raise ValueError("output_lens must hold at least one request, got an empty sequence")
    lens = tuple(check_int(f"output_lens[{i}]", n, 1) for i, n in enumerate(output_lens))
    arrivals = (tuple(0 for _ in lens) if arrival_steps is None
                else tuple(check_int(f"arrival_steps[{i}]", a, 0, MAX_STEP, hint=" (steps the simulator records)")
                           for i, a in enumerate(arrival_steps)))
    if len(arrivals) != len(lens):
        raise ValueError(f"arrival_steps must have one entry per request ({len(lens)}), got {len(arrivals)}")
    return lens, arrivals


def simulate_batching(output_lens: Sequence[int], batch_size: int, policy: str = "continuous",
                      arrival_steps: Sequence[int] | None = None) -> BatchingRun:
    """Run requests through ``batch_size`` slots under static or continuous batching.

    Requests are served first come, first served (by arrival step, then by index).

    Args:
        output_lens: tokens each request produces (≥ 1).
        batch_size: slots (the most requests decoded together).
        policy: ``"static"`` or ``"continuous"``.
        arrival_steps: first step each request may be scheduled (default: all at step 0).

    Returns:
        A :class:`BatchingRun` (segments for the Gantt chart, active slots per step).

    Raises:
        ValueError: unknown policy, ``batch_size`` < 1, a length < 1, an arrival outside
            [0, 1 000 000], or mismatched lengths.

    Source: static batching waits for its longest request; continuous
    batching refills a slot the step it frees (Yu et al., 2022, Orca).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    lens, arrivals = _check(output_lens, batch_size, arrival_steps)
    queue = sorted(range(len(lens)), key=lambda i: (arrivals[i], i))
    slots: list[tuple[int, int] | None] = [None] * batch_size       # (request id, start step)
    left = [0] * batch_size
    segments: list[SlotSegment] = []
    active: list[int] = []
    step, head = 0, 0
    while head < len(queue) or any(s is not None for s in slots):
        if policy == "continuous" or all(s is None for s in slots):
            for k in range(batch_size):
                if slots[k] is None and head < len(queue) and arrivals[queue[head]] <= step:
                    slots[k] = (queue[head], step)
                    left[k] = lens[queue[head]]
                    head += 1
        busy = [k for k in range(batch_size) if slots[k] is not None and left[k] > 0]
        if not busy and head < len(queue) and arrivals[queue[head]] > step:   # idle until the next
            gap = arrivals[queue[head]] - step                                # arrival: jump there
            active.extend([0] * gap)
            step += gap
            continue
        active.append(len(busy))
        for k in busy:
            left[k] -= 1
            if left[k] == 0:
                rid, start = slots[k]
                segments.append(SlotSegment(k, rid, start, step + 1))
                if policy == "continuous":
                    slots[k] = None
        if policy == "static" and all(left[k] == 0 for k in range(batch_size)):
            slots = [None] * batch_size
        step += 1
    return BatchingRun(policy=policy, batch_size=batch_size, output_lens=lens, arrival_steps=arrivals,
                       segments=tuple(sorted(segments, key=lambda s: (s.start, s.slot))),
                       active_per_step=tuple(active))


def run_seconds(run: BatchingRun, step_time: Callable[[int], float], idle_slots_cost: bool = False) -> float:
    """Wall-clock seconds of a run under a step-time model.

    Args:
        run: a :class:`BatchingRun`.
        step_time: seconds of one step as a function of the batch it computes, e.g.
            ``lambda b: kv.step_time(W, BW, b, K)``.
        idle_slots_cost: static batching with padding computes finished slots anyway; when
            ``True`` a static step costs ``step_time(batch_size)``.

    Raises:
        ValueError: a step time that is not > 0.
    """
    total = 0.0
    for b in run.active_per_step:
        width = run.batch_size if (idle_slots_cost and run.policy == "static") else max(b, 1)
        t = step_time(width)
        if not t > 0:
            raise ValueError(f"step_time must return seconds > 0, got {t!r} for batch {width}")
        total += t
    return total


def spread_lengths(mean: float, spread: float) -> tuple[int, int]:
    """Short and long output lengths ``mean·(1 − spread)`` and ``mean·(1 + spread)`` (rounded, ≥ 1).

    ``mean=225, spread=7/9`` gives 50 and 400.

    Raises:
        TypeError: ``mean`` or ``spread`` not a number.
        ValueError: ``mean`` < 1 or ``spread`` outside [0, 1).
    """
    check_real("mean", mean, 1)
    check_real("spread", spread, 0, 1, high_open=True)
    return max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))


def bimodal_stream(num_requests: int, short: int, long: int, seed: int = 0) -> list[int]:
    """``num_requests`` output lengths, each ``short`` or ``long`` with probability ½ (seeded).

    Raises:
        TypeError: an argument not an integer.
        ValueError: ``num_requests`` < 1 or a length < 1.
    """
    check_int("num_requests", num_requests, 1)
    check_int("short", short, 1)
    check_int("long", long, 1)
    rng = np.random.default_rng(seed)
    return [int(long) if b else int(short) for b in rng.integers(0, 2, size=num_requests)]
