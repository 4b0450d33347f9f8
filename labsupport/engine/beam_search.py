"""Beam search on the paged engine (vLLM's ``LLM.beam_search``): the beams of a request share
the prompt's physical blocks by reference count and fork with copy-on-write when they diverge.

Each step feeds one token per live beam through the model runner over the shared KV (no
recomputation of the prefix, unlike :func:`labsupport.beam.beam_search`, which re-runs the
whole sequence), then :class:`~labsupport.beam.BeamSearcher` — the same selection rules as the
plain search, so the two agree token for token — picks the beams that continue. A beam that
continues from beam ``b`` is a *fork* of ``b``'s sequence (every block's ref count +1, no copy);
the first token written into a shared, partly filled last block copies that block first.
Several prompts are searched at once, their beams batched into one forward per step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..beam import BeamSearcher, BeamSearchResult, _validate
from ..generation import max_new_tokens_for, prompt_token_ids
from ..kv import blocks_needed
from ..models import LoadedModel
from ..validation import check_int
from .block_manager import BlockManager
from .extend import extend
from .model_runner import ModelRunner


@dataclass
class BlockSharing:
    """Blocks held at one step of a paged beam search, shared vs as private copies.

    Attributes:
        step: tokens generated so far.
        used_blocks: physical blocks held by all live beams (shared blocks counted once).
        private_blocks: blocks the same beams would hold with a private copy each.
        block_tables: ``{beam sequence id: block table}`` of the live beams.
    """

    step: int
    used_blocks: int
    private_blocks: int
    block_tables: dict[str, list[int]] = field(default_factory=dict)

    @property
    def saved_fraction(self) -> float:
        return 1.0 - self.used_blocks / self.private_blocks if self.private_blocks else 0.0


@dataclass
class PagedBeamResult:
    """The results of :func:`paged_beam_search`: one :class:`BeamSearchResult` per prompt, and
    the block sharing of the live beams after each step (all prompts together)."""

    results: list[BeamSearchResult]
    sharing: list[BlockSharing]


@torch.no_grad()
def paged_beam_search(lm: LoadedModel, prompts: Sequence[str | Sequence[int]], beam_width: int = 4, *,
                      max_new_tokens: int = 16, length_penalty: float = 1.0, early_stopping: bool | str = False,
                      num_return_sequences: int = 1, ignore_eos: bool = False, block_size: int = 16,
                      num_blocks: int | None = None) -> PagedBeamResult:
    """Beam search for every prompt at once over one paged KV pool.

    Args:
        lm: a loaded GPT-2-family model.
        prompts: texts or token id lists.
        beam_width, max_new_tokens, length_penalty, early_stopping, num_return_sequences,
            ignore_eos: as :func:`labsupport.beam.beam_search`.
        block_size: token slots per KV block.
        num_blocks: pool size; default enough for every beam of every prompt at full length (twice over).
            At least ``Σ_prompts beam_width · ⌈(prompt + max_new_tokens) / block_size⌉``: the most
            a search can hold at once (beams share blocks, so it often holds fewer).

    Returns:
        a :class:`PagedBeamResult`; each result equals ``beam_search`` on that prompt.

    Raises:
        TypeError / ValueError: as ``beam_search``; an empty list of prompts; ``num_blocks`` below
            that least size (checked before anything runs).
    """
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of prompts, got {prompts!r}")
    vocab = int(lm.model.config.vocab_size)
    _validate(beam_width, max_new_tokens, length_penalty, early_stopping, num_return_sequences, vocab)
    rows = [prompt_token_ids(lm, p) for p in prompts]
    ends = frozenset() if ignore_eos else lm.eos_token_ids
    searches = [BeamSearcher(lm, ids, beam_width, max_new_tokens_for(lm, len(ids), max_new_tokens), length_penalty,
                             early_stopping, ends) for ids in rows]          # the one context-window rule
    block_size = check_int("block_size", block_size, 1)
    # every live beam holding its own blocks at full length: the most a search can ever hold at once
    least = sum(beam_width * blocks_needed(len(r) + s.max_new_tokens, block_size) for r, s in zip(rows, searches))
    if num_blocks is None:
        per_beam = blocks_needed(max(len(r) + s.max_new_tokens for r, s in zip(rows, searches)), block_size) + 1
        num_blocks = len(rows) * (2 * beam_width) * per_beam
    elif check_int("num_blocks", num_blocks, 1) < least:
        raise ValueError(f"num_blocks must be at least {least} for these prompts (beam_width {beam_width} beams of "
                         f"prompt + max_new_tokens tokens each, in blocks of {block_size}), got {num_blocks}")
    bm = BlockManager(num_blocks, block_size)
    runner = ModelRunner(lm, block_size, num_blocks)
    start = time.perf_counter()
    beams: list[list[str]] = [[f"{p}:0"] for p in range(len(rows))]    # sequence id of each live beam
    feed = {f"{p}:0": ids for p, ids in enumerate(rows)}               # first step: the prompts (prefill)
    calls = [0] * len(rows)
    forwards = [0] * len(rows)
    sharing: list[BlockSharing] = []
    while feed:
        logits = extend(runner, bm, feed, all_logits=False)              # {seq id: (1, vocab)}
        if any(calls):                                                  # after a decode step: blocks held
            private = sum(bm.blocks_needed(bm.num_slots(s)) for s in feed)
            sharing.append(BlockSharing(step=max(s.steps for s in searches), used_blocks=bm.num_used_blocks,
                                        private_blocks=private, block_tables={s: bm.block_table(s) for s in feed}))
        next_feed: dict[str, list[int]] = {}
        for p, search in enumerate(searches):
            if search.done:
                continue
            calls[p] += 1
            forwards[p] += sum(len(feed[s]) for s in beams[p])
            search.step(torch.log_softmax(torch.cat([logits[s] for s in beams[p]]), dim=-1))
            old = beams[p]
            beams[p] = []
            for (node_id, gen), parent in zip(search.live, search.parents):
                child = f"{p}:{node_id}"
                bm.fork(old[parent], child)                              # share every block, no copy
                beams[p].append(child)
                if not search.done:
                    next_feed[child] = [gen[-1]]                        # its newest token: copy-on-write
            for seq_id in old:
                bm.free(seq_id)
            if search.done:
                for seq_id in beams[p]:
                    bm.free(seq_id)
                beams[p] = []
        feed = next_feed
    seconds = time.perf_counter() - start
    bm.audit()
    results = [s.result(num_return_sequences, calls[p], forwards[p], seconds) for p, s in enumerate(searches)]
    return PagedBeamResult(results=results, sharing=sharing)
