"""One draft-verify round of one sequence: verify its proposal, commit its tokens.

Both speculative paths — :func:`~labsupport.speculative.decode.speculative_generate` over a
Hugging Face cache and :class:`~labsupport.speculative.engine.SpecDecodeEngine` over the paged
cache — call :func:`verify_round` on the target's logits over ``[last, d_1..d_k]`` and then
:func:`commit_round`, which appends the accepted tokens under the request's
:class:`~labsupport.stopping.StopRule`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..sampling import SamplingParams, penalise, probs_from_logits
from ..stopping import StopRule
from .proposers import Proposal
from .rejection import verify


@dataclass
class RoundRecord:
    """One draft-verify round.

    Attributes:
        position: sequence length when the round started.
        draft_tokens: the proposal (k ≤ γ tokens).
        num_accepted: n, accepted prefix length.
        next_token: the target's own token (replacement at position n, or bonus when n = k).
        bonus: True when all k drafts were accepted (and k ≥ 1).
        emitted: tokens actually appended (stopping rules may cut the block).
        accept_prob: ``min(1, p/q)`` per draft token.
        overlap: ``Σ_x min(p(x), q(x))`` per draft position (= 1 − TV(p, q): the expected
            acceptance there).
        target_argmax: arg-max of the target's raw logits at each of the k+1 positions.
    """

    position: int
    draft_tokens: list[int]
    num_accepted: int
    next_token: int
    bonus: bool
    emitted: list[int]
    accept_prob: list[float]
    overlap: list[float]
    target_argmax: list[int]


def verify_round(logits: torch.Tensor, prop: Proposal, seq: Sequence[int], params: SamplingParams,
                 generator: torch.Generator | None = None, *, prompt_len: int | None = None,
                 end_ids: frozenset[int] = frozenset()) -> RoundRecord:
    """Verify one sequence's proposal from the target's logits over ``[last, d_1..d_k]``.

    Args:
        logits: ``(k+1, V)`` target logits; row i predicts the token after ``d_1..d_i``.
        prop: the :class:`Proposal` (``q`` None = deterministic, one-hot).
        seq: the committed sequence before the round (prompt + output), for the processors.
        params: sampling settings, applied identically to p and q (history per row for the
            penalties).
        prompt_len, end_ids: where the output starts in ``seq`` and the ids ``min_tokens``
            holds back, as :func:`labsupport.sampling.process_logits` takes them.

    Returns:
        A :class:`RoundRecord` (``emitted`` still empty: :func:`commit_round` fills it).
    """
    k = len(prop.tokens)
    history = [list(seq) + prop.tokens[:i] for i in range(k + 1)] if not params.is_plain_greedy else None
    top = logits.argmax(dim=-1).tolist()                                             # (k+1,)
    if params.greedy:               # p and q one-hot: accept while draft == target arg-max, no randomness
        best = top if history is None else penalise(logits, params, history, prompt_len, end_ids).argmax(-1).tolist()
        hit = [float(prop.tokens[i] == best[i]) for i in range(k)]       # = min(1, p/q) = Σ min(p, q)
        n = hit.index(0.0) if 0.0 in hit else k
        return RoundRecord(position=len(seq), draft_tokens=list(prop.tokens), num_accepted=n, next_token=best[n],
                           bonus=(k > 0 and n == k), emitted=[], accept_prob=hit, overlap=hit, target_argmax=top)
    p = probs_from_logits(logits, params, history, prompt_lens=prompt_len, end_ids=end_ids)      # (k+1, V)
    if prop.q is not None:
        q = prop.q.to(p)
    else:
        q = torch.nn.functional.one_hot(torch.tensor(prop.tokens, dtype=torch.long, device=p.device),
                                        p.shape[-1]).to(p)
    q = q.reshape(k, p.shape[-1])
    drafts = torch.tensor([prop.tokens], dtype=torch.long, device=p.device).reshape(1, k)
    res = verify(p.unsqueeze(0), q.unsqueeze(0), drafts, generator)
    n = int(res.num_accepted[0])
    return RoundRecord(position=len(seq), draft_tokens=list(prop.tokens), num_accepted=n,
                       next_token=int(res.next_token[0]), bonus=(k > 0 and n == k), emitted=[],
                       accept_prob=res.accept_prob[0].tolist(), overlap=torch.minimum(p[:k], q).sum(-1).tolist(),
                       target_argmax=top)



def commit_round(rec: RoundRecord, seq: list[int], new: list[int], rule: StopRule,
                 decode: Callable[[list[int]], str]) -> str | None:
    """Append the round's tokens (accepted drafts, then the target's token) and stop where the
    request's rule says (:meth:`StopRule.first_finish`: EOS / stop id, a stop string in the new
    text, ``max_tokens``) — tokens after the stopping point are discarded.

    Args:
        rec: the verified round; ``rec.emitted`` is filled with the tokens kept.
        seq, new: the committed sequence (prompt + output) and the output alone; both are
            extended in place.
        rule: the request's stop rule. decode: ids → text, for stop strings.

    Returns:
        ``"stop"``, ``"length"``, or None to go on.
    """
    start = len(new)
    new.extend(rec.draft_tokens[:rec.num_accepted] + [rec.next_token])
    end, reason = rule.first_finish(new, start, decode)
    del new[end:]
    rec.emitted = new[start:]
    seq.extend(rec.emitted)
    return reason
