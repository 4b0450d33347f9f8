"""When a sequence is finished, why, and what its text is: the stop rule, the model's end ids and
the context window — one place for each.

Every decoding path — :func:`labsupport.generation.generate`, ``generate_batch``, beam search,
the paged ``LLMEngine`` and ``SpeculativeEngine``, :func:`~labsupport.speculative.speculative_generate`
— builds a :class:`StopRule` once per request (from :func:`model_eos_ids` and a ``max_tokens``
cut to :func:`context_room`) and asks :meth:`StopRule.check` after each new token (a
speculative round, which commits several, asks :meth:`StopRule.first_finish`). The rule
follows vLLM's ``SamplingParams`` semantics:

* ``"stop"``: the token is an end-of-sequence id (a model may have several: instruction-tuned
  checkpoints list more than one in ``generation_config.eos_token_id``), one of
  ``stop_token_ids``, or the decoded new text now contains one of the ``stop`` strings.
  ``ignore_eos`` switches off the EOS ids only. Before ``min_tokens`` new tokens exist, no
  EOS / stop id / stop string ends the sequence, and a stop string that was complete before
  then never counts later either (neither to end the sequence nor to cut its text): only an
  occurrence that ends in the text of token ``min_tokens`` or later does (vLLM checks only
  the text each new token adds, once ``min_tokens`` are out).
* ``"length"``: ``max_tokens`` new tokens exist, or the context window is full.

The returned ``token_ids`` keep the stopping token; the *text* drops a final EOS or stop id
and is cut before the earliest stop string (vLLM's default, ``include_stop_str_in_output=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

STOP, LENGTH = "stop", "length"


def stop_string_index(text: str, stops: Sequence[str], floor: int = 0) -> int | None:
    """Index where the earliest of ``stops`` starts in ``text``, or ``None``, counting only
    occurrences that end after character ``floor`` (text before ``floor`` came before
    ``min_tokens`` and can stop nothing; an occurrence may still start there)."""
    hits = [i for i in (text.find(s, max(0, floor - len(s) + 1)) for s in stops) if i >= 0]
    return min(hits) if hits else None


def context_room(n_positions: int, prompt_len: int) -> int:
    """New tokens the context window leaves after a prompt: ``n_positions − prompt_len`` (vLLM's
    rule: a prompt that alone fills the window can never run; one that fits runs until
    ``max_tokens`` or the window is full, then finishes with ``"length"``). ≤ 0: no room."""
    return int(n_positions) - int(prompt_len)


def model_eos_ids(model, tokenizer=None) -> frozenset[int]:
    """Every end-of-sequence id of a ``transformers`` model: its tokenizer's, its config's and its
    generation config's (instruction-tuned checkpoints often list several)."""
    return eos_ids_of(getattr(tokenizer, "eos_token_id", None), getattr(model.config, "eos_token_id", None),
                      getattr(getattr(model, "generation_config", None), "eos_token_id", None))


def eos_ids_of(*sources) -> frozenset[int]:
    """Every end-of-sequence id named by ``sources`` (ints, lists of ints or ``None``)."""
    ids: set[int] = set()
    for src in sources:
        if src is None:
            continue
        if isinstance(src, Iterable) and not isinstance(src, (str, bytes)):
            ids.update(int(i) for i in src if i is not None)
        else:
            ids.add(int(src))
    return frozenset(ids)


@dataclass(frozen=True)
class StopRule:
    """The stop conditions of one request.

    Attributes:
        end_ids: ids that end the sequence — the model's EOS ids (unless ``ignore_eos``) and
            the request's ``stop_token_ids``.
        stop: stop strings, searched in the decoded new text.
        min_tokens: no stop before this many new tokens.
        max_tokens: most new tokens (already cut to the context window by the caller).
    """

    end_ids: frozenset[int]
    stop: tuple[str, ...]
    min_tokens: int
    max_tokens: int

    @classmethod
    def from_params(cls, params, eos_token_ids: Iterable[int] | int | None, max_tokens: int,
                    vocab_size: int | None = None) -> StopRule:
        """The rule for ``params`` (a :class:`~labsupport.sampling.SamplingParams`) on a model whose
        end-of-sequence ids are ``eos_token_ids``, allowed ``max_tokens`` new tokens.

        Raises:
            ValueError: a ``stop_token_ids`` entry outside ``[0, vocab_size)`` (when ``vocab_size`` is
                given: every decoding path gives it, so such a request is refused when it is added,
                before it could index past the logits of a batch it shares).
        """
        eos = frozenset() if params.ignore_eos else eos_ids_of(eos_token_ids)
        stop_ids = eos_ids_of(getattr(params, "stop_token_ids", ()))
        outside = sorted(t for t in stop_ids if vocab_size is not None and not 0 <= t < vocab_size)
        if outside:
            raise ValueError(f"stop_token_ids must be token ids in [0, {vocab_size}), got {outside[:5]}")
        return cls(end_ids=eos | stop_ids, stop=tuple(params.stop),
                   min_tokens=int(getattr(params, "min_tokens", 0)), max_tokens=int(max_tokens))

    def check(self, new_ids: Sequence[int], decode: Callable[[list[int]], str] | None = None) -> str | None:
        """Finish reason after the last token of ``new_ids`` was appended, or ``None`` to go on.

        ``decode`` turns ids into text; without it stop strings are not checked.
        """
        n = len(new_ids)
        if n >= self.min_tokens and n > 0:
            if new_ids[-1] in self.end_ids:
                return STOP
            if self.stop and decode is not None and self._stop_at(list(new_ids), decode(list(new_ids)), decode) is not None:
                return STOP
        if n >= self.max_tokens:
            return LENGTH
        return None

    def first_finish(self, new_ids: Sequence[int], start: int,
                     decode: Callable[[list[int]], str] | None = None) -> tuple[int, str | None]:
        """Check tokens ``new_ids[start:]`` one at a time (a speculative round commits several).

        Returns ``(end, reason)``: the sequence keeps ``new_ids[:end]``; ``reason`` is the
        finish reason at that token, or ``None`` when none of them finished it.
        """
        for end in range(max(start, 0) + 1, len(new_ids) + 1):
            reason = self.check(new_ids[:end], decode)
            if reason is not None:
                return end, reason
        return len(new_ids), None

    def text(self, new_ids: Sequence[int], finish_reason: str | None,
             decode: Callable[[list[int]], str]) -> str:
        """The user-visible text: a final end id dropped, cut before the earliest stop string."""
        ids = list(new_ids)
        if finish_reason == STOP and ids and ids[-1] in self.end_ids:
            ids = ids[:-1]
        text = decode(ids)
        cut = self._stop_at(list(new_ids), text, decode) if self.stop else None
        return text if cut is None else text[:cut]

    def _stop_at(self, new_ids: list[int], text: str, decode: Callable[[list[int]], str]) -> int | None:
        """Where the earliest stop string that counts starts in ``text`` (the decoded ``new_ids``):
        one ending in the text of token ``min_tokens`` or later."""
        floor = len(decode(new_ids[:self.min_tokens - 1])) if self.min_tokens > 1 else 0
        return stop_string_index(text, self.stop, floor)
