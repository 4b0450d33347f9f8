"""Contiguous reservation vs paged KV allocation on the same request stream (Kwon et al., 2023).

The KV memory holds ``memory_tokens`` token slots (1,024 by default, one cell per token in the figure).
Requests arrive at random (Poisson, ``arrival_rate`` per step); each starts with a
``prompt_len``-token prompt and grows by ``tokens_per_step`` tokens every step until it
holds its final length, drawn uniformly in ``[prompt_len, reservation]``. The same stream
goes through two allocators:

* **contiguous**: each admitted request reserves ``reservation`` consecutive slots and keeps
  them until it finishes — the naive serving that PagedAttention replaces (Kwon et al., 2023, §3). With one reservation size
  for everybody, first fit places every reservation at a multiple of ``reservation``, so
  this allocator *is* a block manager whose one block per request is ``reservation`` slots:
  ``BlockManager(memory_tokens // reservation, block_size=reservation)``.
* **paged**: ``BlockManager(memory_tokens // block_size, block_size)``: a request holds
  ``⌈length / block_size⌉`` blocks anywhere in the pool (Kwon et al., 2023, §4).

Both pools are driven by the engine's own :class:`~labsupport.engine.scheduler.Scheduler`
(first come first served, whole prompt admitted only if its blocks fit, the youngest
running sequence preempted by recompute when a decode finds no free block), one scheduler
step per generated token; a simulator *step* is ``tokens_per_step`` scheduler steps. No
model runs: the "tokens" are zeros. Pure Python + NumPy, fast enough for a slider.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.block_manager import BlockManager
from ..engine.scheduler import Scheduler, SchedulerConfig, Sequence
from ..validation import check_int, check_real

POLICIES = ("contiguous", "paged")


@dataclass(frozen=True)
class SimRequest:
    """One request of the stream: arrives at ``arrival_step``, holds ``prompt_len`` tokens when
    admitted and finishes when it holds ``final_len`` tokens."""

    request_id: int
    arrival_step: int
    prompt_len: int
    final_len: int


@dataclass(frozen=True)
class Workload:
    """The knobs of the simulator (defaults: a memory of 1,024 tokens, 8 tokens/step)."""

    reservation: int = 256
    arrival_rate: float = 0.5
    num_steps: int = 200
    memory_tokens: int = 1024
    prompt_len: int = 16
    tokens_per_step: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("num_steps", 1), ("memory_tokens", 1), ("prompt_len", 1), ("tokens_per_step", 1)):
            check_int(name, getattr(self, name), low)
        check_int("reservation", self.reservation, self.prompt_len, self.memory_tokens,
                  hint=" (prompt_len to memory_tokens)")
        check_real("arrival_rate", self.arrival_rate, 0, 16, hint=" requests per step")


def make_requests(workload: Workload) -> list[SimRequest]:
    """The request stream: Poisson arrivals, final length uniform in ``[prompt_len, reservation]``.

    Deterministic for a given ``workload.seed`` (a ``numpy.random.Generator``).
    """
    rng = np.random.default_rng(workload.seed)
    counts = rng.poisson(workload.arrival_rate, size=workload.num_steps)
    out: list[SimRequest] = []
    for step, k in enumerate(counts):
        for _ in range(int(k)):
            final = int(rng.integers(workload.prompt_len, workload.reservation + 1))
            out.append(SimRequest(len(out), step, workload.prompt_len, final))
    return out


@dataclass
class FragmentationRun:
    """Per-step record of one allocator on one stream.

    Attributes:
        policy: ``"contiguous"`` or ``"paged"``.
        block_size: tokens per block (``reservation`` for contiguous: one block per request).
        owner: ``(num_steps, memory_tokens)`` int, the request holding each slot (-1 free),
            at the end of each step.
        used: ``(num_steps, memory_tokens)`` bool, slot holds a token's KV (vs reserved/empty).
        running, queued, completed, preemptions: ``(num_steps,)`` counters (completed and
            preemptions cumulative).
        block_tables: for the paged policy, each step's block tables ``{request: [block ids]}``.
    """

    policy: str
    block_size: int
    owner: np.ndarray
    used: np.ndarray
    running: np.ndarray
    queued: np.ndarray
    completed: np.ndarray
    preemptions: np.ndarray
    block_tables: list[dict[int, list[int]]]

    @property
    def allocated(self) -> np.ndarray:
        """Slots held (reserved or used) at each step, ``(num_steps,)``."""
        return (self.owner >= 0).sum(axis=1)

    @property
    def waste(self) -> np.ndarray:
        """Fraction of held slots without KV at each step (0 where nothing is held)."""
        alloc = self.allocated
        used = self.used.sum(axis=1)
        return np.where(alloc > 0, (alloc - used) / np.maximum(alloc, 1), 0.0)

    def summary(self) -> dict[str, float]:
        """Mean running / queued / waste over the run, and the final completed / preemption counts."""
        return {"running": float(self.running.mean()), "queued": float(self.queued.mean()),
                "waste": float(self.waste[self.allocated > 0].mean()) if (self.allocated > 0).any() else 0.0,
                "completed": int(self.completed[-1]), "preemptions": int(self.preemptions[-1])}


def simulate(workload: Workload, policy: str, block_size: int = 16,
             requests: list[SimRequest] | None = None) -> FragmentationRun:
    """Run the stream through one allocator for ``workload.num_steps`` steps.

    Args:
        workload: the stream and memory (see :class:`Workload`).
        policy: ``"contiguous"`` or ``"paged"``.
        block_size: tokens per block of the paged pool (ignored for contiguous).
        requests: the stream (default :func:`make_requests` of the workload).

    Raises:
        TypeError: ``block_size`` not an integer.
        ValueError: unknown policy, ``block_size`` not in ``[1, memory_tokens]``, or so large
            that whole blocks cannot hold one request of ``reservation`` tokens.

    Source: Kwon et al., 2023 (PagedAttention, §3: fragmentation of contiguous KV reservations).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    mem = workload.memory_tokens
    check_int("block_size", block_size, 1, mem)
    bs = block_size if policy == "paged" else workload.reservation
    if (mem // bs) * bs < workload.reservation:
        raise ValueError(f"block_size must leave room for one request of reservation={workload.reservation} "
                         f"tokens in {mem} slots, got {block_size}")
    reqs = sorted(make_requests(workload) if requests is None else requests,
                  key=lambda r: (r.arrival_step, r.request_id))
    bm = BlockManager(mem // bs, bs)
    sched = Scheduler(SchedulerConfig(max_num_seqs=mem, max_num_batched_tokens=max(mem, 2 * workload.reservation)),
                      bm)
    seqs: dict[int, Sequence] = {}
    n_steps = workload.num_steps
    rec = {k: np.zeros(n_steps, dtype=np.int64) for k in ("running", "queued", "completed", "preemptions")}
    owner = np.full((n_steps, mem), -1, dtype=np.int32)
    used = np.zeros((n_steps, mem), dtype=bool)
    tables: list[dict[int, list[int]]] = []
    nxt = done = preempted = 0
    for step in range(n_steps):
        while nxt < len(reqs) and reqs[nxt].arrival_step <= step:
            r = reqs[nxt]
            # KV held at the end = prompt + max_new_tokens - 1 (the last token is never fed back)
            seqs[r.request_id] = seq = Sequence(str(r.request_id), [0] * r.prompt_len, r.final_len - r.prompt_len + 1)
            sched.add(seq)
            nxt += 1
        for _ in range(workload.tokens_per_step):               # one scheduler step per token
            out = sched.schedule()
            preempted += len(out.preempted)
            sched.on_step_done(out)
            for item in out.scheduled:
                if item.completes_prompt:
                    item.seq.output_ids.append(0)
                    if len(item.seq.output_ids) >= item.seq.max_new_tokens:
                        sched.finish(item.seq, "length")
                        done += 1
        table_now = {int(s): t for s, t in bm.block_tables().items()}
        tables.append(table_now)
        offsets = np.arange(bs)
        for rid, table in table_now.items():
            slots = (np.asarray(table)[:, None] * bs + offsets).ravel()    # slot of each logical position
            owner[step, slots] = rid
            used[step, slots[:bm.num_slots(str(rid))]] = True
        rec["running"][step], rec["queued"][step] = len(sched.running), len(sched.waiting)
        rec["completed"][step], rec["preemptions"][step] = done, preempted
    return FragmentationRun(policy=policy, block_size=bs, owner=owner, used=used, block_tables=tables, **rec)


def compare(workload: Workload, block_size: int = 16) -> dict[str, FragmentationRun]:
    """Both policies on the same stream: ``{"contiguous": run, "paged": run}``."""
    reqs = make_requests(workload)
    return {p: simulate(workload, p, block_size, reqs) for p in POLICIES}


def block_size_sweep(workload: Workload, block_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)) -> list[dict]:
    """The block-size trade-off on one stream: per block size, the mean waste of held slots,
    mean running requests, completed requests, and the mean block-table length (entries the
    attention kernel must follow per request).

    Raises:
        ValueError: a block size outside ``[1, memory_tokens]``.
    """
    reqs = make_requests(workload)
    rows = []
    for bs in block_sizes:
        run = simulate(workload, "paged", bs, reqs)
        entries = [len(t) for tables in run.block_tables for t in tables.values()]
        rows.append({"block_size": bs, **run.summary(),
                     "table_entries": float(np.mean(entries)) if entries else 0.0})
    return rows
