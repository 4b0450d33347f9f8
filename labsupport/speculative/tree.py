"""Token trees: many candidate continuations verified by the target in one forward.

SpecInfer (Miao et al. 2024) and Medusa (Cai et al. 2024) verify a *tree* of candidates
instead of one chain: node 0 is the pending token (the last committed one, not yet in the
KV cache), every other node a candidate token whose parent is an earlier node. One target
forward over all nodes (:func:`~labsupport.engine.extend.extend` with ``tree_parents``: the tree
attention mask of :func:`~labsupport.engine.attention.build_metadata` — a node sees the prefix
and its ancestors only; its position id is ``start + depth``), gives the target's logits after
every node. Greedy acceptance walks from the root, each step to the child holding the
target's arg-max — the longest path the target agrees with, token-identical to greedy
decoding. The accepted nodes' keys and values sit in slots ``start + node`` of the paged
cache; :func:`compact_kv` moves them to ``start + depth`` before the rejected slots are
given back (``BlockManager.truncate``).

A *static* tree shape is Medusa's "tree choices": a list of paths of top-k ranks, e.g.
``(0,)`` = head 1's best token, ``(1, 0)`` = head 1's second, then head 2's best.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import product

import torch

from ..engine.attention import tree_ancestors
from ..engine.block_manager import BlockManager
from ..engine.model_runner import ModelRunner
from ..validation import check_int

__all__ = ["TokenTree", "accept_greedy_path", "chain_tree", "choices_from_widths", "compact_kv",
           "dense_tree_reference", "tree_ancestors", "tree_from_choices"]


@dataclass
class TokenTree:
    """A token tree: ``tokens[0]`` is the root (pending token), ``parents[0] == -1``,
    ``parents[i] < i`` for the others. ``depths[i]`` = distance from the root."""

    tokens: list[int]
    parents: list[int]

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.tokens or self.parents[0] != -1:
            raise ValueError(f"a token tree needs a root (parent -1) and one parent per token, got "
                             f"{len(self.tokens)} tokens, parents {self.parents[:4]}…")
        self.depths = [0] * len(self.tokens)
        for i, p in enumerate(self.parents[1:], 1):
            if not 0 <= p < i:
                raise ValueError(f"parents[{i}] must be an earlier node in [0, {i}), got {p}")
            self.depths[i] = self.depths[p] + 1

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root to ``node`` (both included)."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]


def chain_tree(root: int, tokens: Sequence[int]) -> TokenTree:
    """A chain (the ordinary draft of γ tokens) as a tree: every node the child of the one before."""
    return TokenTree([int(root), *map(int, tokens)], list(range(-1, len(tokens))))


def choices_from_widths(widths: Sequence[int]) -> list[tuple[int, ...]]:
    """The full tree of top-``widths[d]`` choices at every depth: ``(2, 1)`` → (0,), (1,), (0,0), (1,0).

    Raises:
        ValueError: an empty shape or a width < 1.
    """
    if not widths:
        raise ValueError("widths must name at least one depth, got ()")
    for d, w in enumerate(widths):
        check_int(f"widths[{d}]", w, 1)
    out = []
    for depth in range(1, len(widths) + 1):
        out.extend(product(*(range(w) for w in widths[:depth])))
    return out


def tree_from_choices(root: int, topk: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> TokenTree:
    """Medusa's static tree: node for path ``c`` holds ``topk[len(c)-1][c[-1]]`` (head ``len(c)``'s
    rank-``c[-1]`` token) under the node of ``c[:-1]``.

    Args:
        root: the pending token. topk: per head, its candidate tokens best first.
        choices: paths of ranks, parents before children (``choices_from_widths`` order).

    Raises:
        ValueError: a path whose parent path is missing or that needs a head / rank ``topk`` lacks.
    """
    index = {(): 0}
    tokens, parents = [int(root)], [-1]
    for c in map(tuple, choices):
        if c[:-1] not in index:
            raise ValueError(f"tree choice {c} comes before its parent {c[:-1]}")
        if len(c) > len(topk) or c[-1] >= len(topk[len(c) - 1]):
            raise ValueError(f"tree choice {c} needs head {len(c)} rank {c[-1]}; "
                             f"have {len(topk)} heads with {[len(t) for t in topk]} candidates")
        index[c] = len(tokens)
        tokens.append(int(topk[len(c) - 1][c[-1]]))
        parents.append(index[c[:-1]])
    return TokenTree(tokens, parents)


def accept_greedy_path(tree: TokenTree, target_argmax: Sequence[int]) -> tuple[list[int], int]:
    """The longest root path the target agrees with, and the target's next token after it.

    Args:
        tree: the verified tree. target_argmax: ``(len(tree),)`` the target's arg-max after each node.

    Returns:
        ``(path, next_token)``: the accepted nodes (root excluded) and the arg-max after the last.
    """
    node, path = 0, []
    while True:
        nxt = [c for c in tree.children(node) if tree.tokens[c] == target_argmax[node]]
        if not nxt:
            return path, int(target_argmax[node])
        node = nxt[0]
        path.append(node)


@torch.inference_mode()
def compact_kv(runner: ModelRunner, block_manager: BlockManager, seq_id: Hashable, start: int,
               path: Sequence[int]) -> None:
    """Move the accepted nodes' K/V (every layer) from slot ``start + node`` to ``start + depth``.

    ``path`` is the accepted nodes in root-to-leaf order (root excluded; node indices grow
    along a path, so no destination overwrites a source still to be read — and the copy reads
    all sources first anyway). Call before ``block_manager.truncate(seq_id, start + 1 + len(path))``.
    """
    moves = [(start + node, start + depth) for depth, node in enumerate(path, 1) if node != depth]
    if not moves:
        return
    src = block_manager.slot_mapping(seq_id, [s for s, _ in moves])
    dst = block_manager.slot_mapping(seq_id, [d for _, d in moves])
    runner.move_slots(src, dst)


def dense_tree_reference(parents: Sequence[int], prefix_len: int) -> torch.Tensor:
    """The tree mask the slow way, for tests: ``(q, prefix_len + q)`` bool, query ``i`` sees key ``j``
    iff ``j`` is in the prefix or node ``j − prefix_len`` lies on ``i``'s root path (a dense causal
    mask over the flattened path of every node)."""
    q = len(parents)
    out = torch.zeros(q, prefix_len + q, dtype=torch.bool)
    for i in range(q):
        out[i, :prefix_len] = True
        node = i
        while node >= 0:
            out[i, prefix_len + node] = True
            node = parents[node]
    return out
