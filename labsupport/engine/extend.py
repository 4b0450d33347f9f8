"""Feeding new tokens of several sequences through the paged cache in one forward.

The engine's ``step`` does this through the scheduler; speculative decoding (draft, verify, a
token tree, an early-exit draft) and the logits tests need it directly. It is the one way to
do so: reserve slots in the block manager, copy what copy-on-write asks, run the model runner
over the block tables, mark the tokens computed.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from ..validation import check_token_ids
from .block_manager import BlockManager
from .model_runner import ModelRunner


def extend(runner: ModelRunner, block_manager: BlockManager, new_tokens: Mapping[Hashable, Sequence[int]],
           all_logits: bool = True, *, tree_parents: Mapping[Hashable, Sequence[int] | None] | None = None,
           num_layers: int | None = None,
           return_hidden: bool = False) -> dict[Hashable, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """Feed ``{seq_id: [token ids]}`` to the runner in one forward; ``{seq_id: logits (k, vocab)}``.

    A sequence the block manager does not know is allocated (its tokens are its prompt;
    prefix-cache hits are skipped and get no row). Copy-on-write pairs are copied first, and
    the computed tokens are marked computed afterwards.

    Args:
        runner, block_manager: the model's runner and the block manager of its pool.
        new_tokens: each sequence's new tokens (a prompt, a decode token, ``[last, drafts…]``).
        all_logits: a row for every new token (else only each sequence's last).
        tree_parents: ``{seq_id: parents}`` for sequences whose new tokens form a token tree
            (parents index the new tokens, ``-1`` = the cached prefix); others are causal chains.
        num_layers: run only the first blocks (a self-speculative draft), then ``ln_f`` + LM head.
        return_hidden: return ``(hidden after ln_f, logits)`` per sequence instead of the logits.

    Raises:
        TypeError / ValueError: ids that are not token ids of the vocabulary, an empty list, or
            a sequence longer than the model's ``n_positions`` (checked before anything changes).
        NoFreeBlocksError: the pool cannot hold the new tokens.
    """
    for seq_id, ids in new_tokens.items():                                  # check everything before reserving
        ids = check_token_ids(f"new_tokens[{seq_id!r}]", ids, runner.vocab_size)
        end = (block_manager.num_slots(seq_id) if block_manager.has_seq(seq_id) else 0) + len(ids)
        if end > runner.max_positions:
            raise ValueError(f"positions must be < n_positions={runner.max_positions}, "
                             f"got sequence {seq_id!r} of {end} tokens")
    seqs, tokens, starts = [], [], []
    for seq_id, ids in new_tokens.items():
        ids = [int(t) for t in ids]
        start, copies = block_manager.reserve(seq_id, ids)
        runner.copy_blocks(copies)
        todo = block_manager.num_slots(seq_id) - start                     # prefix hits are not recomputed
        seqs.append(seq_id)
        tokens.append(ids[len(ids) - todo:])
        starts.append(start)
    parents = None if not tree_parents else [tree_parents.get(s) for s in seqs]
    rows = runner.extend(tokens, starts, [block_manager.block_table(s) for s in seqs], all_logits=all_logits,
                         tree_parents=parents, num_layers=num_layers, return_hidden=return_hidden)
    for seq_id in seqs:
        block_manager.mark_computed(seq_id, block_manager.num_slots(seq_id))
    return dict(zip(seqs, rows))
