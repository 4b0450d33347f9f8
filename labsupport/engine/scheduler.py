"""The scheduler: continuous batching with preemption and chunked prefill (Yu et al. 2022, Orca;
Kwon et al. 2023, vLLM; Agrawal et al. 2024, Sarathi-Serve).

Every engine step the scheduler decides which sequences run and how many of their tokens:

1. **running** sequences first, oldest first: one token each to decode, or the next chunk of
   their prompt. A decode needs a new slot; if the pool has none, the *youngest* running
   sequence is *preempted* (repeatedly, possibly the sequence itself):
   - **recompute**: its blocks are freed and it goes back to the front of the waiting queue;
     later its prompt + output so far is prefilled again (costs compute, no memory);
   - **swap**: its blocks are copied to CPU swap space and it waits in the swapped queue
     (costs transfer and CPU memory, no recomputation). Only a sequence that is decoding and
     fits the swap space is swapped; any other one is recomputed.
2. **swapped** sequences come back (oldest first) when no one was preempted this step and
   their blocks fit again.
3. **waiting** requests are admitted (first come, first served) while there are free blocks for
   the whole prompt, room under ``max_num_seqs`` and token budget left, and nothing is still
   swapped out. With **chunked prefill** a long prompt is split into chunks of at most
   ``max_prefill_chunk`` tokens that share steps with other sequences' decodes.

Every step's tokens fit the budget ``max_num_batched_tokens``. The scheduler only does
bookkeeping (no torch): the engine runs the model, and the simulators in ``labsupport.sim``
drive the same class with a virtual clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..validation import check_bool, check_choice, check_int
from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus

__all__ = ["ScheduledSeq", "Scheduler", "SchedulerConfig", "SchedulerOutput", "Sequence", "SequenceStatus"]


@dataclass
class SchedulerConfig:
    """Admission and preemption rules (vLLM's names).

    Attributes:
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
        preemption_mode: ``"recompute"`` or ``"swap"``.
        enable_chunked_prefill: split prompts into chunks that share steps with decodes.
        max_prefill_chunk: most prompt tokens of one sequence per step (None = the budget).

    Raises:
        TypeError: a value of the wrong type (a flag must be a bool).
        ValueError: a value outside its range.
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    preemption_mode: str = "recompute"
    enable_chunked_prefill: bool = False
    max_prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        self.max_num_seqs = check_int("max_num_seqs", self.max_num_seqs, 1)
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens must be >= max_num_seqs ({self.max_num_seqs}) so every "
                             f"running sequence can decode, got {self.max_num_batched_tokens}")
        check_choice("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        if self.max_prefill_chunk is not None:
            self.max_prefill_chunk = check_int("max_prefill_chunk", self.max_prefill_chunk, 1, hint=" or None")

    @property
    def chunk_size(self) -> int:
        """Most prompt tokens one sequence may run in a step."""
        if not self.enable_chunked_prefill:
            return self.max_num_batched_tokens
        return min(self.max_prefill_chunk or self.max_num_batched_tokens, self.max_num_batched_tokens)


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: tokens ``[start, start + num_new_tokens)`` run through the model."""

    seq: Sequence
    start: int
    num_new_tokens: int

    @property
    def completes_prompt(self) -> bool:
        """True when after this step every token is computed, so a new token is sampled."""
        return self.start + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    """The decisions of one step.

    Attributes:
        scheduled: what runs, running sequences first.
        preempted: ids preempted this step (recomputed or swapped).
        blocks_to_swap_out: ``(device_block, cpu_block)`` pairs to copy before anything else (a
            list, not a dict: two preempted forks sharing a block each copy it to their own CPU block).
        blocks_to_swap_in: ``{cpu_block: device_block}`` to copy next.
        blocks_to_copy: ``(src, dst)`` copy-on-write pairs to copy before the forward.
    """

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: dict[int, int] = field(default_factory=dict)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Waiting / running / swapped queues over one :class:`BlockManager`.

    Args:
        config: the :class:`SchedulerConfig`.
        block_manager: the KV pool.
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()

    # ------------------------------------------------------------------ queue helpers
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (check :meth:`why_never_fits` first)."""
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def start_running(self, seq: Sequence) -> None:
        """A waiting sequence starts running, admitted outside :meth:`schedule`: a request whose prompt
        another engine computed (disaggregated serving: its blocks are allocated), or one the speculative
        engine admitted under its own reservation rule. It leaves the waiting queue for the running one."""
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def add_running_after(self, seq: Sequence, after: Sequence) -> None:
        """``seq`` runs right after ``after`` (a fork's child next to its parent, whose blocks it shares)."""
        seq.status = SequenceStatus.RUNNING
        self.running.insert(self.running.index(after) + 1, seq)

    def add_waiting_at(self, seq: Sequence, index: int) -> None:
        """``seq`` waits at ``index`` of the waiting queue (a fork's children that find the batch full go
        first in line, in order; they are recomputed when admitted)."""
        seq.status = SequenceStatus.WAITING
        self.waiting.insert(index, seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def why_never_fits(self, prompt_len: int, max_new_tokens: int) -> str | None:
        """Why a request could never be scheduled, even alone in an empty pool (else ``None``).

        A sequence holds at most ``prompt_len + max_new_tokens - 1`` slots; it must fit the
        pool. Without chunked prefill its longest (re)computation must fit one step's budget.
        """
        bm, slots = self.block_manager, prompt_len + max_new_tokens - 1
        if bm.blocks_needed(slots) > bm.num_blocks:
            return (f"request needs up to {slots} KV slots ({bm.blocks_needed(slots)} blocks of {bm.block_size}) "
                    f"but the pool has {bm.num_blocks} blocks")
        if not self.config.enable_chunked_prefill and slots > self.config.max_num_batched_tokens:
            return (f"request needs a prefill of up to {slots} tokens but max_num_batched_tokens is "
                    f"{self.config.max_num_batched_tokens} and chunked prefill is off")
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark a sequence finished, drop it from its queue and free its blocks."""
        for queue in (self.running, self.waiting, self.swapped):
            if seq in queue:
                queue.remove(seq)
        if self.block_manager.has_seq(seq.seq_id):
            self.block_manager.free(seq.seq_id)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch (see the module docstring for the rules)."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
        if not out.preempted and not self.swapped:
            self._schedule_waiting(out, budget)
        return out

    def _num_new_tokens(self, seq: Sequence, budget: int) -> int:
        n = seq.num_uncomputed_tokens
        if n > 1:                                               # a prompt (or recompute) chunk
            n = min(n, self.config.chunk_size)
        return min(n, budget)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        queue, kept = deque(self.running), []
        while queue:
            seq = queue.popleft()
            n = self._num_new_tokens(seq, budget)
            if n == 0:                                          # budget spent: waits a step, keeps its blocks
                kept.append(seq)
                continue
            if bm.num_slots(seq.seq_id) < seq.num_tokens:      # decode: the newest token needs a slot
                fits = bm.can_append(seq.seq_id)                # asked once per change, not twice a step
                while not fits and queue:
                    self._preempt(queue.pop(), out)             # the youngest gives way
                    fits = bm.can_append(seq.seq_id)
                if not fits:
                    self._preempt(seq, out)
                    continue
                block, _, copied_from = bm.append_slot(seq.seq_id, seq.token_ids[-1])
                if copied_from is not None:
                    out.blocks_to_copy.append((copied_from, block))
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
            kept.append(seq)
        self.running = kept
        return budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            if bm.blocks_needed(bm.num_slots(seq.seq_id) + 1) > bm.num_available_blocks:
                break
            self.swapped.popleft()
            out.blocks_to_swap_in.update(bm.swap_in(seq.seq_id))
            bm.append_slot(seq.seq_id, seq.token_ids[-1])     # fresh blocks: never a copy
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, 1))
            budget -= 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            tokens = seq.token_ids
            if not bm.can_allocate(tokens):
                break
            cached = bm.num_prefix_hit_tokens(tokens)
            n = min(len(tokens) - cached, self.config.chunk_size)
            if n > budget:
                if not self.config.enable_chunked_prefill:
                    break                                       # a whole prompt or nothing
                n = budget
            self.waiting.popleft()
            seq.num_prefix_hit_tokens = seq.num_computed_tokens = bm.allocate(seq.seq_id, tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        bm = self.block_manager
        seq.num_preemptions += 1
        out.preempted.append(seq.seq_id)
        decoding = seq.output_ids and seq.num_computed_tokens == bm.num_slots(seq.seq_id)
        if self.config.preemption_mode == "swap" and decoding and bm.can_swap_out(seq.seq_id):
            out.blocks_to_swap_out.extend(bm.swap_out(seq.seq_id).items())
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)                        # victims go youngest first: oldest ends in front
        else:                                                   # recompute later from scratch
            bm.free(seq.seq_id)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def on_step_done(self, out: SchedulerOutput) -> None:
        """After the forward: count the computed tokens and let the block manager cache full blocks."""
        for item in out.scheduled:
            item.seq.num_computed_tokens = item.start + item.num_new_tokens
            self.block_manager.mark_computed(item.seq.seq_id, item.seq.num_computed_tokens)
