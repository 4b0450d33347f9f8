"""Speculative decoding: a cheap proposer drafts γ tokens, the target verifies them in one forward.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023); Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling" (2023). The emitted tokens are distributed exactly as target sampling; greedy is the
special case where ``p`` and ``q`` are one-hot (a draft token is accepted iff it is the
target's arg-max).

One concept per module, every name re-exported here (``from labsupport import speculative as spec``):

* :mod:`.theory` — expected tokens per round, speed-up, best γ, a Monte Carlo of rounds;
* :mod:`.rejection` — the verification as pure tensor functions (:func:`verify`);
* :mod:`.stats` — a round's record and the acceptance statistics of a run;
* :mod:`.rounds` — a request's speculative state, a draft, and the one round tail
  (verify, commit) of both paths;
* :mod:`.proposers` — the proposer protocol, the draft loop, draft-model and n-gram proposers;
  :mod:`.self_spec` (the target's first layers), :mod:`.medusa` (heads on its hidden state),
  :mod:`.eagle` (a one-layer head drafting the target's next feature),
  :mod:`.lookahead` (Jacobi window + n-gram pool) implement the same protocol;
* :mod:`.config` — ``speculative_config`` (method, ``num_speculative_tokens``) → a proposer;
* :mod:`.engine` — :class:`SpeculativeEngine`, the paged engine every method runs on, with
  :mod:`.policy` (switch off under load);
* :mod:`.cache` and :mod:`.decode` — the readable one-request loop over a Hugging Face cache
  (:func:`speculative_generate`);
* :mod:`.tree` — token trees, greedy path acceptance, KV compaction (SpecInfer; Medusa);
* :mod:`.exactness` — an exact two-token check of the output distribution;
* :mod:`.prompts` — the prose and repetitive prompts the chapter and the benchmark use.

Timing (step costs, speed-up sweeps, engine comparison) lives in :mod:`labsupport.bench.speculative`.
"""

from .cache import CachedLM
from .config import METHODS, SpeculativeConfig, make_proposer
from .decode import SpeculativeResult, speculative_generate
from .eagle import EagleHead, EagleProposer, load_eagle
from .engine import SpeculativeEngine
from .exactness import TwoTokenTree, sampling_noise_floor, simulate_two_tokens, total_variation, two_token_tree
from .lookahead import LookaheadProposer
from .medusa import MedusaHeads, MedusaProposer, load_medusa
from .policy import SpecPolicy, break_even_batch
from .prompts import PROSE, REPETITIVE
from .proposers import DraftModelProposer, NgramProposer, Proposer, check_same_vocabulary, draft_tokens, lookup_ngram
from .rejection import (
    VerifyResult,
    acceptance_probability,
    accepted_prefix_length,
    residual_distribution,
    verify,
    verify_logits,
)
from .rounds import Draft, SpecSequence, clip_draft, commit_round, finish_round, verify_draft
from .self_spec import SelfSpecProposer
from .stats import RoundRecord, SpecStats
from .suffix import SuffixProposer, SuffixTrie
from .theory import (
    best_gamma,
    expected_accepted,
    expected_tokens_per_round,
    independent_tokens_estimate,
    simulate_rounds,
    speedup,
)
from .tree import TokenTree, accept_greedy_path, compact_kv

__all__ = [
    "METHODS",
    "PROSE",
    "REPETITIVE",
    "CachedLM",
    "Draft",
    "DraftModelProposer",
    "EagleHead",
    "EagleProposer",
    "LookaheadProposer",
    "MedusaHeads",
    "MedusaProposer",
    "NgramProposer",
    "Proposer",
    "RoundRecord",
    "SelfSpecProposer",
    "SpecPolicy",
    "SpecSequence",
    "SpecStats",
    "SpeculativeConfig",
    "SpeculativeEngine",
    "SpeculativeResult",
    "SuffixProposer",
    "SuffixTrie",
    "TokenTree",
    "TwoTokenTree",
    "VerifyResult",
    "accept_greedy_path",
    "acceptance_probability",
    "accepted_prefix_length",
    "best_gamma",
    "break_even_batch",
    "check_same_vocabulary",
    "clip_draft",
    "commit_round",
    "compact_kv",
    "draft_tokens",
    "expected_accepted",
    "expected_tokens_per_round",
    "finish_round",
    "independent_tokens_estimate",
    "load_eagle",
    "load_medusa",
    "lookup_ngram",
    "make_proposer",
    "residual_distribution",
    "sampling_noise_floor",
    "simulate_rounds",
    "simulate_two_tokens",
    "speculative_generate",
    "speedup",
    "total_variation",
    "two_token_tree",
    "verify",
    "verify_draft",
    "verify_logits",
]

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "EagleProposer": "eagle",
    "LookaheadProposer": "lookahead",
    "MedusaHeads": "medusa",
    "MedusaProposer": "medusa",
    "PROSE": "prompts",
    "REPETITIVE": "prompts",
    "SelfSpecProposer": "self_spec",
    "SpeculativeEngine": "engine",
    "TokenTree": "tree",
    "accept_greedy_path": "tree",
    "break_even_batch": "policy",
    "compact_kv": "tree",
    "dense_tree_reference": "tree",
    "load_eagle": "eagle",
    "load_medusa": "medusa",
    "policy_from_measurements": "policy",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
