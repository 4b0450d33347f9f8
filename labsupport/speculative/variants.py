"""One paged engine for the speculative variants whose draft costs almost nothing.

:class:`VariantEngine` runs a batch of requests over the target's paged KV cache; each round:

1. the *proposer* drafts for every sequence — a chain (γ tokens, with ``q`` when sampling) or,
   for plain greedy, a token tree (:mod:`.tree`);
2. the target verifies every sequence's ``[last, candidates…]`` in **one** forward
   (:func:`~labsupport.speculative.tree.tree_forward`, tree attention mask where needed);
3. a chain is verified with :func:`~labsupport.speculative.rounds.verify_round` (the exact
   rejection rule of Leviathan et al. 2023), a tree by the longest greedy path
   (:func:`~labsupport.speculative.tree.accept_greedy_path`); tokens are committed under the
   request's :class:`~labsupport.stopping.StopRule` (:func:`commit_round`);
4. the accepted tree nodes' KV is compacted into place (:func:`compact_kv`) and the rest of
   the round's slots are given back (``BlockManager.truncate``);
5. the proposer sees the round's hidden states and logits (Medusa keeps the last accepted
   hidden state, lookahead updates its Jacobi window and n-gram pool).

Proposers: ``None`` (plain decoding through the same code — the fair baseline),
:class:`~.self_spec.SelfSpecProposer`, :class:`~.medusa_proposer.MedusaProposer`,
:class:`~.lookahead.LookaheadProposer`. A :class:`~.policy.SpecPolicy` switches drafting off
when the batch is large (vLLM and SGLang do the same under load).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..engine.block_manager import BlockManager
from ..engine.model_runner import ModelRunner
from ..generation import _prompt_ids
from ..models import LoadedModel
from ..sampling import GREEDY, SamplingParams
from ..stopping import StopRule, eos_ids_of
from ..validation import check_int
from .proposers import Proposal
from .rounds import RoundRecord, commit_round, verify_round
from .stats import SpecStats
from .tree import TokenTree, accept_greedy_path, compact_kv, tree_forward

__all__ = ["Draft", "VariantEngine", "VariantOutput", "VariantSeq"]


@dataclass
class Draft:
    """One sequence's candidates for a round (the root — the pending token — excluded).

    ``parents`` over ``[root] + tokens`` make it a tree (greedy only); ``None`` = a chain, with
    ``q (k, V)`` the distributions the tokens were drawn from (``None`` = deterministic)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] | None = None
    q: torch.Tensor | None = None


@dataclass
class VariantSeq:
    """A running request. ``state`` belongs to the proposer (hidden state, window, pool …)."""

    rid: str
    prompt_ids: list[int]
    max_new: int
    params: SamplingParams
    generator: torch.Generator
    rule: StopRule
    stats: SpecStats
    seq: list[int]
    new: list[int] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    trees: list[tuple[TokenTree, list[int]]] = field(default_factory=list)
    state: dict = field(default_factory=dict)
    finish: str | None = None


@dataclass
class VariantOutput:
    """A finished request (as ``SpecRequestOutput``) plus the verified trees and accepted paths."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    rounds: list[RoundRecord]
    stats: SpecStats
    trees: list[tuple[TokenTree, list[int]]]


class VariantEngine:
    """Batched draft–verify decoding with a cheap proposer over the target's paged KV cache.

    Args:
        target: a GPT-2-family target. proposer: ``None`` (plain decoding) or a proposer
            (``name``, ``depth``, ``start(engine, seq)``, ``propose(engine, seqs)``,
            ``observe(engine, seq, draft, hidden, logits, last_node)``).
        block_size, num_blocks: the paged pool. max_num_seqs: batch limit.
        policy: a :class:`~.policy.SpecPolicy` (default: always speculate).
        seed: base seed of the per-request generators.
        keep_trees: record every round's tree and accepted path (for the chapter's panel).

    Attributes:
        draft_seconds, target_seconds: time drafting / verifying since construction.
        num_rounds: verification forwards. speculative_rounds: rounds the policy let draft.
        num_verified_tokens: tokens fed to verification forwards (roots included), all sequences.

    Raises:
        TypeError / ValueError: a size out of range.
    """

    def __init__(self, target: LoadedModel, proposer=None, *, block_size: int = 16, num_blocks: int = 256,
                 max_num_seqs: int = 16, policy=None, seed: int = 0, keep_trees: bool = False):
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        self.target, self.proposer, self.policy, self.seed = target, proposer, policy, seed
        self.keep_trees = bool(keep_trees)
        self.runner = ModelRunner(target, block_size, num_blocks)
        self.block_manager = BlockManager(num_blocks, block_size)
        model = target.model
        self.eos_token_ids = eos_ids_of(getattr(model.config, "eos_token_id", None),
                                        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                                        target.eos_token_id)
        self.draft_seconds = self.target_seconds = 0.0
        self.num_rounds = self.speculative_rounds = self.num_verified_tokens = 0

    @property
    def depth(self) -> int:
        return int(getattr(self.proposer, "depth", 0))

    @torch.no_grad()
    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams = GREEDY,
                 max_new_tokens: int | None = None) -> list[VariantOutput]:
        """Run every prompt to its end (batches of ``max_num_seqs``); outputs in prompt order.

        Raises:
            TypeError: ``max_new_tokens`` not an integer.
            ValueError: an empty prompt, ids outside the vocabulary, ``max_new_tokens < 1``, or a
                request longer than the model's positions.
        """
        max_new = check_int("max_new_tokens", params.max_tokens if max_new_tokens is None else max_new_tokens, 1)
        seqs = []
        for i, prompt in enumerate(prompts):
            ids = _prompt_ids(self.target, prompt)
            if len(ids) + max_new + self.depth + 1 > self.runner.max_positions:
                raise ValueError(f"prompt {i}: {len(ids)} + max_new_tokens {max_new} + tree depth {self.depth} "
                                 f"exceeds n_positions={self.runner.max_positions}")
            seed = params.seed if params.seed is not None else self.seed + i
            gen = torch.Generator(device=self.target.device).manual_seed(seed)
            seqs.append(VariantSeq(str(i), ids, max_new, params, gen, StopRule.from_params(params, self.eos_token_ids,
                                   max_new), SpecStats(gamma=max(1, self.depth)), list(ids)))
        done = {}
        for b in range(0, len(seqs), self.max_num_seqs):
            running = seqs[b:b + self.max_num_seqs]
            self._prefill(running)
            while running:
                self._round(running)
                for s in [r for r in running if r.finish]:
                    self.block_manager.free(s.rid)
                    running.remove(s)
                    done[s.rid] = VariantOutput(s.rid, s.prompt_ids, list(s.new),
                                                s.rule.text(s.new, s.finish, self.target.decode), s.finish,
                                                s.rounds, s.stats, s.trees)
        return [done[str(i)] for i in range(len(prompts))]

    def _prefill(self, seqs: list[VariantSeq]) -> None:
        """Every prompt but its last token into the cache; ``state["prefill_hidden"]`` is the hidden
        state after the last of them (Medusa's heads draft from it in the first round)."""
        todo = {s.rid: (s.prompt_ids[:-1], None) for s in seqs if len(s.prompt_ids) > 1}
        out = tree_forward(self.runner, self.block_manager, todo) if todo else {}
        for s in seqs:
            s.state["prefill_hidden"] = out[s.rid][0][-1] if s.rid in out else None
            if self.proposer is not None:
                self.proposer.start(self, s)

    def _round(self, seqs: list[VariantSeq]) -> None:
        t0 = time.perf_counter()
        speculate = self.proposer is not None and (self.policy is None or self.policy.speculate(len(seqs)))
        drafts = self.proposer.propose(self, seqs) if speculate else {}
        drafts = {s.rid: drafts.get(s.rid, Draft()) for s in seqs}
        for s in seqs:                                   # never draft past max_tokens (a round emits ≥ 1)
            d, room = drafts[s.rid], s.max_new - len(s.new) - 1
            if d.parents is None and len(d.tokens) > room:
                d.tokens, d.q = d.tokens[:room], None if d.q is None else d.q[:room]
            elif d.parents is not None:
                tree = TokenTree([s.seq[-1], *d.tokens], d.parents)
                keep = [i for i in range(1, len(tree)) if tree.depths[i] <= room]
                d.tokens = [tree.tokens[i] for i in keep]
                where = {i: j + 1 for j, i in enumerate(keep)}
                d.parents = [-1] + [where.get(tree.parents[i], 0) for i in keep]
        t1 = time.perf_counter()
        self.draft_seconds += t1 - t0
        self.speculative_rounds += int(speculate)
        bm = self.block_manager
        feeds = {s.rid: ([s.seq[-1], *drafts[s.rid].tokens], drafts[s.rid].parents) for s in seqs}
        out = tree_forward(self.runner, bm, feeds)
        self.num_rounds += 1
        self.num_verified_tokens += sum(len(ids) for ids, _ in feeds.values())
        for s in seqs:
            d, (hidden, logits) = drafts[s.rid], out[s.rid]
            before = len(s.seq)
            if d.parents is None:
                rec = verify_round(logits, Proposal(d.tokens, d.q), s.seq, s.params, s.generator)
                path, tree = list(range(1, rec.num_accepted + 1)), None
            else:
                tree = TokenTree([s.seq[-1], *d.tokens], d.parents)
                top = logits.argmax(-1).tolist()
                path, nxt = accept_greedy_path(tree, top)
                last = path[-1] if path else 0
                shown = [tree.tokens[i] for i in path] + [tree.tokens[c] for c in tree.children(last)[:1]]
                hit = [1.0] * len(path) + [0.0] * (len(shown) - len(path))
                rec = RoundRecord(position=before, draft_tokens=shown, num_accepted=len(path), next_token=nxt,
                                  bonus=len(shown) == len(path) and bool(path), emitted=[], accept_prob=hit,
                                  overlap=hit, target_argmax=[top[0], *(top[i] for i in path)])
                if self.keep_trees:
                    s.trees.append((tree, path))
            s.finish = commit_round(rec, s.seq, s.new, s.rule, self.target.decode)
            s.rounds.append(rec)
            s.stats.add(rec)
            s.stats.target_forwards += 1
            if tree is not None:
                compact_kv(self.runner, bm, s.rid, before - 1, path)
            bm.truncate(s.rid, before + rec.num_accepted)
            if self.proposer is not None and not s.finish:
                self.proposer.observe(self, s, d, hidden, logits, path[-1] if path else 0)
        self.target_seconds += time.perf_counter() - t1
