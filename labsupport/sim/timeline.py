"""Turn per-step engine states into drawable timelines: request states and slot segments.

Works on plain data (lists of per-step dicts) so it serves both ``LLMEngine.history`` (via
:func:`frames_from_history`) and the simulators.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..i18n import tr

#: Request states drawn on a timeline, in legend order.
STATES = ("not arrived", "waiting", "prefill", "decode", "swapped", "finished")


@dataclass(frozen=True)
class Segment:
    """``request_id`` held batch slot ``slot`` during steps ``start ≤ step < end``."""

    slot: int
    request_id: Hashable
    start: int
    end: int


def assign_slots(running_per_step: Sequence[Sequence[Hashable]]) -> list[Segment]:
    """Give every running request a slot (the lowest free one) for as long as it keeps running.

    A request that leaves the running set (finished or preempted) frees its slot; when it
    comes back it gets a new segment, possibly in another slot.

    Args:
        running_per_step: the ids running (scheduled) at each step.

    Returns:
        segments sorted by start step, then slot.
    """
    slot_of: dict[Hashable, tuple[int, int]] = {}              # request -> (slot, start)
    out: list[Segment] = []
    for step, running in enumerate(running_per_step):
        now = list(dict.fromkeys(running))
        for rid in [r for r in slot_of if r not in now]:
            slot, start = slot_of.pop(rid)
            out.append(Segment(slot, rid, start, step))
        taken = {s for s, _ in slot_of.values()}
        for rid in now:
            if rid not in slot_of:
                slot = next(k for k in range(len(taken) + 1) if k not in taken)
                taken.add(slot)
                slot_of[rid] = (slot, step)
    end = len(running_per_step)
    out += [Segment(slot, rid, start, end) for rid, (slot, start) in slot_of.items()]
    return sorted(out, key=lambda s: (s.start, s.slot))


def state_matrix(frames: Sequence[Mapping], request_ids: Sequence[Hashable]) -> dict[Hashable, list[str]]:
    """Per request, its state (one of :data:`STATES`) at each step.

    Args:
        frames: per step a mapping with ``waiting``, ``running``, ``swapped`` (id lists),
            ``finished`` (ids finished so far or this step) and ``prefill`` (ids computing
            prompt tokens this step; a running id not in it is decoding).
        request_ids: the requests to report.
    """
    out: dict[Hashable, list[str]] = {rid: [] for rid in request_ids}
    done: set = set()
    for f in frames:
        prefill = set(f.get("prefill", ()))
        running, waiting, swapped = set(f.get("running", ())), set(f.get("waiting", ())), set(f.get("swapped", ()))
        for rid in request_ids:
            if rid in running:
                state = "prefill" if rid in prefill else "decode"
            elif rid in swapped:
                state = "swapped"
            elif rid in waiting:
                state = "waiting"
            elif rid in done:
                state = "finished"
            else:
                state = "not arrived"
            out[rid].append(state)
        done |= set(f.get("finished", ()))
    return out


def frame_from_snapshot(snap, cached_blocks: Sequence[int] = (), label: str | None = None) -> dict:
    """A plain-data frame of one :class:`labsupport.engine.engine.EngineSnapshot` for the figures.

    Keys: ``block_tables``, ``num_slots``, ``ref_counts``, ``cached_blocks``, ``label``,
    ``waiting``, ``running`` (ids scheduled this step), ``prefill`` (ids that ran more than
    one token, i.e. a prompt or recompute chunk, or their first token), ``swapped``,
    ``finished``, ``preempted``, ``scheduled_tokens``, ``num_free_blocks``, ``time``.

    Args:
        snap: an engine snapshot (``engine.snapshot()`` or an entry of ``engine.history``).
        cached_blocks: ids of unreferenced blocks still holding a cached prefix (not in the
            snapshot; read them from ``engine.block_manager`` when capturing live).
        label: caption (default ``"step N"``).
    """
    sched = dict(snap.scheduled_tokens)
    return {"block_tables": {k: list(v) for k, v in snap.block_tables.items()}, "num_slots": dict(snap.num_slots),
            "ref_counts": list(snap.ref_counts), "cached_blocks": list(cached_blocks),
            "label": label or tr("step {n}", n=snap.step), "waiting": list(snap.waiting), "running": list(sched),
            "prefill": [r for r, n in sched.items() if n > 1], "swapped": list(snap.swapped),
            "finished": list(snap.finished), "preempted": list(snap.preempted), "scheduled_tokens": sched,
            "num_free_blocks": snap.num_free_blocks, "time": snap.time}


def cached_block_ids(block_manager) -> list[int]:
    """Blocks with ref count 0 that still hold a registered prefix (evictable), by id."""
    return [b.block_id for b in block_manager.blocks if b.ref_count == 0 and b.hash is not None]
