"""Pipeline parallelism of GPT-2 (GPipe, Huang et al. 2019): the depth cut into stages.

Stage ``s`` of ``p`` holds a contiguous run of blocks (stage 0 also the embeddings, the last
stage also the final layer norm and the LM head). A batch is cut into ``m`` micro-batches;
stage 0 pushes micro-batch ``j`` through its blocks and *sends* the activations
``(B/m, T, E)`` to stage 1 with a point-to-point ``isend``, then starts on ``j + 1`` while stage 1
works on ``j``. Only stage boundaries communicate — ``(p − 1) · E`` numbers per token — but
stage ``s`` waits ``s`` slots before its first micro-batch and the first stages idle at the
end: with equal stages the idle share of ``p × makespan`` (the **bubble**) is
``(p − 1) / (m + p − 1)`` (GPipe), so more micro-batches shrink it.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..validation import check_int
from .comm import Comm
from .tensor import GPT2Weights, tp_block


def stage_layers(n_layer: int, world_size: int) -> list[range]:
    """Blocks of each stage: ``n_layer`` split into ``world_size`` contiguous, near-equal runs.

    Raises:
        ValueError: more stages than blocks.
    """
    check_int("n_layer", n_layer, 1)
    check_int("world_size", world_size, 1, n_layer, hint=" (at most one stage per block)")
    bounds = [round(i * n_layer / world_size) for i in range(world_size + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(world_size)]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle share of ``stages × makespan`` with equal stages: ``(p − 1) / (m + p − 1)``.

    Raises:
        TypeError / ValueError: not integers >= 1.
    """
    p, m = check_int("stages", stages, 1), check_int("microbatches", microbatches, 1)
    return (p - 1) / (m + p - 1)


def bubble_unequal(stage_seconds: list[float], microbatches: int) -> float:
    """Bubble of a forward-only pipeline whose stage ``s`` takes ``t_s`` per micro-batch.

    The slowest stage paces the pipeline: makespan ``= Σ t_s + (m − 1) · max t_s``, busy time
    ``m · Σ t_s``, so the bubble is ``1 − m Σ t_s / (p · makespan)``; with equal stages this is
    :func:`bubble_fraction`. Communication is taken as free.

    Raises:
        ValueError: an empty list or a stage time not > 0.
    """
    m = check_int("microbatches", microbatches, 1)
    if not stage_seconds or min(stage_seconds) <= 0:
        raise ValueError(f"stage_seconds must be positive times, got {stage_seconds!r}")
    total = sum(stage_seconds)
    makespan = total + (m - 1) * max(stage_seconds)
    return 1.0 - m * total / (len(stage_seconds) * makespan)


def measured_bubble(events: list[list[tuple[float, float]]]) -> float:
    """Idle share from busy intervals: ``1 − Σ busy / (p × makespan)``.

    Args:
        events: per stage, its ``(start, end)`` compute intervals (seconds, one shared clock).
    """
    starts = [a for stage in events for a, _ in stage]
    ends = [b for stage in events for _, b in stage]
    makespan = max(ends) - min(starts)
    busy = sum(b - a for stage in events for a, b in stage)
    return 1.0 - busy / (len(events) * makespan)


class PipelineStage:
    """The blocks (and, at the ends, embeddings / head) of one pipeline stage.

    Args:
        weights: the full model (a stage keeps only its blocks).
        rank: this stage, ``0 … world_size − 1``.
        world_size: number of stages.
    """

    def __init__(self, weights: GPT2Weights, rank: int, world_size: int):
        self.w, self.rank, self.world_size = weights, rank, world_size
        self.blocks = [weights.layers[i] for i in stage_layers(weights.n_layer, world_size)[rank]]
        self.local = Comm(0, 1)                           # blocks run whole: no tensor parallelism inside

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.world_size - 1

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids → ``(B, T, E)`` (stage 0 only)."""
        return self.w.wte[ids] + self.w.wpe[torch.arange(ids.shape[1], device=ids.device)]

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This stage's blocks on ``x`` ``(B, T, E)``; the last stage returns logits ``(B, T, V)``."""
        for block in self.blocks:
            x = tp_block(x, block, [], self.local, self.w.n_head, self.w.eps)
        if self.last:
            x = F.layer_norm(x, (self.w.d_model,), self.w.ln_f_w, self.w.ln_f_b, self.w.eps)
            x = x @ self.w.wte.T
        return x


def pp_forward(rank: int, world_size: int, weights: GPT2Weights, batch_ids: torch.Tensor,
               microbatches: int, repeats: int = 1) -> dict:
    """Forward pass of a batch through a ``world_size``-stage pipeline (worker task
    ``labsupport.parallel.pipeline:pp_forward``).

    Args:
        batch_ids: ``(B, T)`` token ids; ``B`` divisible by ``microbatches``.
        microbatches: ``m``.
        repeats: runs (after one warm-up); the busy intervals of each are kept.

    Returns:
        ``events`` (per repeat: this stage's ``(start, end)`` compute intervals, ``time.perf_counter``
        seconds — one clock for all processes of a machine), ``logits`` ``(B, T, V)`` on the last
        stage (``None`` elsewhere), ``bytes_sent``, ``layers`` (this stage's blocks).

    Raises:
        ValueError: ``B`` not divisible by ``microbatches``.
    """
    import torch.distributed as dist

    check_int("microbatches", microbatches, 1)
    check_int("repeats", repeats, 1)
    b, t = batch_ids.shape
    if b % microbatches:
        raise ValueError(f"microbatches must divide the batch size {b}, got {microbatches}")
    comm = Comm(rank, world_size)
    stage = PipelineStage(weights.to(comm.device), rank, world_size)
    batch_ids = batch_ids.to(comm.device)
    shape = (b // microbatches, t, weights.d_model)
    runs, logits = [], None
    for run in range(repeats + 1):                        # run 0 is a warm-up
        comm.reset()
        dist.barrier()
        busy, outs, pending = [], [], []
        for mb in batch_ids.chunk(microbatches):
            x = stage.embed(mb) if stage.first else comm.recv(shape, rank - 1)
            t0 = time.perf_counter()
            y = stage.forward(x)
            if y.is_cuda:
                torch.cuda.synchronize(y.device)          # GPU work is asynchronous: finish before timing
            busy.append((t0, time.perf_counter()))
            if stage.last:
                outs.append(y)
            else:
                pending.append((comm.send(y, rank + 1), y))   # keep y alive until sent
        for request, _ in pending:
            request.wait()
        if run:
            runs.append(busy)
        logits = torch.cat(outs).cpu() if stage.last else None
    return {"rank": rank, "events": runs, "logits": logits, "bytes_sent": comm.bytes_sent,
            "layers": list(stage_layers(weights.n_layer, world_size)[rank]), "microbatches": microbatches}


def bubbles_from_results(results: list[dict]) -> list[float]:
    """Measured bubble of every repeat from the stages' :func:`pp_forward` results (rank order)."""
    repeats = len(results[0]["events"])
    return [measured_bubble([r["events"][i] for r in results]) for i in range(repeats)]
