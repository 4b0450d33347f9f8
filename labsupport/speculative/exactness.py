"""An exact check that speculative sampling emits the target's distribution (two tokens deep).

For a prefix, enumerate every token the processed target or draft could emit first, and
every token after each of those: the exact joint ``P(x1, x2)`` of target sampling is then a
small matrix. Running γ = 1 speculative rounds many times and comparing the frequencies with
it (total variation against the noise floor of direct sampling) tests the claim of
Leviathan et al. 2023 (Appendix A.1) and Chen et al. 2023 (Theorem 1) on real models — and
fails for the classic bugs (temperature on one side only, an unnormalised residual, a bonus
token from the wrong row).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models import LoadedModel, model_forward
from ..sampling import SamplingParams, probs_from_logits
from ..validation import check_int, check_token_ids, check_type
from .proposers import check_same_vocabulary
from ..sampling import sample_from
from .rejection import VerifyResult, verify_logits


@dataclass
class TwoTokenTree:
    """Target and draft logits at a prefix and at prefix + every token that can come first,
    restricted to ``vocab`` (every token any of those distributions can emit).

    ``t0, d0``: ``(V',)``; ``t1, d1``: ``(V', V')`` — row a is after prefix + ``vocab[a]``
    (rows of tokens that cannot come first are zeros and never used).
    """

    vocab: list[int]
    t0: torch.Tensor
    d0: torch.Tensor
    t1: torch.Tensor
    d1: torch.Tensor

    def exact_joint(self, params: SamplingParams) -> torch.Tensor:
        """``P(x1, x2) = p(x1) · p(x2 | x1)`` of target sampling, ``(V', V')``."""
        p0 = probs_from_logits(self.t0.unsqueeze(0), params)[0]
        p1 = probs_from_logits(self.t1, params)
        return p0.unsqueeze(1) * p1


@torch.no_grad()
def two_token_tree(target: LoadedModel, draft: LoadedModel, prefix: Sequence[int],
                   params: SamplingParams, max_support: int = 64) -> TwoTokenTree:
    """Build a :class:`TwoTokenTree` with one batched forward per model.

    Exact because the processors only ever keep a token's relative weight among kept tokens:
    restricting the logits to a set that contains every kept token changes nothing.

    Raises:
        TypeError: ``params`` not :class:`SamplingParams`, ``prefix`` not token ids.
        ValueError: more than ``max_support`` possible first tokens (use ``top_k``), greedy, or
            an empty ``prefix`` / an id outside the vocabulary.
    """
    check_type("params", params, SamplingParams)
    check_int("max_support", max_support, 1)
    if params.greedy:
        raise ValueError("params must sample (temperature > 0) for a distribution check, got greedy")
    if params.repetition_penalty != 1.0 or (params.top_p < 1.0 and params.top_k == 0):
        raise ValueError("params for the two-token check may use temperature, top_k, min_p and top_p "
                         f"only together with top_k (restriction must be exact), got {params}")
    check_same_vocabulary(target, draft)
    prefix = check_token_ids("prefix", prefix, int(target.model.config.vocab_size))
    last = {}
    for lm, key in ((target, "t"), (draft, "d")):
        last[key] = model_forward(lm.model, torch.tensor([prefix], device=lm.device), use_cache=False)[0][0, -1].float()
    first = sorted(set(torch.nonzero(probs_from_logits(last["t"], params) > 0).flatten().tolist())
                   | set(torch.nonzero(probs_from_logits(last["d"], params) > 0).flatten().tolist()))
    if len(first) > max_support:
        raise ValueError(f"first-token support must have <= {max_support} tokens for enumeration, got "
                         f"{len(first)}: set top_k (e.g. 8)")
    batch = torch.tensor([prefix + [a] for a in first])
    nxt = {}
    for lm, key in ((target, "t"), (draft, "d")):
        nxt[key] = model_forward(lm.model, batch.to(lm.device), use_cache=False)[0][:, -1].float()
    support = set(first)
    for key in ("t", "d"):
        support |= set(torch.nonzero((probs_from_logits(nxt[key], params) > 0).any(0)).flatten().tolist())
    vocab = sorted(support)
    cols = torch.tensor(vocab)
    row_of = {a: vocab.index(a) for a in first}
    t1 = torch.zeros((len(vocab), len(vocab)))
    d1 = torch.zeros((len(vocab), len(vocab)))
    for i, a in enumerate(first):
        t1[row_of[a]] = nxt["t"][i, cols].cpu()
        d1[row_of[a]] = nxt["d"][i, cols].cpu()
    return TwoTokenTree(vocab=vocab, t0=last["t"][cols].cpu(), d0=last["d"][cols].cpu(), t1=t1, d1=d1)


VerifyLogitsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, SamplingParams, torch.Generator | None],
                          VerifyResult]


def simulate_two_tokens(tree: TwoTokenTree, params: SamplingParams, n_trials: int, generator: torch.Generator,
                        verify_fn: VerifyLogitsFn = verify_logits) -> torch.Tensor:
    """Empirical joint of the first two emitted tokens of speculative sampling with γ = 1.

    Each trial: draft ``d ~ q(·|prefix)``; verify against ``[p(·|prefix), p(·|prefix, d)]``;
    if accepted the tokens are ``d`` and the bonus; if rejected the first is the replacement
    ``x1`` and a second round from prefix + x1 gives the second. ``verify_fn`` is the function
    under test (:func:`verify_logits`, or a deliberately broken copy in the tests).

    Returns:
        ``(V', V')`` frequencies (sum 1), comparable with :meth:`TwoTokenTree.exact_joint`.

    Raises:
        TypeError / ValueError: ``n_trials`` not an integer >= 1.
    """
    check_int("n_trials", n_trials, 1)
    V = len(tree.vocab)
    B = int(n_trials)
    pad = torch.zeros(B, 1, V)                                  # a row that is never used for 2 tokens
    d1 = sample_from(probs_from_logits(tree.d0.unsqueeze(0), params).expand(B, V), generator)
    r1 = verify_fn(torch.stack([tree.t0.expand(B, V), tree.t1[d1]], dim=1), tree.d0.expand(B, 1, V),
                   d1.unsqueeze(1), params, generator)
    acc = r1.num_accepted > 0
    x1 = torch.where(acc, d1, r1.next_token)
    d2 = sample_from(probs_from_logits(tree.d1[x1], params), generator)
    r2 = verify_fn(torch.cat([tree.t1[x1].unsqueeze(1), pad], dim=1), tree.d1[x1].unsqueeze(1),
                   d2.unsqueeze(1), params, generator)
    x2 = torch.where(acc, r1.next_token, torch.where(r2.num_accepted > 0, d2, r2.next_token))
    counts = torch.bincount(x1 * V + x2, minlength=V * V).float()
    return (counts / B).reshape(V, V)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """``½ Σ |p − q|`` over all entries."""
    return 0.5 * float((p - q).abs().sum())


def sampling_noise_floor(probs: torch.Tensor, n_trials: int, generator: torch.Generator, repeats: int = 20) -> float:
    """Mean total variation between ``probs`` and the frequencies of ``n_trials`` direct draws
    from it (``repeats`` times): what an exact sampler scores on average.

    Raises:
        TypeError / ValueError: ``n_trials`` or ``repeats`` not an integer >= 1.
    """
    check_int("n_trials", n_trials, 1)
    check_int("repeats", repeats, 1)
    flat = probs.flatten().double()
    tvs = []
    for _ in range(repeats):
        draws = torch.multinomial(flat, n_trials, replacement=True, generator=generator)
        freq = torch.bincount(draws, minlength=flat.numel()).double() / n_trials
        tvs.append(total_variation(freq, flat))
    return float(np.mean(tvs))
