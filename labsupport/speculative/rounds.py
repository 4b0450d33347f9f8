"""One draft-verify round of one sequence: what a proposer drafts, how the target's logits judge
it, and how the accepted tokens are committed — the one round tail of every speculative path.

Both paths — :func:`~labsupport.speculative.decode.speculative_generate` over a Hugging Face
cache and :class:`~labsupport.speculative.engine.SpeculativeEngine` over the paged cache —
keep a :class:`SpecSequence` per request, clip the proposer's :class:`Draft` to what the
request may still emit (:func:`clip_draft`), run the target once over ``[last, draft…]`` and
call :func:`finish_round`: :func:`verify_draft` (the exact rejection rule for a chain, the
longest agreeing greedy path for a token tree) and :func:`commit_round` (append the tokens
under the request's :class:`~labsupport.stopping.StopRule`, advance its grammar).

Every ``SamplingParams`` field takes part: penalties and ``min_tokens`` see each row's own
history, a structured-output grammar masks every verified row (a draft token outside the
grammar has target probability 0 and is rejected), stop ids, stop strings and ``max_tokens``
cut the committed block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..engine.sequence import Sequence
from ..sampling import greedy_ids, penalise, probs_from_logits
from .rejection import verify
from .stats import RoundRecord, SpecStats
from .tree import TokenTree, accept_greedy_path

__all__ = ["Draft", "RoundRecord", "SpecSequence", "clip_draft", "commit_round", "draft_distribution",
           "finish_round", "verify_draft"]


@dataclass
class Draft:
    """One sequence's candidates for a round (the root — the pending last token — excluded).

    Attributes:
        tokens: the drafted ids: a chain ``d_1..d_k`` (k ≤ γ), or the nodes of a token tree.
        parents: ``None`` for a chain; for a tree the parent of each node over ``[root] + tokens``
            (``parents[0] == -1``; greedy decoding only).
        q: ``(k, V)`` the distributions a sampled chain was drawn from; ``None`` = deterministic
            (``q`` one-hot: n-gram lookup, greedy drafts).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] | None = None
    q: torch.Tensor | None = None


@dataclass(eq=False)
class SpecSequence:
    """A request's speculative state, attached to its engine :class:`~labsupport.engine.sequence.Sequence`
    (which keeps the tokens, settings, stop rule and grammar cursor: read through the properties below).

    Attributes:
        seq: the request (in the engine, the very object its scheduler queues).
        stats: its :class:`SpecStats`.
        rounds: one :class:`RoundRecord` per round.
        trees: ``(tree, accepted path)`` of every tree round (kept when asked, for figures).
        state: the proposer's own per-request state (a hidden state, a Jacobi window, a pool …).
        finish_reason: ``"stop"`` / ``"length"`` once a round ended it, else ``None`` (the engine then
            finishes ``seq`` with it).
    """

    seq: Sequence
    stats: SpecStats
    rounds: list[RoundRecord] = field(default_factory=list)
    trees: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    finish_reason: str | None = None

    request_id = property(lambda self: self.seq.seq_id, doc="The request's id.")
    prompt_ids = property(lambda self: self.seq.prompt_ids, doc="The prompt's token ids.")
    output_ids = property(lambda self: self.seq.output_ids, doc="The tokens committed so far (the sequence's own list).")
    params = property(lambda self: self.seq.params, doc="Its sampling settings.")
    stop_rule = property(lambda self: self.seq.stop_rule, doc="Its stop conditions.")
    generator = property(lambda self: self.seq.generator,
                         doc="The generator of its draws (the request's own or the engine's; ``None``: greedy).")
    max_tokens = property(lambda self: self.seq.max_new_tokens, doc="Most new tokens (cut to the context window).")
    grammar = property(lambda self: self.seq.grammar, doc="Compiled structured output, or ``None``.")

    @property
    def token_ids(self) -> list[int]:
        """Prompt + output (a new list)."""
        return self.seq.token_ids

    @property
    def room(self) -> int:
        """Draft tokens this round may hold along one path: a round emits at least one token of
        its own, so at most ``max_tokens − len(output) − 1`` drafts can still be used."""
        return self.max_tokens - len(self.output_ids) - 1

    def grammar_state(self) -> int:
        """The grammar state after the output so far (the sequence's one
        :class:`~labsupport.structured.cursor.GrammarCursor`)."""
        return self.seq.grammar_state()


def draft_distribution(logits: torch.Tensor, s: SpecSequence, drafted: list[int]) -> torch.Tensor:
    """``q``: the processed distribution ``(V,)`` a proposer draws its next token from, after the
    sequence and the tokens ``drafted`` so far this round — the same processors, history and
    ``min_tokens`` rule the target is verified with."""
    return probs_from_logits(logits.reshape(1, -1), s.params, [s.token_ids + list(drafted)],
                             prompt_lens=len(s.prompt_ids), end_ids=s.stop_rule.end_ids)[0]


def clip_draft(draft: Draft, room: int, root: int, max_tokens: int | None = None,
               max_nodes: int | None = None) -> Draft:
    """The draft cut to ``room`` tokens along any path (a round never drafts what it could not emit)
    and, for a tree, to ``max_nodes`` nodes (every node takes a KV slot while it is verified: near the
    end of the context window a wide tree must shrink; nodes come parents first, so a prefix of them
    is a tree).

    Args:
        draft: the proposer's draft. room: most draft tokens along one path (≥ 0).
        root: the pending token (the tree's node 0).
        max_tokens: the most tokens the proposer said a draft holds (its ``max_draft_tokens``);
            more is a proposer bug.
        max_nodes: most draft tokens (nodes) the cache has slots for this round; None = no limit.

    Raises:
        ValueError: a draft with more tokens than ``max_tokens``, or a malformed tree.
    """
    if max_tokens is not None and len(draft.tokens) > max_tokens:
        raise ValueError(f"the proposer drafted {len(draft.tokens)} tokens but declared max_draft_tokens="
                         f"{max_tokens}")
    room = max(room, 0)
    if draft.parents is None:
        if len(draft.tokens) <= room:
            return draft
        return Draft(draft.tokens[:room], None, None if draft.q is None else draft.q[:room])
    tree = TokenTree([root, *draft.tokens], draft.parents)
    keep = [i for i in range(1, len(tree)) if tree.depths[i] <= room]
    if max_nodes is not None:
        keep = keep[:max(max_nodes, 0)]
    where = {i: j + 1 for j, i in enumerate(keep)}
    return Draft([tree.tokens[i] for i in keep], [-1] + [where.get(tree.parents[i], 0) for i in keep])


def _grammar_masks(s: SpecSequence, paths: list[list[int]], vocab: int) -> torch.Tensor | None:
    """``(rows, V)`` grammar masks: row i allows what may follow the output + ``paths[i]``. A path
    that leaves the grammar keeps its parent's mask (that row is never reached: the token that
    left was masked out one row earlier). A draft token after which the grammar cannot give a mask
    (it raises, e.g. too ambiguous) is masked out in its parent's row the same way."""
    if s.grammar is None:
        return None
    g, base = s.grammar, s.grammar_state()
    rows, states = [], {(): base}
    for path in paths:
        key = tuple(path)
        for j in range(len(key)):
            if key[:j + 1] not in states:
                prev = states[key[:j]]
                try:
                    states[key[:j + 1]] = None if prev is None else g.advance(prev, key[j])
                except ValueError:
                    states[key[:j + 1]] = None
    masks, banned = {}, {}

    def mask_at(key):                                       # the mask after the output + key, or None
        if key not in masks:
            try:
                masks[key] = None if states[key] is None else \
                    g.allowed_token_mask(states[key], s.max_tokens - len(s.output_ids) - len(key))
            except ValueError:                              # a draft state the grammar cannot go on from:
                if not key:                                 # its last token counts as refused one row up
                    raise
                masks[key] = None
                banned.setdefault(key[:-1], []).append(key[-1])
        return masks[key]

    keys = []
    for path in paths:                                      # every mask first, so that every ban is known
        key = tuple(path)
        while mask_at(key) is None:                         # left the grammar: reuse the last valid mask
            key = key[:-1]
        keys.append(key)
    for key in keys:
        row = masks[key]
        if key in banned:
            row = row.clone()
            row[banned[key]] = False
        rows.append(row)
    return torch.stack(rows).reshape(len(paths), vocab)


def verify_draft(logits: torch.Tensor, draft: Draft, s: SpecSequence) -> tuple[RoundRecord, list[int]]:
    """Judge a draft from the target's logits over ``[last, draft…]``.

    A chain is verified with the exact rejection rule (:func:`~.rejection.verify`, Leviathan et
    al. 2023), which keeps the output distributed as the target's sampling; under greedy
    settings a draft token is accepted iff it is the arg-max of the processed target logits.
    A token tree (greedy only) accepts the longest root path whose every node is the processed
    arg-max after its parent (SpecInfer, Miao et al. 2024) — token-identical to greedy.

    Args:
        logits: ``(1 + len(draft.tokens), V)`` float32; row i follows node i (row 0: the root).
        draft: the (clipped) draft. s: the sequence, before the round.

    Returns:
        the round's :class:`RoundRecord` (``emitted`` still empty) and the accepted node indices
        into ``[root] + tokens`` (a chain's ``1..n``).

    Raises:
        ValueError: a token tree with sampling settings (trees are verified greedily only).
    """
    params, k = s.params, len(draft.tokens)
    seq = s.token_ids
    if draft.parents is None:
        paths = [draft.tokens[:i] for i in range(k + 1)]
    else:
        if not params.greedy:
            raise ValueError("a token-tree draft can only be verified greedily (temperature 0); a proposer "
                             "must draft a chain when the request samples")
        tree = TokenTree([seq[-1], *draft.tokens], draft.parents)
        paths = [[tree.tokens[j] for j in tree.path_to(i)[1:]] for i in range(len(tree))]
    allowed = _grammar_masks(s, paths, logits.shape[-1])
    plain = params.is_plain_greedy and allowed is None
    history = None if plain else [seq + p for p in paths]
    top = greedy_ids(logits).tolist()
    if params.greedy:        # p and q one-hot: accept while the draft is the processed arg-max, no randomness
        best = top if plain else greedy_ids(penalise(logits, params, history, len(s.prompt_ids),
                                                     s.stop_rule.end_ids, allowed)).tolist()
        if draft.parents is not None:
            path, nxt = accept_greedy_path(tree, best)
            last = path[-1] if path else 0
            shown = [tree.tokens[i] for i in path] + [tree.tokens[c] for c in tree.children(last)[:1]]
            hit = [1.0] * len(path) + [0.0] * (len(shown) - len(path))
            return RoundRecord(position=len(seq), draft_tokens=shown, num_accepted=len(path), next_token=nxt,
                               bonus=len(shown) == len(path) and bool(path), emitted=[], accept_prob=hit,
                               overlap=hit, target_argmax=[top[0], *(top[i] for i in path)]), path
        hit = [float(draft.tokens[i] == best[i]) for i in range(k)]         # = min(1, p/q) = Σ min(p, q)
        n = hit.index(0.0) if 0.0 in hit else k
        return RoundRecord(position=len(seq), draft_tokens=list(draft.tokens), num_accepted=n, next_token=best[n],
                           bonus=(k > 0 and n == k), emitted=[], accept_prob=hit, overlap=hit,
                           target_argmax=top), list(range(1, n + 1))
    p = probs_from_logits(logits, params, history, prompt_lens=len(s.prompt_ids), end_ids=s.stop_rule.end_ids,
                          allowed=allowed)                                                   # (k+1, V)
    if draft.q is not None:
        q = draft.q.to(p).reshape(k, p.shape[-1])
    else:
        q = torch.nn.functional.one_hot(torch.tensor(draft.tokens, dtype=torch.long, device=p.device),
                                        p.shape[-1]).to(p).reshape(k, p.shape[-1])
    drafts = torch.tensor([draft.tokens], dtype=torch.long, device=p.device).reshape(1, k)
    res = verify(p.unsqueeze(0), q.unsqueeze(0), drafts, s.generator)
    n = int(res.num_accepted[0])
    return RoundRecord(position=len(seq), draft_tokens=list(draft.tokens), num_accepted=n,
                       next_token=int(res.next_token[0]), bonus=(k > 0 and n == k), emitted=[],
                       accept_prob=res.accept_prob[0].tolist(), overlap=torch.minimum(p[:k], q).sum(-1).tolist(),
                       target_argmax=top), list(range(1, n + 1))


def commit_round(rec: RoundRecord, s: SpecSequence, decode: Callable[[list[int]], str]) -> str | None:
    """Append the round's tokens (accepted drafts, then the target's token) and stop where the
    request's rule says (:meth:`StopRule.first_finish`: EOS / stop id, a stop string in the new
    text, ``max_tokens``) — tokens after the stopping point are discarded.

    Args:
        rec: the verified round; ``rec.emitted`` is filled with the tokens kept.
        s: the sequence; its ``output_ids`` grow in place. decode: ids → text, for stop strings.

    Returns:
        ``"stop"``, ``"length"``, or None to go on.
    """
    new = s.output_ids
    start = len(new)
    new.extend(rec.draft_tokens[:rec.num_accepted] + [rec.next_token])
    end, reason = s.stop_rule.first_finish(new, start, decode)
    del new[end:]
    rec.emitted = new[start:]
    return reason


def finish_round(logits: torch.Tensor, draft: Draft, s: SpecSequence,
                 decode: Callable[[list[int]], str], keep_trees: bool = False) -> tuple[RoundRecord, list[int]]:
    """The round tail: verify, commit, count. Sets ``s.finish_reason`` when the request ended.

    Returns:
        the round's record and the accepted node indices (for the cache: which slots to keep).
    """
    root = s.prompt_ids[-1] if not s.output_ids else s.output_ids[-1]
    rec, path = verify_draft(logits, draft, s)
    s.finish_reason = commit_round(rec, s, decode)
    s.rounds.append(rec)
    s.stats.add(rec)
    s.stats.target_forwards += 1
    if keep_trees and draft.parents is not None:
        s.trees.append((TokenTree([root, *draft.tokens], draft.parents), path))
    return rec, path

