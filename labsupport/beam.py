"""Beam search on a real model, keeping the whole search tree (Graves, 2012; Sutskever et al., 2014).

Every step each live beam is extended by every token; the candidates are ranked by their
cumulative log probability ``Σ log p`` and the best ``B`` (the beam width) survive. A candidate
that ends with the end-of-sequence token (EOS) stops growing: it moves to a list of at most
``B`` *finished hypotheses*, where it keeps competing for the final answer with the
length-normalised score

    score = Σ log p / len^α        (len = generated tokens, EOS included; the prompt is not counted)

(α = ``length_penalty``; α = 0 compares raw sums, α > 0 favours longer outputs; Wu et al., 2016).
Live beams are always ranked by the raw sum; α only matters among finished hypotheses.

The rules are those of Hugging Face ``generate(num_beams=B, do_sample=False)`` (transformers
5.x ``_beam_search``), so the two agree token for token (tested):

* the ``2B`` best candidates over all beams are looked at; an EOS candidate among the first
  ``B`` of them enters the finished list, the first ``B`` non-EOS candidates become the beams;
* at ``max_new_tokens`` the first ``B`` candidates finish by length;
* ``early_stopping``: ``True`` stops once ``B`` hypotheses are finished; ``False`` (HF's
  default) also stops when the best live beam, normalised at its *current* length, cannot
  beat the worst finished one; ``"never"`` uses the exact bound (normalised at
  ``max_new_tokens`` when α > 0), which is the textbook beam search.

Some textbook presentations let a finished beam keep one of the ``B`` slots. Here (and in HF)
the ``B`` live beams keep exploring and finished ones wait in their own list. B = 1 is greedy
decoding.

Each step re-runs the model on the ``B`` live sequences (no KV cache per beam): the code stays
short and, on the shipped model, a width-4, depth-6 search takes a few tens of milliseconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .generation import max_new_tokens_for, prompt_token_ids
from .models import LoadedModel, model_forward
from .validation import check_bool, check_int, check_real, check_token_ids

LN2 = math.log(2)


@dataclass
class BeamNode:
    """One node of the search tree: a partial hypothesis.

    Attributes:
        node_id: index in :attr:`BeamSearchResult.nodes` (0 = the prompt, the root).
        parent_id: the node it extends (``None`` for the root).
        depth: generated tokens so far (0 for the root).
        token_id / token: the token it appends (``None`` / ``""`` for the root).
        logprob: ln p of this token given its parent (natural log).
        cum_logprob: Σ ln p from the root (natural log).
        status: ``"root"``, ``"kept"`` (a live beam), ``"pruned"`` (not among the best; also a
            finished hypothesis later pushed out of the finished list) or ``"finished"``.
        finish_reason: ``"stop"`` (EOS) or ``"length"`` for finished nodes, else ``None``.
        score: the length-normalised score of a finished node, else ``None``.
    """

    node_id: int
    parent_id: int | None
    depth: int
    token_id: int | None
    token: str
    logprob: float
    cum_logprob: float
    status: str
    finish_reason: str | None = None
    score: float | None = None

    @property
    def cum_log2(self) -> float:
        """Cumulative log₂ probability (bits), as the tree figure shows it."""
        return self.cum_logprob / LN2


@dataclass
class Hypothesis:
    """A finished hypothesis.

    ``token_ids`` are the generated tokens (EOS included when ``finish_reason == "stop"``);
    ``text`` is their text without EOS; ``logprob`` is Σ ln p; ``score`` = logprob / len^α.
    """

    token_ids: list[int]
    text: str
    logprob: float
    score: float
    finish_reason: str
    node_id: int

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def log2prob(self) -> float:
        return self.logprob / LN2


@dataclass
class BeamSearchResult:
    """What :func:`beam_search` found and how.

    ``hypotheses`` are the best ``num_return_sequences`` finished hypotheses, best first;
    ``nodes`` is the whole tree (every candidate looked at, see :func:`beam_search`).
    ``model_calls`` counts forward passes, ``token_forwards`` the token positions run through
    the model (beams × sequence length per step); ``seconds`` is wall time (never compared).
    """

    prompt_ids: list[int]
    hypotheses: list[Hypothesis]
    nodes: list[BeamNode]
    beam_width: int
    length_penalty: float
    early_stopping: bool | str
    steps: int = 0
    model_calls: int = 0
    token_forwards: int = 0
    seconds: float = 0.0

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root to ``node_id``."""
        out = []
        current: int | None = node_id
        while current is not None:
            out.append(current)
            current = self.nodes[current].parent_id
        return out[::-1]


def length_normalised_score(logprob: float, length: int, length_penalty: float) -> float:
    """``logprob / length^α``: the score finished hypotheses compete with (HF ``length_penalty``).

    Example: Σ log p = -2 over 2 tokens vs -3 over 4 → α=0: -2 beats -3; α=1: -0.75 beats -1.

    Raises:
        TypeError: ``length`` not an integer.
        ValueError: ``length < 1``.
    """
    check_int("length", length, 1, hint=" (generated tokens)")
    return _normalise(logprob, length, length_penalty)


def _normalise(logprob: float, length: int, alpha: float) -> float:
    """``logprob / length^α`` without overflow: ``length^α`` beyond the float range (e.g. α = 300
    over 20 tokens) is ``inf`` and below it ``0`` (so a negative sum scores ``-inf``)."""
    try:
        denominator = float(length) ** alpha
    except OverflowError:
        denominator = math.inf
    if denominator == 0.0:
        return -math.inf if logprob < 0 else 0.0
    return logprob / denominator


def best_hypothesis(candidates: Sequence[tuple[float, int]], length_penalty: float) -> int:
    """Index of the winning ``(Σ log p, length)`` pair under :func:`length_normalised_score`.

    Raises:
        ValueError: no candidates.
    """
    if not candidates:
        raise ValueError("candidates must hold at least one (logprob, length) pair, got none")
    scores = [length_normalised_score(lp, n, length_penalty) for lp, n in candidates]
    return max(range(len(scores)), key=scores.__getitem__)


def _validate(beam_width, max_new_tokens, length_penalty, early_stopping, num_return_sequences, vocab):
    check_int("beam_width", beam_width, 1, vocab // 2)
    check_int("max_new_tokens", max_new_tokens, 1)
    check_real("length_penalty", length_penalty)
    if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    check_int("num_return_sequences", num_return_sequences, 1, beam_width, hint=" (at most beam_width)")


@torch.no_grad()
def beam_search(lm: LoadedModel, prompt: str | Sequence[int], beam_width: int = 4, *,
                max_new_tokens: int = 16, length_penalty: float = 1.0,
                early_stopping: bool | str = False, num_return_sequences: int = 1,
                eos_token_id: int | None = None, ignore_eos: bool = False,
                stop_token_ids: Sequence[int] = ()) -> BeamSearchResult:
    """Beam search with length normalisation, recording the whole search tree.

    Args:
        lm: a loaded model (:func:`labsupport.models.load_model`).
        prompt: text or token ids.
        beam_width: ``B`` ≥ 1 (1 = greedy).
        max_new_tokens: most generated tokens per hypothesis.
        length_penalty: α in ``Σ log p / len^α`` (HF's default 1.0; 0 = raw sums).
        early_stopping: ``True``, ``False`` or ``"never"`` — as HF (module docstring).
        num_return_sequences: finished hypotheses returned, ``1 ≤ n ≤ B``.
        eos_token_id: the token that ends a hypothesis (default: every EOS id of the model,
            :attr:`~labsupport.models.LoadedModel.eos_token_ids`).
        ignore_eos: never end on EOS (every hypothesis then has ``max_new_tokens`` tokens).
        stop_token_ids: more ids that end a hypothesis (vLLM's ``stop_token_ids``; they still
            end it with ``ignore_eos``). A hypothesis keeps its end id in ``token_ids``, not in ``text``.

    Returns:
        A :class:`BeamSearchResult`. Its tree holds, for every live beam at every step, that
        beam's ``2B`` most likely next tokens — every candidate the selection could pick —
        each marked kept, pruned or finished, with its cumulative log probability.

    Raises:
        ValueError: empty prompt, a length beyond the model's positions, ``beam_width`` outside
            ``[1, vocab/2]``, ``num_return_sequences > beam_width``, or another bad argument.
    """
    ids = prompt_token_ids(lm, prompt)
    vocab = int(lm.model.config.vocab_size)
    _validate(beam_width, max_new_tokens, length_penalty, early_stopping, num_return_sequences, vocab)
    max_new_tokens = max_new_tokens_for(lm, len(ids), max_new_tokens)
    check_bool("ignore_eos", ignore_eos)
    if eos_token_id is not None:
        check_int("eos_token_id", eos_token_id, 0, vocab - 1)
    ends = frozenset() if ignore_eos else (lm.eos_token_ids if eos_token_id is None else frozenset({int(eos_token_id)}))
    ends = ends | frozenset(check_int("stop_token_ids", t, 0, vocab - 1) for t in stop_token_ids)
    start = time.perf_counter()
    search = BeamSearcher(lm, ids, beam_width, max_new_tokens, length_penalty, early_stopping, ends)
    calls = forwards = 0
    while not search.done:
        batch = torch.tensor([ids + gen for _, gen in search.live], device=lm.device)   # (beams, P + step)
        logits, _ = model_forward(lm.model, batch, use_cache=False)
        calls, forwards = calls + 1, forwards + batch.numel()
        search.step(torch.log_softmax(logits[:, -1].float(), dim=-1))
    return search.result(num_return_sequences, calls, forwards, time.perf_counter() - start)


class BeamSearcher:
    """The selection rules of one beam search, apart from how the logits are computed.

    :func:`beam_search` recomputes the live beams each step; the paged engine's beam search
    (:func:`labsupport.engine.beam_search.paged_beam_search`) feeds one token per beam over
    shared KV blocks. Both call :meth:`step` with the live beams' next-token log probabilities
    and read :attr:`live` / :attr:`parents` to know which beams continue.

    Attributes:
        live: ``(node id, generated tokens)`` of each live beam, best first.
        parents: for each live beam, the index of the beam it extends in the previous
            :attr:`live` list (empty before the first step).
        done: the search has stopped (``max_new_tokens`` reached, or as ``early_stopping`` says).
    """

    def __init__(self, lm: LoadedModel, prompt_ids: list[int], beam_width: int, max_new_tokens: int,
                 length_penalty: float, early_stopping: bool | str, end_ids: frozenset[int]):
        self.lm, self.prompt_ids, self.end_ids = lm, prompt_ids, frozenset(end_ids)
        self.B, self.alpha = beam_width, float(length_penalty)
        self.max_new_tokens, self.early_stopping = max_new_tokens, early_stopping
        self.nodes = [BeamNode(0, None, 0, None, "", 0.0, 0.0, "root")]
        self.live: list[tuple[int, list[int]]] = [(0, [])]
        self.parents: list[int] = []
        self.finished: list[Hypothesis] = []            # at most B, best score first
        self.steps = 0
        self.done = False

    def step(self, logp: torch.Tensor) -> None:
        """Extend every live beam by every token and keep the best (HF's rules, module docstring).

        Args:
            logp: ``(len(live), vocab)`` natural-log next-token probabilities of the live beams.
        """
        lm, nodes, B, live, step = self.lm, self.nodes, self.B, self.live, self.steps
        vocab = logp.shape[-1]
        cum = torch.tensor([nodes[n].cum_logprob for n, _ in live], device=logp.device)
        total = (logp + cum[:, None]).cpu()                                           # (beams, vocab)
        self.steps += 1

        # The 2B best candidates over all beams, best first: the only ones that can be chosen.
        top = torch.topk(total.flatten(), 2 * B)
        ranked = [divmod(int(i), vocab) for i in top.indices]                         # (beam, token)

        # Record each beam's 2B best next tokens (a superset of its share of `ranked`).
        child: dict[tuple[int, int], int] = {}
        per_beam = torch.topk(total, 2 * B, dim=-1)
        for b, (parent, _) in enumerate(live):
            for tok in per_beam.indices[b].tolist():
                node = BeamNode(len(nodes), parent, step + 1, tok, lm.token_str(tok), float(logp[b, tok]),
                                float(total[b, tok]), "pruned")
                child[(b, tok)] = node.node_id
                nodes.append(node)

        last = step + 1 == self.max_new_tokens
        new_live: list[tuple[int, list[int]]] = []
        parents: list[int] = []
        for rank, (b, tok) in enumerate(ranked):
            if (b, tok) not in child:                   # only possible on an exact tie
                child[(b, tok)] = len(nodes)
                nodes.append(BeamNode(len(nodes), live[b][0], step + 1, tok, lm.token_str(tok),
                                      float(logp[b, tok]), float(total[b, tok]), "pruned"))
            node = nodes[child[(b, tok)]]
            gen = live[b][1] + [tok]
            ends = tok in self.end_ids
            if ends or last:                            # this candidate ends here
                if rank < B:                            # only the first B may enter the finished list
                    node.status, node.finish_reason = "finished", ("stop" if ends else "length")
                    node.score = length_normalised_score(node.cum_logprob, len(gen), self.alpha)
                    text = lm.decode(gen[:-1] if ends else gen)
                    self.finished.append(Hypothesis(gen, text, node.cum_logprob, node.score, node.finish_reason,
                                                    node.node_id))
            elif len(new_live) < B:
                node.status = "kept"
                new_live.append((node.node_id, gen))
                parents.append(b)
        self.finished.sort(key=lambda h: h.score, reverse=True)
        for dropped in self.finished[B:]:               # pushed out by better finished hypotheses
            nodes[dropped.node_id].status = "pruned"
        self.finished = self.finished[:B]
        self.live, self.parents = new_live, parents
        self.done = last or _done(self.finished, nodes[new_live[0][0]].cum_logprob, step + 1, B, self.alpha,
                                  self.early_stopping, self.max_new_tokens)

    def result(self, num_return_sequences: int, model_calls: int, token_forwards: int,
               seconds: float) -> BeamSearchResult:
        """The :class:`BeamSearchResult` of the search so far."""
        return BeamSearchResult(prompt_ids=self.prompt_ids, hypotheses=self.finished[:num_return_sequences],
                                nodes=self.nodes, beam_width=self.B, length_penalty=self.alpha,
                                early_stopping=self.early_stopping, steps=self.steps, model_calls=model_calls,
                                token_forwards=token_forwards, seconds=seconds)


def _done(finished: list[Hypothesis], best_live: float, length: int, B: int, alpha: float,
          early_stopping: bool | str, max_new_tokens: int) -> bool:
    """Can the search stop? Only once B hypotheses are finished; then as ``early_stopping`` says."""
    if len(finished) < B:
        return False
    if early_stopping is True:
        return True
    # Best score the best live beam could still reach: HF's heuristic (False) normalises at the
    # current length; "never" with α > 0 at the longest possible length (an exact bound).
    best_len = max_new_tokens if (early_stopping == "never" and alpha > 0) else length
    return _normalise(best_live, best_len, alpha) <= finished[-1].score


@torch.no_grad()
def sequence_logprob(lm: LoadedModel, prompt: str | Sequence[int], token_ids: Sequence[int]) -> float:
    """Σ ln p of ``token_ids`` following ``prompt`` under the model (one forward pass).

    Used to score greedy's output on the same scale as the beams.

    Raises:
        TypeError: ids that are not integers.
        ValueError: empty prompt or ``token_ids``, an id outside the vocabulary, or a length
            beyond the model's positions.
    """
    ids = prompt_token_ids(lm, prompt)
    token_ids = check_token_ids("token_ids", token_ids, int(lm.model.config.vocab_size))
    limit = int(lm.model.config.n_positions)
    if len(ids) + len(token_ids) > limit:
        raise ValueError(f"prompt length + len(token_ids) must be <= {limit} (the model's n_positions), "
                         f"got {len(ids)} + {len(token_ids)}")
    seq = torch.tensor([ids + token_ids], device=lm.device)
    logits, _ = model_forward(lm.model, seq, use_cache=False)
    logp = torch.log_softmax(logits[0, len(ids) - 1:-1].float(), dim=-1)             # (n, vocab)
    return float(logp.gather(-1, seq[0, len(ids):, None]).sum())

