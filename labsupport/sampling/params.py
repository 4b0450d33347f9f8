"""``SamplingParams``: how to pick each next token, with vLLM's names, checked once when made."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from ..validation import check_bool, check_int, check_real


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token (names follow vLLM's ``SamplingParams``).

    Attributes:
        temperature: T ≥ 0; 0 is greedy (arg-max), 1 the model's own distribution.
        top_k: keep the k most likely tokens; 0 disables (default).
        top_p: nucleus mass in (0, 1]; 1 disables (default).
        min_p: relative threshold in [0, 1]; 0 disables (default).
        repetition_penalty: θ > 0 over prompt and output tokens; 1 disables (default), 1.1–1.3 is typical.
        frequency_penalty: in [-2, 2], subtracted once per earlier occurrence in the *output*; 0 disables.
        presence_penalty: in [-2, 2], subtracted once if the token occurs in the *output*; 0 disables.
        max_tokens: most new tokens to generate (≥ 1). The context window comes first: a prompt
            that alone fills the model's ``n_positions`` is an error; a prompt that fits runs
            until ``max_tokens`` or the window is full, then finishes with ``"length"``.
        min_tokens: no EOS / stop id is sampled (and no stop string ends it) before this many
            new tokens; 0 ≤ min_tokens ≤ max_tokens.
        stop: strings that end generation when they appear in the new text (not included).
        stop_token_ids: token ids that end generation (kept in ``token_ids``, not in the text),
            besides the model's EOS ids.
        ignore_eos: keep going after the model's end-of-sequence ids (``stop_token_ids`` still stop).
        n: number of samples per prompt (parallel sampling; the engine shares their prompt blocks).
        seed: seed of this request's own ``torch.Generator`` in [0, 2**63) (``None`` = caller's
            generator); the engine seeds sample k of ``n`` with ``seed + k``.
        structured_output: constrain the output to a grammar (vLLM's structured outputs):
            ``{"json": schema}`` (or a bare JSON Schema dict), ``{"regex": pattern}`` or
            ``{"choice": [text, ...]}``; see :mod:`labsupport.structured`. Checked here,
            compiled on first use and cached per (tokenizer, spec). Not with ``ignore_eos``
            or ``min_tokens`` (the grammar decides when EOS may come).

    Numbers may be Python or numpy scalars (stored as ``int`` / ``float``); ``stop`` may be one
    string, a list of strings or ``None``.

    Raises:
        TypeError: a field of the wrong type (``top_k=2.0``, ``temperature="0.5"``, ``ignore_eos=1``).
        ValueError: any field outside its range, naming the field, the value and the range.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    structured_output: dict | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        check_real("temperature", self.temperature, 0, hint=" (0 = greedy)")
        check_int("top_k", self.top_k, 0, hint=" (0 disables it)")
        check_real("top_p", self.top_p, 0, 1, low_open=True, hint=" (use temperature=0 for greedy)")
        check_real("min_p", self.min_p, 0, 1)
        check_real("repetition_penalty", self.repetition_penalty, 0, low_open=True)
        check_real("frequency_penalty", self.frequency_penalty, -2, 2)
        check_real("presence_penalty", self.presence_penalty, -2, 2)
        check_int("max_tokens", self.max_tokens, 1)
        check_int("min_tokens", self.min_tokens, 0, self.max_tokens, hint=" (max_tokens)")
        ids = () if self.stop_token_ids is None else self.stop_token_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set, frozenset)):
            raise TypeError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        ids = tuple(check_int("stop_token_ids", t, 0) for t in ids)
        check_int("n", self.n, 1)
        raw_stop = () if self.stop is None else self.stop
        stop = (raw_stop,) if isinstance(raw_stop, str) else raw_stop
        if not isinstance(stop, (list, tuple)) or any(not isinstance(s, str) for s in stop):
            raise TypeError(f"stop must be non-empty strings (one, a list of them, or None), got {self.stop!r}")
        if any(s == "" for s in stop):
            raise ValueError(f"stop must be non-empty strings (one, a list of them, or None), got {self.stop!r}")
        check_bool("ignore_eos", self.ignore_eos)
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2 ** 63 - 1, hint=" or None")
        for name, kind in (("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float),
                           ("repetition_penalty", float), ("frequency_penalty", float), ("presence_penalty", float),
                           ("max_tokens", int), ("min_tokens", int), ("n", int)):
            object.__setattr__(self, name, kind(getattr(self, name)))   # numpy scalars → int / float
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "stop_token_ids", ids)
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        if self.structured_output is not None:
            from ..structured import normalize_spec  # lazy: structured builds on sampling
            normalize_spec(self.structured_output)
            for name in ("ignore_eos", "min_tokens"):
                if getattr(self, name):
                    raise ValueError(f"structured_output cannot be combined with {name}={getattr(self, name)!r} "
                                     "(the grammar ends the output with EOS once it is complete)")
            object.__setattr__(self, "structured_output", copy.deepcopy(self.structured_output))

    @property
    def greedy(self) -> bool:
        """True when decoding is the arg-max (temperature 0)."""
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        """True when a repetition, frequency or presence penalty changes the logits."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def is_plain_greedy(self) -> bool:
        """True when the next token is the arg-max of the raw logits: greedy, no penalty, no min_tokens."""
        return self.greedy and not self.has_penalties and self.min_tokens == 0

    def replace(self, **changes) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


GREEDY = SamplingParams(temperature=0.0)
