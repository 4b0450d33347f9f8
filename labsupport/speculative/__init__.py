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
* :mod:`.prompts` — the prose and repetitive prompts the chapter and the benchmark use;
* :mod:`.tree` — token trees, greedy path acceptance, KV compaction (SpecInfer; Medusa);
* :mod:`.variants` — :class:`VariantEngine`, the paged engine for cheap drafts, with
  :mod:`.self_spec` (the target's first layers), :mod:`.medusa` (heads on its hidden state),
  :mod:`.lookahead` (Jacobi window + n-gram pool) and :mod:`.policy` (switch off under load).

Timing (step costs, speed-up sweeps, engine comparison) lives in :mod:`labsupport.bench.speculative`.
"""

from .cache import CachedLM
from .decode import SpeculativeResult, speculative_generate
from .engine import SpecDecodeEngine, SpecRequestOutput
from .exactness import TwoTokenTree, sampling_noise_floor, simulate_two_tokens, total_variation, two_token_tree
from .lookahead import LookaheadProposer
from .medusa import MedusaHeads, MedusaProposer, load_medusa
from .policy import SpecPolicy, break_even_batch
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
from .self_spec import SelfSpecProposer
from .stats import SpecStats
from .theory import (
    best_gamma,
    expected_accepted,
    expected_tokens_per_round,
    independent_tokens_estimate,
    simulate_rounds,
    speedup,
)
from .tree import TokenTree, accept_greedy_path, compact_kv, tree_forward
from .variants import Draft, VariantEngine, VariantOutput

__all__ = [
    "PROSE",
    "REPETITIVE",
    "CachedLM",
    "Draft",
    "DraftModelProposer",
    "DraftRequest",
    "LookaheadProposer",
    "MedusaHeads",
    "MedusaProposer",
    "NgramProposer",
    "Proposal",
    "RoundRecord",
    "SelfSpecProposer",
    "SpecDecodeEngine",
    "SpecPolicy",
    "SpecRequestOutput",
    "SpecStats",
    "SpeculativeResult",
    "TokenTree",
    "TwoTokenTree",
    "VariantEngine",
    "VariantOutput",
    "VerifyResult",
    "accept_greedy_path",
    "acceptance_probability",
    "accepted_prefix_length",
    "best_gamma",
    "break_even_batch",
    "check_same_vocabulary",
    "commit_round",
    "compact_kv",
    "draft_tokens",
    "expected_accepted",
    "expected_tokens_per_round",
    "independent_tokens_estimate",
    "load_medusa",
    "lookup_ngram",
    "residual_distribution",
    "sample_from",
    "sampling_noise_floor",
    "simulate_rounds",
    "simulate_two_tokens",
    "speculative_generate",
    "speedup",
    "total_variation",
    "tree_forward",
    "two_token_tree",
    "verify",
    "verify_logits",
    "verify_round",
]
