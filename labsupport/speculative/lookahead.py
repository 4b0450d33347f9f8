"""Lookahead decoding: Jacobi iteration fills an n-gram pool that the target verifies.

Fu et al., "Break the Sequential Dependency of LLM Inference Using Lookahead Decoding"
(ICML 2024); Jacobi decoding (Santilli et al. 2023). Greedy decoding is the fixed point of
``y_{j} = argmax p(· | prefix, y_<j)`` over a window of future positions: guess all of them,
run the target once over the guesses, replace every guess by the target's arg-max after
its predecessor, repeat. A guess that happens to be right is a free token; the trajectories
also produce n-grams that often recur later (the *pool*).

Jacobi's defining property: started from any guess, after at most ``W`` iterations the window
*is* the greedy continuation — each iteration fixes at least its first wrong position, because
the target's arg-max after a correct prefix is the correct next token. Lookahead keeps the
trajectories' n-grams and verifies the ones that start with the pending token.

Ours, in one tree forward per round (:mod:`.tree`): under the pending token hang (a) the
pool's n-grams that start with it and (b) the Jacobi window as a chain. The greedy path the
target agrees with is accepted — token-identical to greedy decoding — and the window moves
on by the tokens emitted, refined by the target's arg-max at every window node. This is a
simplification of the paper: one Jacobi level (the paper keeps ``N − 1`` levels of the window
in a 2-D branch), and the pool also learns the committed text's own n-grams (like prompt
lookup), so its gain is part Jacobi, part lookup (the chapter separates the two).
Sampling uses the best pool candidate as a deterministic chain (``q`` one-hot), exact.
"""

from __future__ import annotations

import time

from ..sampling import greedy_ids
from ..validation import check_int
from .proposers import Proposer
from .rounds import Draft

__all__ = ["LookaheadProposer"]


class LookaheadProposer(Proposer):
    """Jacobi window + n-gram pool, verified as one token tree.

    Args:
        window: W, future positions guessed by Jacobi iteration (≥ 1).
        ngram: N, length of the pool's n-grams (key + N − 1 tokens, ≥ 2).
        max_candidates: G, pool n-grams verified per round (≥ 0).
        pool_size: n-grams kept per key token (most recent first).

    Raises:
        TypeError / ValueError: a size out of range.
    """

    name = "lookahead"
    needs_paged_target = True

    def __init__(self, window: int = 4, ngram: int = 4, max_candidates: int = 3, pool_size: int = 8):
        self.window = check_int("window", window, 1)
        self.ngram = check_int("ngram", ngram, 2)
        self.max_candidates = check_int("max_candidates", max_candidates, 0)
        self.pool_size = check_int("pool_size", pool_size, 1)
        super().__init__(max(self.window, self.ngram - 1))           # γ: the tree's depth
        self.seconds = 0.0

    @property
    def max_draft_tokens(self) -> int:
        return self.window + self.max_candidates * (self.ngram - 1)

    def start(self, engine, seqs) -> None:
        for s in seqs:
            s.state["pool"] = {}
            s.state["window"] = (list(s.prompt_ids[-self.window:]) * self.window)[:self.window]   # any guess
            s.state["pooled_upto"] = 0
            self._learn_text(s)

    def _add(self, pool: dict, key: int, cont: tuple[int, ...]) -> None:
        grams = pool.setdefault(key, [])
        if cont in grams:
            grams.remove(cont)
        grams.insert(0, cont)
        del grams[self.pool_size:]

    def _learn_text(self, s) -> None:
        """n-grams of the committed text not pooled yet."""
        seq, n = s.token_ids, self.ngram
        for i in range(max(0, s.state["pooled_upto"] - n), len(seq) - n + 1):
            self._add(s.state["pool"], seq[i], tuple(seq[i + 1:i + n]))
        s.state["pooled_upto"] = len(seq)

    def propose(self, engine, seqs) -> dict[str, Draft]:
        t0 = time.perf_counter()
        out = {}
        for s in seqs:
            root = s.token_ids[-1]
            cands = s.state["pool"].get(root, [])[:self.max_candidates]
            if not s.params.greedy:
                out[s.request_id] = Draft(list(cands[0]) if cands else [], None, None)
                continue
            tokens, parents, children = [root], [-1], {}
            window_nodes = []
            for chain, is_window in [(c, False) for c in cands] + [(s.state["window"], True)]:
                node = 0
                for t in chain:                          # a trie: shared prefixes share nodes
                    key = (node, int(t))
                    if key not in children:
                        children[key] = len(tokens)
                        tokens.append(int(t))
                        parents.append(node)
                    node = children[key]
                    if is_window:
                        window_nodes.append(node)
            s.state["window_nodes"] = window_nodes
            out[s.request_id] = Draft(tokens[1:], parents)
        self.seconds += time.perf_counter() - t0
        return out

    def observe(self, engine, s, draft, path, hidden, logits) -> None:
        """Jacobi update of the window and new n-grams from the target's arg-max along it."""
        top = greedy_ids(logits).tolist()
        nodes = s.state.get("window_nodes") if draft.parents is not None else None
        emitted = len(s.rounds[-1].emitted)
        if nodes and len(nodes) == self.window and max(nodes) < len(top):
            refined = [top[0]] + [top[i] for i in nodes]              # y_0..y_W: the target after root, w_1..w_W
            for j in range(len(refined) - self.ngram + 1):
                self._add(s.state["pool"], refined[j], tuple(refined[j + 1:j + self.ngram]))
            nxt = refined[emitted:emitted + self.window]
        else:
            nxt = s.state["window"][emitted:]
        s.state["window"] = (nxt + [s.token_ids[-1]] * self.window)[:self.window]
        self._learn_text(s)
