"""The autoregressive generation loop: input → logits → sample → append → repeat.

``generate`` runs it on a real model, with a KV cache (prefill once, then one token per
decode step) or without (the whole sequence is recomputed every step), and records each
step for plotting. It stops on the end-of-sequence token, on ``max_new_tokens`` or when a
stop string appears. ``generate_batch`` runs several prompts at once with left padding.

Counts of *token-forwards* (token positions pushed through the model) are kept so the KV
cache chapter can compare them with the theory: with the cache ``P + n - 1``, without it
``Σ_{i=0}^{n-1} (P + i)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .models import LoadedModel, max_positions, model_forward
from .sampling import GREEDY, SamplingParams, entropy_bits, probs_from_logits, sample
from .stopping import StopRule
from .stopping import context_room as _window_room
from .validation import check_bool, check_int, check_token_ids, check_type


@dataclass
class StepRecord:
    """One decode step.

    Attributes:
        step: index of the new token (0 = first token after the prompt).
        position: its position id in the sequence (prompt length + step).
        token_id / token: the chosen token and its display string.
        prob: its probability under the distribution actually sampled from (after all filters).
        logprob: its natural-log probability under the model's own distribution (T = 1).
        top_ids / top_probs: the model's ``top_n`` most likely candidates at T = 1.
        num_kept: candidates left after the filters (1 for greedy).
        entropy_bits: entropy of the model's own distribution, in bits.
    """

    step: int
    position: int
    token_id: int
    token: str
    prob: float
    logprob: float
    top_ids: list[int]
    top_probs: list[float]
    num_kept: int
    entropy_bits: float


@dataclass
class GenerationResult:
    """What one call of :func:`generate` produced.

    ``finish_reason`` is ``"stop"`` (EOS or a stop string) or ``"length"`` (``max_new_tokens``).
    ``token_forwards`` counts token positions run through the model; ``seconds`` is wall time
    (never compared in tests).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    steps: list[StepRecord] = field(default_factory=list)
    token_forwards: int = 0
    model_calls: int = 0
    seconds: float = 0.0

    @property
    def logprob(self) -> float:
        """Σ log p of the generated tokens under the model (natural log)."""
        return sum(s.logprob for s in self.steps)


def prompt_token_ids(lm: LoadedModel, prompt: str | Sequence[int]) -> list[int]:
    """The prompt's ids, checked: text is encoded; ids must be in the vocabulary.

    Raises:
        TypeError: neither text nor a sequence of integer ids.
        ValueError: empty, or an id outside the vocabulary.
    """
    ids = lm.encode(prompt) if isinstance(prompt, str) else prompt
    return check_token_ids("prompt", ids, int(lm.model.config.vocab_size))


def context_room(lm: LoadedModel, prompt_len: int) -> int:
    """New tokens the context window leaves after a prompt (:func:`labsupport.stopping.context_room`,
    the rule the engines apply too); here a prompt that leaves none is an error at once (the
    engines finish such a request with ``"error"`` instead).

    Raises:
        ValueError: the prompt leaves no room (``prompt_len >= n_positions``).
    """
    limit = max_positions(lm.model)
    room = _window_room(limit, prompt_len)
    if room < 1:
        raise ValueError(f"prompt length must be < {limit} (the model's n_positions) to leave room for a new "
                         f"token, got {prompt_len}")
    return room


def max_new_tokens_for(lm: LoadedModel, prompt_len: int, max_new_tokens: int) -> int:
    """``max_new_tokens`` checked and cut to the context window (:func:`context_room`)."""
    return min(check_int("max_new_tokens", max_new_tokens, 1), context_room(lm, prompt_len))


@torch.no_grad()
def next_token_logits(lm: LoadedModel, prompt: str | Sequence[int]) -> torch.Tensor:
    """The model's logits for the token after ``prompt``: shape ``(vocab,)``, float32.

    Raises:
        ValueError: empty prompt, ids outside the vocabulary, or more tokens than n_positions.
    """
    prompt_ids = prompt_token_ids(lm, prompt)
    limit = max_positions(lm.model)
    if len(prompt_ids) > limit:
        raise ValueError(f"prompt length must be <= {limit} (the model's n_positions), got {len(prompt_ids)}")
    ids = torch.tensor([prompt_ids], device=lm.device)
    logits, _ = model_forward(lm.model, ids, use_cache=False)
    return logits[0, -1].float()


def _record(lm: LoadedModel, step: int, position: int, logits: torch.Tensor, token: int,
            params: SamplingParams, prev: list[int], prompt_len: int, rule: StopRule, top_n: int,
            allowed: torch.Tensor | None = None) -> StepRecord:
    raw = torch.softmax(logits.float(), dim=-1)
    final = probs_from_logits(logits.unsqueeze(0), params, [prev], prompt_lens=prompt_len, end_ids=rule.end_ids,
                              allowed=allowed)[0]
    top = torch.topk(raw, min(top_n, raw.shape[-1]))
    return StepRecord(step=step, position=position, token_id=token, token=lm.token_str(token),
                      prob=float(final[token]), logprob=float(torch.log(raw[token].clamp_min(1e-45))),
                      top_ids=top.indices.tolist(), top_probs=top.values.tolist(),
                      num_kept=int((final > 0).sum()), entropy_bits=float(entropy_bits(raw)))


def grammar_for(lm: LoadedModel, params: SamplingParams, max_new: int):
    """The compiled structured-output grammar of ``params`` for ``lm`` (cached), or None.

    Raises:
        ValueError: with ``fit_max_tokens``, ``max_new`` below the grammar's shortest complete output.
    """
    if params.structured_output is None:
        return None
    from .structured import for_model
    grammar = for_model(params.structured_output, lm)
    grammar.check_budget(max_new)
    return grammar


@torch.no_grad()
def generate(lm: LoadedModel, prompt: str | Sequence[int], params: SamplingParams = GREEDY, *,
             max_new_tokens: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None, record: bool = True,
             top_n: int = 10) -> GenerationResult:
    """Generate a continuation of one prompt, token by token.

    Args:
        lm: a loaded model (:func:`labsupport.models.load_model`).
        prompt: text, or a list of token ids.
        params: sampling settings (default greedy); ``params.stop`` and ``ignore_eos`` apply.
        max_new_tokens: most new tokens; default ``params.max_tokens``.
        use_cache: keep a KV cache (prefill + one token per step) or recompute everything.
        generator: ``torch.Generator`` for sampling (default: seeded from ``params.seed``).
        record: keep a :class:`StepRecord` per step.
        top_n: candidates kept in each record.

    Returns:
        A :class:`GenerationResult`; ``text`` is the new text only, cut before a stop string.
        One call makes one sample: ``params.n`` is ignored (``LLMEngine`` makes ``n``).
        With ``params.structured_output`` every token is masked by the grammar (after the
        penalties, before temperature); the output ends with EOS once complete, or is cut by
        ``max_new_tokens`` (then it is a valid but incomplete prefix).

    Raises:
        ValueError: empty prompt, ids outside the vocabulary, a length beyond the model's
            position limit (prompt + max_new_tokens <= n_positions), ``top_n < 0``.
    """
    check_type("params", params, SamplingParams)
    ids = prompt_token_ids(lm, prompt)
    max_new = max_new_tokens_for(lm, len(ids), params.max_tokens if max_new_tokens is None else max_new_tokens)
    check_int("top_n", top_n, 0)
    check_bool("use_cache", use_cache)
    check_bool("record", record)
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=lm.device).manual_seed(params.seed)
    rule = StopRule.from_params(params, lm.eos_token_ids, max_new, lm.model.config.vocab_size)
    grammar = grammar_for(lm, params, max_new)
    state = 0 if grammar is None else grammar.initial_state()
    seq = list(ids)
    new: list[int] = []
    steps: list[StepRecord] = []
    cache = None
    forwards = calls = 0
    finish = None
    start = time.perf_counter()
    while finish is None:
        step = len(new)
        if use_cache and cache is not None:
            inp = torch.tensor([[seq[-1]]], device=lm.device)            # decode: one token
        else:
            inp = torch.tensor([seq], device=lm.device)                  # prefill / recompute
        logits, cache = model_forward(lm.model, inp, cache, use_cache=use_cache)
        forwards += inp.shape[1]
        calls += 1
        last = logits[0, -1].float()                                     # (vocab,)
        allowed = None if grammar is None else grammar.allowed_token_mask(state, rule.max_tokens - len(new))
        token = int(sample(last.unsqueeze(0), params, generator, [seq], prompt_lens=len(ids),
                           end_ids=rule.end_ids, allowed=allowed)[0])
        if record:
            steps.append(_record(lm, step, len(seq), last, token, params, seq, len(ids), rule, top_n, allowed))
        if grammar is not None:
            state = grammar.advance(state, token)
        seq.append(token)
        new.append(token)
        finish = rule.check(new, lm.decode)
    return GenerationResult(prompt_ids=ids, token_ids=new, text=rule.text(new, finish, lm.decode),
                            finish_reason=finish, steps=steps, token_forwards=forwards, model_calls=calls,
                            seconds=time.perf_counter() - start)


def left_pad(batch_ids: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into a batch.

    Returns:
        ``input_ids (batch, L)``, ``attention_mask (batch, L)`` (1 = real token) and
        ``position_ids (batch, L)``: real tokens get positions ``0..n-1`` whatever the padding; pad slots get position 0 (they are masked out anyway).
    """
    if not batch_ids or any(len(r) == 0 for r in batch_ids):
        raise ValueError("batch_ids must be a non-empty list of non-empty id lists")
    width = max(len(r) for r in batch_ids)
    ids = torch.full((len(batch_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
    for b, row in enumerate(batch_ids):
        ids[b, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
        mask[b, width - len(row):] = 1
    pos = (mask.cumsum(dim=-1) - 1).clamp_min(0)
    return ids.to(device), mask.to(device), pos.to(device)


@torch.no_grad()
def generate_batch(lm: LoadedModel, prompts: Sequence[str | Sequence[int]],
                   params: SamplingParams = GREEDY, *, max_new_tokens: int | None = None,
                   generator: torch.Generator | None = None) -> list[GenerationResult]:
    """Generate for several prompts at once, left-padded, with a KV cache.

    Each row stops on its own EOS / stop string (finished rows keep being fed padding and
    their outputs are ignored). Greedy rows equal their unbatched :func:`generate`.

    Args:
        prompts: texts or id lists (any mix of lengths).
        params: shared sampling settings.
        max_new_tokens: default ``params.max_tokens``.
        generator: one generator for the whole batch (rows draw in order).

    Returns:
        One :class:`GenerationResult` per prompt (no per-step records).
    """
    check_type("params", params, SamplingParams)
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of prompts, got {prompts!r}")
    rows = [prompt_token_ids(lm, p) for p in prompts]
    requested = params.max_tokens if max_new_tokens is None else max_new_tokens
    rules = [StopRule.from_params(params, lm.eos_token_ids, max_new_tokens_for(lm, len(r), requested),
                                 lm.model.config.vocab_size) for r in rows]
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=lm.device).manual_seed(params.seed)
    pad = int(lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.eos_token_id)
    grammar = grammar_for(lm, params, min(r.max_tokens for r in rules))
    states = [0] * len(rows)                             # grammar state per row
    ids, mask, pos = left_pad(rows, pad, lm.device)
    seqs = [list(r) for r in rows]
    new: list[list[int]] = [[] for _ in rows]
    finish: list[str | None] = [None] * len(rows)
    cache = None
    inp, positions = ids, pos
    start = time.perf_counter()
    forwards = 0
    while not all(finish):
        logits, cache = model_forward(lm.model, inp, cache, attention_mask=mask, position_ids=positions)
        forwards += inp.numel()
        allowed = None if grammar is None else torch.stack(
            [grammar.allowed_token_mask(s, rules[b].max_tokens - len(new[b])) for b, s in enumerate(states)])
        tokens = sample(logits[:, -1].float(), params, generator, seqs, prompt_lens=[len(r) for r in rows],
                        end_ids=rules[0].end_ids, allowed=allowed)
        for b, tok in enumerate(tokens.tolist()):
            if finish[b]:
                continue
            if grammar is not None:
                states[b] = grammar.advance(states[b], tok)
            seqs[b].append(tok)
            new[b].append(tok)
            finish[b] = rules[b].check(new[b], lm.decode)
        feed = [new[b][-1] if not finish[b] else pad for b in range(len(rows))]
        inp = torch.tensor(feed, device=lm.device).unsqueeze(1)
        mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=mask.device)], dim=1)
        positions = positions[:, -1:] + 1
    seconds = time.perf_counter() - start
    return [GenerationResult(prompt_ids=row, token_ids=new[b], text=rules[b].text(new[b], finish[b], lm.decode),
                             finish_reason=finish[b], token_forwards=forwards, model_calls=0, seconds=seconds)
            for b, row in enumerate(rows)]


def token_forwards(prompt_len: int, new_tokens: int, use_cache: bool) -> int:
    """Token positions pushed through the model to generate ``new_tokens`` after a prompt.

    With a KV cache the prompt is prefilled once and each later token costs one forward:
    ``P + n - 1`` (the last sampled token is never fed back). Without it every step
    recomputes the whole sequence: ``Σ_{i=0}^{n-1} (P + i) = nP + n(n-1)/2``.

    Raises:
        TypeError: ``prompt_len`` or ``new_tokens`` not an integer.
        ValueError: ``prompt_len`` or ``new_tokens`` < 1.
    """
    check_int("prompt_len", prompt_len, 1)
    check_int("new_tokens", new_tokens, 1)
    if use_cache:
        return prompt_len + new_tokens - 1
    return new_tokens * prompt_len + new_tokens * (new_tokens - 1) // 2


def log2_prob(logprob: float) -> float:
    """Natural-log probability → log₂ (bits), as the beam and sampling figures show it."""
    return logprob / math.log(2)


def find_loop(token_ids: Sequence[int], min_repeats: int = 3) -> tuple[int, int] | None:
    """Detect the repetition loop that greedy decoding falls into (Holtzman et al., 2019, §3).

    Looks for the shortest period ``p`` such that the sequence *ends* with a stretch where
    ``ids[j] == ids[j - p]`` that is at least ``min_repeats · p`` tokens long.

    Args:
        token_ids: a token sequence, e.g. ``GenerationResult.token_ids``.
        min_repeats: how many copies of the repeating block count as a loop (≥ 2).

    Returns:
        ``(start, period)``: the index where the periodic tail starts and its period in
        tokens, or ``None`` when the sequence does not end in a loop.

    Raises:
        TypeError: ``min_repeats`` is not an integer.
        ValueError: ``min_repeats`` < 2.
    """
    check_int("min_repeats", min_repeats, 2)
    ids = [int(i) for i in token_ids]
    n = len(ids)
    for period in range(1, n // min_repeats + 1):
        j = n - 1
        while j - period >= 0 and ids[j] == ids[j - period]:
            j -= 1
        start = j + 1 - period                      # ids[start:] has period `period`
        if n - start >= min_repeats * period:
            return start, period
    return None
