"""Suffix decoding: draft what followed the longest matching suffix, weighted by how often it did
(Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications", 2024;
vLLM's ``suffix`` method, with its setting names).

n-gram lookup (:class:`~labsupport.speculative.proposers.NgramProposer`) copies the continuation of
the *latest* earlier match. Suffix decoding counts them all:

* a **suffix trie** holds every substring of a text up to ``max_tree_depth`` tokens, each node with
  the number of times its substring occurred, so a node's children are the continuations seen after
  it and how often (a suffix tree, cut at a depth; built as the text grows, ``O(depth)`` per token);
* one trie per request (its prompt and the tokens it has committed) and one **shared** trie over the
  outputs of the last ``max_cached_requests`` finished requests: agents, code edits and chat turns
  repeat earlier outputs, not only the prompt;
* a draft starts at the **longest** suffix of the text that the trie has seen followed by something
  and grows from there while a path's estimated probability (the product of each step's
  ``count(child) / count(children)``) stays ≥ ``min_token_prob``: the most frequent chain, or (``tree=True``,
  greedy requests in the paged engine) the paper's **tree**, the most probable open node first — several
  continuations where the counts disagree, verified in one tree forward;
* its length **adapts**: at most ``max_spec_factor × match length`` tokens (a long match is strong
  evidence; a one-token match drafts one token), and never more than γ;
* of the request's and the shared trie's drafts, the one with more expected accepted tokens (the sum
  of its path probabilities) wins.

Drafts are deterministic (``q`` one-hot), so verification keeps the target's output exactly, like
every proposer of the one :class:`~labsupport.speculative.engine.SpeculativeEngine`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Sequence

from ..validation import check_bool, check_int, check_real
from .proposers import Proposer
from .rounds import Draft

__all__ = ["SuffixProposer", "SuffixTrie"]


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    """Counts of every substring of up to ``max_depth`` tokens of the texts added to it.

    Args:
        max_depth: longest substring kept (≥ 2): the longest match plus what can be drafted after it.
    """

    def __init__(self, max_depth: int = 24):
        self.max_depth = check_int("max_depth", max_depth, 2)
        self.root = _Node()

    def extend(self, tokens: Sequence[int], open_ends: list | None = None, weight: int = 1) -> list:
        """Add ``tokens`` after a text whose open suffixes are ``open_ends`` (``None``: a new text);
        returns the open suffixes after them, for the next call. ``weight`` −1 takes a text out again."""
        ends = list(open_ends or [])                    # (node, depth) of each suffix shorter than max_depth
        for t in tokens:
            grown = []
            for node, depth in [(self.root, 0), *ends]:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                child.count += weight
                if child.count <= 0:                    # a removed text: drop what no text holds any more
                    del node.children[t]
                elif depth + 1 < self.max_depth:
                    grown.append((child, depth + 1))
            ends = grown
        return ends

    def count(self, tokens: Sequence[int]) -> int:
        """How many times ``tokens`` occurred (0 when never, or longer than ``max_depth``)."""
        node = self._walk(tokens)
        return 0 if node is None else node.count

    def _walk(self, tokens: Sequence[int]) -> _Node | None:
        node = self.root
        for t in tokens:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def draft(self, context: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
              min_token_prob: float = 0.1, tree: bool = False) -> tuple[list[int], list[int] | None, float, int]:
        """``(tokens, parents, score, match length)``: the draft after the longest suffix of ``context`` the trie
        has seen continued, its expected accepted tokens (the sum of its nodes' path probabilities), and the
        match's length. A chain (``parents`` None) follows the most frequent child; a ``tree`` grows best
        first — the most probable open node next, any branch — up to ``max_tokens`` nodes, as the paper's
        speculation tree (``parents`` over ``[root] + tokens``, ``parents[0] == -1``). Either way a path is at
        most ``max_spec_factor × match length`` deep and holds only nodes of path probability ≥ ``min_token_prob``."""
        order = itertools.count()                            # ties between equally likely nodes: first opened first

        def open_children(frontier, parent_node, parent_index, prob, depth):
            total = sum(c.count for c in parent_node.children.values())
            ranked = sorted(parent_node.children.items(), key=lambda kv: (-kv[1].count, kv[0]))
            for token, child in (ranked if tree else ranked[:1]):
                heapq.heappush(frontier, (-prob * child.count / total, next(order), child, parent_index, token,
                                          depth + 1))

        for p in range(min(self.max_depth - 1, len(context)), 0, -1):
            node = self._walk(context[-p:])
            if node is None or not node.children:
                continue
            depth_limit = min(int(max_spec_factor * p), self.max_depth - p)
            tokens, parents, score = [], [-1], 0.0
            frontier = []                                    # (−path probability, order, node, parent index, token, depth)
            if depth_limit >= 1:
                open_children(frontier, node, 0, 1.0, 0)
            while frontier and len(tokens) < max_tokens:
                neg, _, child, parent_index, token, depth = heapq.heappop(frontier)
                if -neg < min_token_prob:
                    break                                    # the best open node is already too unlikely
                tokens.append(token)
                parents.append(parent_index)
                score += -neg
                if depth < depth_limit and child.children:
                    open_children(frontier, child, len(tokens), -neg, depth)
            return tokens, (parents if tree else None), score, p
        return [], None, 0.0, 0


class SuffixProposer(Proposer):
    """Suffix decoding (module docstring): frequency-weighted continuations of the longest matching suffix,
    from the request's own text and from the outputs of earlier requests; adaptive draft length.

    Args:
        num_speculative_tokens: γ, the most draft tokens a round (vLLM sets it to the tree depth).
        max_tree_depth: longest substring the tries keep (vLLM's ``suffix_decoding_max_tree_depth``).
        max_cached_requests: finished requests whose outputs the shared trie keeps, oldest dropped first;
            0 turns the shared trie off (``suffix_decoding_max_cached_requests``).
        max_spec_factor: draft at most this × the match length (``suffix_decoding_max_spec_factor``).
        min_token_prob: stop when the path's estimated probability falls below it
            (``suffix_decoding_min_token_prob``).
        tree: for greedy requests in the paged engine, draft the paper's speculation tree (best-first, up
            to γ nodes, several continuations where the counts disagree), verified in one tree forward.
            Off by default: on this course's CPU the extra nodes cost more to verify than they add in
            accepted tokens (measured: 1.85 against 1.78 tokens per forward on prose, the same on the
            repetitive prompt, at a higher verification cost). Sampled requests always draft the chain.

    Raises:
        TypeError / ValueError: a setting out of range.
    """

    name = "suffix"

    def __init__(self, num_speculative_tokens: int = 8, max_tree_depth: int = 24, max_cached_requests: int = 1000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1, tree: bool = False):
        super().__init__(num_speculative_tokens)
        self.tree = check_bool("tree", tree)
        self.max_tree_depth = check_int("max_tree_depth", max_tree_depth, 2)
        self.max_cached_requests = check_int("max_cached_requests", max_cached_requests, 0)
        self.max_spec_factor = check_real("max_spec_factor", max_spec_factor, 0, low_open=True)
        self.min_token_prob = check_real("min_token_prob", min_token_prob, 0, 1)
        self.shared = SuffixTrie(self.max_tree_depth)
        self._cached: OrderedDict[str, list[int]] = OrderedDict()     # request id → its output in the shared trie
        self.shared_drafts = 0                                          # drafts the shared trie won

    def start(self, engine, seqs) -> None:
        """Index each new request's prompt (prefill-time work: O(prompt × max_tree_depth))."""
        for s in seqs:
            s.state.pop("suffix", None)
            self._own(s, s.token_ids)

    def _own(self, s, tokens: list[int]) -> SuffixTrie:
        """The request's trie (made on first use), brought up to ``tokens``, its committed ones."""
        own = s.state.get("suffix")
        if own is None:
            own = s.state["suffix"] = {"trie": SuffixTrie(self.max_tree_depth), "ends": None, "seen": 0}
        own["ends"] = own["trie"].extend(tokens[own["seen"]:], own["ends"])
        own["seen"] = len(tokens)
        return own["trie"]

    def propose(self, engine, seqs) -> dict[str, Draft]:
        trees = self.tree and getattr(engine, "block_manager", None) is not None    # the paged engine verifies trees
        drafts = {}
        for s in seqs:
            context, budget = s.token_ids, min(self.num_speculative_tokens, max(s.room, 0))
            if budget == 0:
                drafts[s.request_id] = Draft()
                continue
            tree = trees and s.params.greedy                     # token trees are verified greedily only
            args = (context, budget, self.max_spec_factor, self.min_token_prob, tree)
            own = self._own(s, context).draft(*args)
            shared = self.shared.draft(*args) if self._cached else ([], None, 0.0, 0)
            if shared[2] > own[2]:
                self.shared_drafts += 1
                own = shared
            drafts[s.request_id] = Draft(own[0], own[1] if own[0] else None)
        return drafts

    def finish(self, engine, s) -> None:
        """The request's output joins the shared trie; the oldest cached output leaves beyond the limit."""
        s.state.pop("suffix", None)
        if self.max_cached_requests == 0 or not s.output_ids:
            return
        key = f"{id(engine)}:{s.request_id}"
        if key in self._cached:                                         # an id used again: replace its text
            self.shared.extend(self._cached.pop(key), weight=-1)
        self._cached[key] = list(s.output_ids)
        self.shared.extend(self._cached[key])
        while len(self._cached) > self.max_cached_requests:
            self.shared.extend(self._cached.popitem(last=False)[1], weight=-1)
