"""Speculative decoding: a cheap proposer drafts γ tokens, the target verifies them in one forward.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023); Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling" (2023). The emitted tokens are distributed exactly as target sampling; greedy is the
special case where ``p`` and ``q`` are one-hot (a draft token is accepted iff it is the
target's arg-max).

One concept per module, every name re-exported here (``from labsupport import speculative as spec``):

* :mod:`.theory` — expected tokens per round, speed-up, best γ, a Monte Carlo of rounds;
* :mod:`.rejection` — the verification as pure tensor functions (:func:`verify`);
* :mod:`.cache` — a Hugging Face model with a KV cache that rolls back by cropping;
* :mod:`.proposers` — the draft loop (:func:`draft_tokens`), draft model and n-gram proposers;
* :mod:`.rounds` — verify one round's proposal and commit its tokens under the stop rule;
* :mod:`.stats` — acceptance statistics of a run;
* :mod:`.decode` — the loop over Hugging Face models (:func:`speculative_generate`);
* :mod:`.engine` — the batched loop over the paged KV cache (:class:`SpecDecodeEngine`);
* :mod:`.exactness` — an exact two-token check of the output distribution;
* :mod:`.prompts` — the prose and repetitive prompts the chapter and the benchmark use.

Timing (step costs, speed-up sweeps, engine comparison) lives in :mod:`labsupport.bench.speculative`.
"""

from .cache import CachedLM
from .decode import SpeculativeResult, speculative_generate
from .engine import SpecDecodeEngine, SpecRequestOutput
from .exactness import TwoTokenTree, sampling_noise_floor, simulate_two_tokens, total_variation, two_token_tree
from .prompts import PROSE, REPETITIVE
from .proposers import (
    DraftModelProposer,
    DraftRequest,
    NgramProposer,
    Proposal,
    check_same_vocabulary,
    draft_tokens,
    lookup_ngram,
)
from .rejection import (
    VerifyResult,
    acceptance_probability,
    accepted_prefix_length,
    residual_distribution,
    sample_from,
    verify,
    verify_logits,
)
from .rounds import RoundRecord, commit_round, verify_round
from .stats import SpecStats
from .theory import (
    best_gamma,
    expected_accepted,
    expected_tokens_per_round,
    independent_tokens_estimate,
    simulate_rounds,
    speedup,
)

__all__ = [
    "PROSE", "REPETITIVE", "CachedLM", "DraftModelProposer", "DraftRequest", "NgramProposer", "Proposal",
    "RoundRecord", "SpecDecodeEngine", "SpecRequestOutput", "SpecStats", "SpeculativeResult", "TwoTokenTree",
    "VerifyResult", "acceptance_probability", "accepted_prefix_length", "best_gamma", "check_same_vocabulary",
    "commit_round", "draft_tokens", "expected_accepted", "expected_tokens_per_round", "independent_tokens_estimate",
    "lookup_ngram", "residual_distribution", "sample_from", "sampling_noise_floor", "simulate_rounds",
    "simulate_two_tokens", "speculative_generate", "speedup", "total_variation", "two_token_tree", "verify",
    "verify_logits", "verify_round",
]
