"""Weight-only quantisation of the real GPT-2: round-to-nearest and AWQ's activation-aware scales,
and how much the model changes (perplexity, top-1 and greedy agreement with fp32).

The quantised copy holds each chosen matrix as its *dequantised* values, which is what a
weight-only kernel multiplies by: it streams the int codes and scales from memory and expands
them to floats tile by tile inside the matmul. So the numbers here (perplexity, agreement) are
exactly those of an int8 / int4 kernel; the bytes are counted as stored (:attr:`nbytes`);
the speed of a real int8 kernel on this CPU is :mod:`labsupport.quant.int8`'s.

AWQ (Lin et al. 2024, *Activation-aware Weight Quantization*): a weight column that meets large
activations matters more. Scale column ``j`` up by ``s_j = mean|x_j|^α`` before rounding and the
input down by ``s_j`` after (``x W = (x / s)(s W)``, exact in real numbers), so the important
columns get relatively finer steps; pick α on a few calibration tokens by the layer's output
error. α = 0 is plain round-to-nearest (RTN), so AWQ's calibration error is never worse.
GPTQ (Frantar et al. 2023) instead rounds one column at a time and spreads each rounding error
over the columns not yet rounded, using the inverse Hessian ``(XᵀX)⁻¹`` of the layer's inputs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..validation import check_choice, check_int, check_type
from .formats import GRANULARITIES, fake_quantize, number_format, quantize, relative_error

TARGETS = ("attn", "mlp", "lm_head")
METHODS = ("rtn", "awq")
AWQ_GRID = tuple(i / 10 for i in range(11))


def _check_lm(lm, name: str = "lm"):
    """A :class:`~labsupport.models.LoadedModel` (a model with its tokenizer and device)."""
    if not all(hasattr(lm, a) for a in ("model", "tokenizer", "device")):
        raise TypeError(f"{name} must be a LoadedModel (load_model(...)), or a QuantizedModel's .lm, "
                        f"got {type(lm).__name__}")
    return lm


def _check_targets(targets) -> tuple[str, ...]:
    if isinstance(targets, str) or not hasattr(targets, "__iter__"):
        raise TypeError(f"targets must be a sequence of names from {list(TARGETS)}, got {targets!r}")
    return tuple(targets)


def linear_layers(model, targets: Sequence[str] = TARGETS) -> dict[str, torch.nn.Module]:
    """The weight matrices of a GPT-2 by name (``h.0.attn.c_attn`` …, ``lm_head``), in forward order.

    ``"attn"``: ``c_attn`` (Q, K, V) and ``attn.c_proj``; ``"mlp"``: ``c_fc`` and ``mlp.c_proj``;
    ``"lm_head"``: the output matrix, which GPT-2 ties to the token embedding (quantising it
    quantises both, as llama.cpp does with a tied embedding).

    Raises:
        ValueError: an unknown target, no target, or not a GPT-2-family model.
    """
    model = getattr(model, "model", model)
    if getattr(getattr(model, "config", None), "model_type", None) != "gpt2":
        raise ValueError("model must be a GPT-2-family model (config.model_type 'gpt2')")
    targets = _check_targets(targets)
    if not targets:
        raise ValueError(f"targets must name at least one of {list(TARGETS)}, got ()")
    for t in targets:
        check_choice("targets", t, TARGETS)
    layers: dict[str, torch.nn.Module] = {}
    for i, block in enumerate(model.transformer.h):
        if "attn" in targets:
            layers[f"h.{i}.attn.c_attn"], layers[f"h.{i}.attn.c_proj"] = block.attn.c_attn, block.attn.c_proj
        if "mlp" in targets:
            layers[f"h.{i}.mlp.c_fc"], layers[f"h.{i}.mlp.c_proj"] = block.mlp.c_fc, block.mlp.c_proj
    if "lm_head" in targets:
        layers["lm_head"] = model.lm_head
    return layers


def out_in(module: torch.nn.Module) -> torch.Tensor:
    """The weight as ``(out, in)``: ``nn.Linear`` keeps it so, GPT-2's ``Conv1D`` stores ``(in, out)``."""
    return module.weight.detach() if isinstance(module, torch.nn.Linear) else module.weight.detach().t()


def _set_out_in(module: torch.nn.Module, w_oi: torch.Tensor) -> None:
    w = w_oi if isinstance(module, torch.nn.Linear) else w_oi.t()
    module.weight.data.copy_(w.to(module.weight.dtype))


def _check_ids(name: str, ids, lm) -> torch.Tensor:
    """``ids`` as a 1-D long tensor of at least 2 ids inside the model's vocabulary."""
    check_type(name, ids, torch.Tensor)
    vocab = lm.vocab_size if hasattr(lm, "max_positions") else lm.model.config.vocab_size
    if ids.dim() != 1 or len(ids) < 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D tensor of at least 2 integer token ids, got shape "
                         f"{tuple(ids.shape)} ({ids.dtype})")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"{name} must hold token ids in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")
    return ids.long()


@torch.inference_mode()
def layer_inputs(lm, ids: torch.Tensor, names: Sequence[str], window: int = 256) -> dict[str, torch.Tensor]:
    """The inputs ``(tokens, in)`` each named matrix sees on ``ids`` (a forward hook per layer)."""
    _check_lm(lm)
    ids = _check_ids("ids", ids, lm)
    model = lm.model
    window = min(check_int("window", window, 1), model.config.n_positions)
    layers = linear_layers(model)
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ValueError(f"names must be matrices of the model ({', '.join(list(layers)[:3])}, …), got {unknown[0]!r}")
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    hooks = [layers[n].register_forward_pre_hook(lambda m, args, n=n: seen[n].append(args[0].reshape(-1, args[0].shape[-1])))
             for n in names]
    try:
        for start in range(0, len(ids), window):
            model(ids[start:start + window].unsqueeze(0).to(lm.device))
    finally:
        for h in hooks:
            h.remove()
    return {n: torch.cat(v).float() for n, v in seen.items()}


def awq_scale(w_oi: torch.Tensor, x: torch.Tensor, fmt: str, granularity: str, group_size: int,
              grid: Sequence[float] = AWQ_GRID) -> tuple[torch.Tensor, float]:
    """AWQ's per-input-column scale for one matrix: ``(s (in,), α)`` minimising ``‖xWᵀ − x Ŵᵀ‖``
    where ``Ŵ = Q(W·s) / s`` (round-to-nearest of the scaled weight, scaled back).

    Args:
        w_oi: ``(out, in)`` weight; x: ``(tokens, in)`` calibration inputs of this matrix.
        grid: the exponents α tried (0 = RTN is always among them).
    """
    mean_abs = x.abs().mean(dim=0).clamp_min(1e-8)                      # (in,)
    reference = x @ w_oi.t()
    best = (float("inf"), torch.ones_like(mean_abs), 0.0)
    for alpha in sorted(set(grid) | {0.0}):
        s = mean_abs ** alpha
        s = s / (s.max() * s.min()).sqrt()                               # centred around 1 (AWQ's normalisation)
        w_hat = fake_quantize(w_oi * s, fmt, granularity, group_size) / s
        err = float((x @ w_hat.t() - reference).norm())
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]


@dataclass
class QuantizedModel:
    """A quantised copy of a model and what it cost.

    Attributes:
        lm: a :class:`~labsupport.models.LoadedModel` whose chosen matrices hold their dequantised values.
        fmt, granularity, group_size, targets, method: the settings.
        tensor_bytes: per matrix, ``(fp32 bytes, stored bytes)``.
        errors: per matrix, the relative weight error ``‖W − Ŵ‖ / ‖W‖``.
        alphas: per matrix, AWQ's chosen α (empty for RTN).
        model_bytes: bytes of every parameter as stored (fp32 for what is not quantised; the tied
            embedding / LM head counted once).
        fp32_bytes: the same model in fp32.
    """

    lm: object
    fmt: str
    granularity: str
    group_size: int
    targets: tuple[str, ...]
    method: str
    tensor_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    alphas: dict[str, float] = field(default_factory=dict)
    model_bytes: int = 0
    fp32_bytes: int = 0


def quantize_model(lm, fmt: str = "int8", *, granularity: str = "group", group_size: int = 128,
                   targets: Sequence[str] = ("attn", "mlp"), method: str = "rtn",
                   calibration_ids: torch.Tensor | None = None) -> QuantizedModel:
    """Weight-only quantisation of a GPT-2's matrices (biases, layer norms and position
    embeddings stay fp32, as in GPTQ / AWQ checkpoints).

    Args:
        lm: a :class:`~labsupport.models.LoadedModel` (left unchanged; a copy is quantised).
        fmt, granularity, group_size: as :func:`~labsupport.quant.formats.quantize`.
        targets: which matrices (:data:`TARGETS`).
        method: ``"rtn"`` (round to nearest) or ``"awq"`` (needs ``calibration_ids``).
        calibration_ids: ``(N,)`` token ids whose activations choose AWQ's scales (take them from
            the training split, never from the text you evaluate on).

    Raises:
        TypeError / ValueError: bad settings (named), AWQ without calibration ids.
    """
    _check_lm(lm)
    check_choice("method", method, METHODS)
    number_format(fmt)
    check_choice("granularity", granularity, GRANULARITIES)
    check_int("group_size", group_size, 1 if granularity == "group" else 0)    # only groups use it
    targets = _check_targets(targets)
    if method == "rtn" and calibration_ids is not None:
        raise ValueError("calibration_ids are only used by method='awq', got them with method='rtn'")
    layers = linear_layers(lm.model, targets)
    if method == "awq":
        calibration_ids = _check_ids("calibration_ids", calibration_ids, lm)
        if len(calibration_ids) < 16:
            raise ValueError(f"calibration_ids must hold at least 16 token ids, got {len(calibration_ids)}")
    for name, module in layers.items():                                  # group_size fits every matrix
        width = out_in(module).shape[1]
        if granularity == "group" and width % check_int("group_size", group_size, 1):
            raise ValueError(f"group_size must divide the row width of every matrix ({name} has {width}), "
                             f"got {group_size}")
    inputs = layer_inputs(lm, calibration_ids, list(layers)) if method == "awq" else {}
    model = copy.deepcopy(lm.model)
    qlayers = linear_layers(model, targets)
    out = QuantizedModel(type(lm)(model, lm.tokenizer, lm.device, f"{lm.name} ({fmt}, {method})"), fmt,
                         granularity, group_size, targets, method)
    for name, module in qlayers.items():
        w = out_in(module).float()
        if method == "awq":
            s, out.alphas[name] = awq_scale(w, inputs[name], fmt, granularity, group_size)
            stored = quantize(w * s, fmt, granularity, group_size)
            w_hat = stored.dequantize() / s
        else:
            stored = quantize(w, fmt, granularity, group_size)
            w_hat = stored.dequantize()
        scale_bytes = 0 if method == "rtn" else 2 * w.shape[1]           # AWQ keeps 1/s: one fp16 per input column
        out.tensor_bytes[name] = (4 * w.numel(), stored.nbytes + scale_bytes)
        out.errors[name] = relative_error(w, w_hat)
        _set_out_in(module, w_hat)
    unique = {id(p): p for p in lm.model.parameters()}.values()
    out.fp32_bytes = 4 * sum(p.numel() for p in unique)
    out.model_bytes = out.fp32_bytes - sum(a for a, _ in out.tensor_bytes.values()) + \
        sum(b for _, b in out.tensor_bytes.values())
    return out


# ----------------------------------------------------------------------------- how much it changed

@dataclass
class Score:
    """A model on a token stream: perplexity and its top-1 prediction at every position.

    Attributes:
        perplexity: ``exp`` of the mean next-token NLL (nats) over ``tokens`` predictions.
        argmax: ``(tokens,)`` the most likely next token at each position.
        tokens: predictions scored.
    """

    perplexity: float
    argmax: torch.Tensor
    tokens: int


@torch.inference_mode()
def score(lm, ids: torch.Tensor, window: int | None = None) -> Score:
    """Perplexity of ``lm`` on ``ids`` in non-overlapping windows of ``window`` tokens (default 256,
    the length the shipped models were trained on, or the model's ``n_positions`` if smaller), and
    the arg-max at every position.

    ``lm`` is a :class:`~labsupport.models.LoadedModel` (Hugging Face's forward) or an engine
    :class:`~labsupport.engine.model_runner.ModelRunner` (its int8 matmuls, its 8-bit KV cache).

    Raises:
        TypeError: ``ids`` not a tensor. ValueError: fewer than 2 ids, ``window`` outside
            ``[2, n_positions]``.
    """
    from ..engine.model_runner import ModelRunner
    runner = lm if isinstance(lm, ModelRunner) else None
    if runner is None:
        _check_lm(lm)
    ids = _check_ids("ids", ids, lm)
    limit = runner.max_positions if runner else lm.model.config.n_positions
    window = min(256, limit) if window is None else check_int("window", window, 2, limit)
    if runner is not None and runner.num_blocks * runner.block_size < window:
        raise ValueError(f"the runner's cache must hold a window of {window} tokens, got "
                         f"{runner.num_blocks} blocks of {runner.block_size}")
    nll, count, argmax = 0.0, 0, []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window + 1]
        if len(chunk) < 2:
            break
        if runner is None:
            logits = lm.model(chunk[:-1].unsqueeze(0).to(lm.device)).logits[0].float()
        else:                                  # the engine's own forward (its matmuls, its KV cache)
            table = list(range(-(-(len(chunk) - 1) // runner.block_size)))
            logits = runner.forward([chunk[:-1].tolist()], [0], [table], all_logits=True).float()
        chunk = chunk.to(logits.device)
        nll += float(torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum"))
        count += len(chunk) - 1
        argmax.append(logits.argmax(dim=-1).cpu())
    return Score(math.exp(nll / count), torch.cat(argmax), count)


def top1_agreement(a: Score, b: Score) -> float:
    """Fraction of positions where two scores of the same stream predict the same next token.

    Raises:
        ValueError: the scores are of streams of different lengths.
    """
    check_type("a", a, Score)
    check_type("b", b, Score)
    if a.tokens != b.tokens:
        raise ValueError(f"both scores must be of the same stream, got {a.tokens} and {b.tokens} predictions")
    return float((a.argmax == b.argmax).float().mean())


def greedy_agreement(reference: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> float:
    """Mean fraction of each greedy output that equals the reference's before the first difference
    (1.0 = every continuation token-identical).

    Raises:
        ValueError: different numbers of outputs, or an empty reference.
    """
    if not all(isinstance(seq, (list, tuple)) for seq in list(reference) + list(outputs)):
        raise TypeError("reference and outputs must be lists of token-id lists")
    if len(reference) != len(outputs) or not reference:
        raise ValueError(f"outputs must pair with the reference outputs, got {len(outputs)} and {len(reference)}")
    fractions = []
    for ref, out in zip(reference, outputs):
        same = next((i for i, (r, o) in enumerate(zip(ref, out)) if r != o), min(len(ref), len(out)))
        fractions.append(same / max(len(ref), 1))
    return sum(fractions) / len(fractions)
