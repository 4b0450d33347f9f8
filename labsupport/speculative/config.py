"""``speculative_config``: which method drafts and how many tokens — vLLM's settings, in one place.

vLLM takes ``LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_max": 3})``; :class:`~labsupport.speculative.engine.SpeculativeEngine` takes the
same dict (or a :class:`SpeculativeConfig`) and :func:`make_proposer` builds the proposer.
γ — the draft length — is ``num_speculative_tokens`` and has no other owner: the proposer
keeps it, the engine and the statistics read it from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from ..validation import check_choice, check_int

__all__ = ["METHODS", "SpeculativeConfig", "make_proposer"]

METHODS = ("draft_model", "ngram", "suffix", "eagle", "self_speculative", "medusa", "lookahead")


@dataclass
class SpeculativeConfig:
    """Speculative decoding settings (vLLM's names where vLLM has them).

    Attributes:
        method: one of :data:`METHODS`.
        num_speculative_tokens: γ ≥ 1 (the tree depth for Medusa, the window for lookahead).
        draft_model: the draft :class:`~labsupport.models.LoadedModel` (``"draft_model"``) or a
            shipped name / path to load.
        prompt_lookup_max / prompt_lookup_min: n-gram sizes (``"ngram"``).
        num_layers: blocks the self-speculative draft runs (``"self_speculative"``).
        heads: Medusa heads (``"medusa"``) or an EAGLE head (``"eagle"``): an object, or a shipped
            name / path to load (default the shipped ones).
        tree_widths: Medusa's top-k per depth, e.g. ``(3, 2, 1)`` (``None``: a chain of width 1).
        ngram / max_candidates: lookahead's n-gram length and candidates per round.
        suffix_decoding_max_tree_depth / _max_cached_requests / _max_spec_factor / _min_token_prob:
            suffix decoding's settings (``"suffix"``; :class:`~labsupport.speculative.suffix.SuffixProposer`).

    Raises:
        TypeError / ValueError: an unknown method, a size out of range.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    draft_model: object = None
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    num_layers: int = 2
    heads: object = None
    tree_widths: tuple[int, ...] | None = None
    ngram: int = 4
    max_candidates: int = 3
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 1000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        self.num_speculative_tokens = check_int("num_speculative_tokens", self.num_speculative_tokens, 1)

    @classmethod
    def from_any(cls, config) -> SpeculativeConfig:
        """A config from itself or a dict; an unknown key is a ``ValueError`` naming the valid ones."""
        if isinstance(config, cls):
            return config
        if not isinstance(config, Mapping):
            raise TypeError(f"speculative_config must be a SpeculativeConfig or a dict, got {type(config).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ValueError(f"unknown speculative_config keys {unknown}; valid ones are {sorted(names)}")
        return cls(**config)


def make_proposer(config: SpeculativeConfig | Mapping, target):
    """The proposer for ``config`` drafting for ``target``.

    Raises:
        ValueError: a method whose model or heads are missing (``draft_model`` for
            ``"draft_model"``), or a setting out of range.
    """
    from ..models import load_model
    from .lookahead import LookaheadProposer
    from .medusa import MedusaProposer, load_medusa
    from .proposers import DraftModelProposer, NgramProposer
    from .self_spec import SelfSpecProposer

    cfg = SpeculativeConfig.from_any(config)
    gamma = cfg.num_speculative_tokens
    if cfg.method == "ngram":
        return NgramProposer(gamma, cfg.prompt_lookup_max, cfg.prompt_lookup_min)
    if cfg.method == "suffix":
        from .suffix import SuffixProposer
        return SuffixProposer(gamma, cfg.suffix_decoding_max_tree_depth, cfg.suffix_decoding_max_cached_requests,
                              cfg.suffix_decoding_max_spec_factor, cfg.suffix_decoding_min_token_prob)
    if cfg.method == "draft_model":
        if cfg.draft_model is None:
            raise ValueError("speculative_config method 'draft_model' needs draft_model (a LoadedModel or a name)")
        draft = cfg.draft_model if not isinstance(cfg.draft_model, str) else load_model(cfg.draft_model,
                                                                                         device=target.device)
        return DraftModelProposer(draft, target, gamma)
    if cfg.method == "self_speculative":
        return SelfSpecProposer(cfg.num_layers, gamma)
    if cfg.method == "lookahead":
        return LookaheadProposer(window=gamma, ngram=cfg.ngram, max_candidates=cfg.max_candidates)
    if cfg.method == "eagle":
        from .eagle import EagleProposer, load_eagle
        head = cfg.heads if cfg.heads is not None and not isinstance(cfg.heads, str) else \
            load_eagle(cfg.heads or "tiny-gpt2-eagle", device=target.device)
        return EagleProposer(head, gamma)
    heads = cfg.heads if cfg.heads is not None and not isinstance(cfg.heads, str) else \
        load_medusa(cfg.heads or "tiny-gpt2-medusa", device=target.device)
    if cfg.tree_widths is None:                                                        # method "medusa"
        if gamma > heads.num_heads:
            raise ValueError(f"num_speculative_tokens={gamma} exceeds the {heads.num_heads} Medusa heads "
                             f"(one head per draft position): use 1..{heads.num_heads}")
        widths = (1,) * gamma
    else:
        if isinstance(cfg.tree_widths, (str, bytes)) or not hasattr(cfg.tree_widths, "__len__"):
            raise TypeError(f"tree_widths must be a sequence of top-k sizes, e.g. (3, 2, 1), got {cfg.tree_widths!r}")
        widths = tuple(cfg.tree_widths)
        if len(widths) != gamma:
            raise ValueError(f"tree_widths {widths} must have num_speculative_tokens = {gamma} levels")
    return MedusaProposer(heads, widths=widths)
