"""How big the KV cache is, and where the time of a decode step goes.

Plain arithmetic: this module imports only the standard library (and ``labsupport.validation``),
so ``import labsupport.kv`` does not load torch (tested). The arithmetic:

* **KV bytes** (Pope et al., 2022, "Efficiently Scaling Transformer Inference")::

      KV bytes = 2 × L × H_kv × d_head × s × b × (bytes per element)

  2 = K and V, ``L`` layers, ``H_kv`` KV heads, ``d_head`` head dimension, ``s`` sequence length
  (tokens), ``b`` batch (concurrent requests). MHA has ``H_kv = H``, GQA shares one KV head
  between a group of query heads, MQA keeps a single KV head.
* **Roofline of prefill and decode** and the **step time of a batch** live in :mod:`labsupport.roofline`
  (the accelerators, ``2N`` FLOPs per token, ``t(B) = (W + B·K) / BW``); this module re-exports them,
  so one ``from labsupport import kv`` serves a chapter's KV and roofline arithmetic.

Plus the count of K,V positions computed with and without a cache, as the chapter's animation
counts them (:func:`kv_positions_computed`).

Units: bytes are plain bytes (``format_bytes`` prints binary KiB/MiB/GiB); bandwidths are bytes/s, FLOP rates FLOP/s, times seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

# the roofline lives in labsupport.roofline; re-exported here (``name as name``), so kv.step_time keeps working
from .roofline import (  # noqa: F401 (re-exported)
    A100_SXM,
    ACCELERATORS,
    H20,
    H100_SXM,
    Accelerator,
    decode_intensity,
    decode_throughput,
    flops_per_token,
    prefill_time,
    ridge_point,
    step_time,
    throughput_ceiling,
)
from .validation import check_choice, check_int, check_positive, check_real

#: Bits per stored element for each KV-cache (or weight) precision.
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}

ATTENTION_KINDS = ("MHA", "GQA", "MQA")

# The shipped models' folder (the same as ``labsupport.models.MODELS_DIR``; repeated here so this
# module imports neither torch nor transformers).
MODELS_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
SHIPPED_MODELS = ("tiny-gpt2", "tiny-gpt2-draft")



def dtype_bits(dtype: str) -> int:
    """Bits per element of a precision name (``"fp16"``, ``"fp8"``, ``"int4"``, …).

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    check_choice("dtype", dtype, DTYPE_BITS)
    return DTYPE_BITS[dtype]


# ----------------------------------------------------------------------------- model shapes

@dataclass(frozen=True)
class ModelShape:
    """What the KV-cache size depends on, plus the parameter count for the weights.

    Attributes:
        name: display name.
        n_layers: ``L``, transformer blocks.
        n_heads: query heads ``H``.
        n_kv_heads: KV heads ``H_kv`` (``H`` for MHA, ``1`` for MQA, in between for GQA).
        head_dim: ``d_head``.
        n_params: parameters ``N`` (for the weight bytes and the 2N FLOPs per token).
        gqa_kv_heads: KV heads this model uses when switched to GQA (its own for a GQA model;
            ``H // 4`` — groups of four query heads, as in Llama 3 8B — for an MHA model).
        non_layer_params: parameters outside the decoder layers (token and position embeddings, an
            untied LM head); 0 when not known. :func:`layer_weight_bytes` leaves them out.

    Raises:
        TypeError: a size that is not an integer.
        ValueError: a non-positive size, ``n_kv_heads`` that does not divide ``n_heads``, or
            ``non_layer_params`` outside [0, n_params).
    """

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_params: int
    gqa_kv_heads: int | None = None
    non_layer_params: int = 0

    def __post_init__(self) -> None:
        for field_name in ("n_layers", "n_heads", "n_kv_heads", "head_dim", "n_params"):
            check_int(field_name, getattr(self, field_name), 1)
        check_int("non_layer_params", self.non_layer_params, 0, self.n_params - 1)
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads={self.n_heads}, got {self.n_kv_heads}")
        if self.gqa_kv_heads is None:
            gqa = self.n_kv_heads if self.n_kv_heads < self.n_heads else max(1, self.n_heads // 4)
            object.__setattr__(self, "gqa_kv_heads", gqa)

    @property
    def attention(self) -> str:
        """``"MHA"``, ``"GQA"`` or ``"MQA"`` from the head counts."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    def with_attention(self, kind: str) -> ModelShape:
        """The same model with ``kind`` attention: MHA (``H_kv = H``), GQA (``gqa_kv_heads``) or MQA (1).

        Raises:
            ValueError: ``kind`` not in ``("MHA", "GQA", "MQA")``.
        """
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {kind!r}")
        kv = {"MHA": self.n_heads, "GQA": self.gqa_kv_heads, "MQA": 1}[kind]
        return replace(self, n_kv_heads=kv)


#: Common models (parameter counts: the released checkpoints).
PRESETS: dict[str, ModelShape] = {
    "GPT-2 small": ModelShape("GPT-2 small", n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64,
                              n_params=124_439_808, non_layer_params=39_385_344),      # 50,257·768 + 1,024·768 + ln_f
    "Llama 2 7B": ModelShape("Llama 2 7B", n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                             n_params=6_738_415_616, non_layer_params=262_148_096),    # 2 · 32,000·4,096 + final norm
    "Llama 3 8B": ModelShape("Llama 3 8B", n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                             n_params=8_030_261_248, non_layer_params=1_050_677_248),  # 2 · 128,256·4,096 + norm
    "Llama 3 70B": ModelShape("Llama 3 70B", n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
                              n_params=70_553_706_496, non_layer_params=2_101_354_496),  # 2 · 128,256·8,192 + norm
}


def gpt2_param_count(n_layer: int, n_embd: int, vocab_size: int, n_positions: int) -> int:
    """Parameters of a GPT-2 with tied input/output embeddings (as ``GPT2LMHeadModel`` counts them).

    Token + position embeddings, per block ``12·d² + 13·d`` (attention qkv + proj, MLP 4d,
    two layer norms, biases), and the final layer norm ``2·d``.
    """
    d = n_embd
    return vocab_size * d + n_positions * d + n_layer * (12 * d * d + 13 * d) + 2 * d


def shape_from_config(config, name: str = "model") -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face config: a ``PretrainedConfig``, a dict, or the
    path of a model folder / ``config.json``.

    GPT-2 style keys (``n_layer``, ``n_head``, ``n_embd``) and Llama style keys
    (``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``hidden_size``)
    are both read. The parameter count uses :func:`gpt2_param_count` for GPT-2 configs.

    Raises:
        TypeError: a config that is none of those; a size that is not an integer.
        ValueError: a path with no config there (or not JSON); a config without layer / head / width fields (or with one < 1), a
            non-GPT-2 config (whose parameter count is not derived here), or one without
            ``vocab_size`` / ``n_positions``.
    """
    if isinstance(config, (str, Path)):
        path = Path(config).expanduser()
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"config {str(config)!r} must be a model folder holding config.json or the path of a "
                             f"config file; {path} does not exist")
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"config {str(config)!r}: {path} is not a readable JSON config ({err})") from None
    if isinstance(config, dict):
        cfg = config
    elif callable(getattr(config, "to_dict", None)):
        cfg = config.to_dict()
    else:
        raise TypeError(f"config must be a PretrainedConfig, a dict or a path, got {type(config).__name__}")
    layers = cfg.get("n_layer", cfg.get("num_hidden_layers"))
    heads = cfg.get("n_head", cfg.get("num_attention_heads"))
    width = cfg.get("n_embd", cfg.get("hidden_size"))
    if layers is None or heads is None or width is None:
        raise ValueError(f"config must give the number of layers, heads and the width, got keys {sorted(cfg)}")
    layers, heads, width = (check_int(k, v, 1) for k, v in (("n_layer", layers), ("n_head", heads), ("n_embd", width)))
    kv_heads = check_int("num_key_value_heads", cfg.get("num_key_value_heads") or heads, 1)
    head_dim = check_int("head_dim", cfg.get("head_dim") or width // heads, 1)
    if cfg.get("model_type") != "gpt2":
        raise ValueError(f"config must be a GPT-2 config (model_type 'gpt2') to count its parameters, "
                         f"got model_type {cfg.get('model_type')!r}; build a ModelShape by hand instead")
    missing = [k for k in ("vocab_size", "n_positions") if cfg.get(k) is None]
    if missing:
        raise ValueError(f"config must give {' and '.join(missing)} to count a GPT-2's parameters")
    vocab, positions = check_int("vocab_size", cfg["vocab_size"], 1), check_int("n_positions", cfg["n_positions"], 1)
    return ModelShape(name, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                      n_params=gpt2_param_count(layers, width, vocab, positions),
                      non_layer_params=(vocab + positions + 2) * width)          # tied embeddings, ln_f


def preset(name: str) -> ModelShape:
    """One of :data:`PRESETS`, or ``"tiny-gpt2"`` / ``"tiny-gpt2-draft"`` read from the shipped config.

    Raises:
        ValueError: unknown name.
    """
    if name in PRESETS:
        return PRESETS[name]
    if name in SHIPPED_MODELS:
        return shape_from_config(MODELS_DIR / name, name=name)
    raise ValueError(f"preset must be one of {sorted(PRESETS) + list(SHIPPED_MODELS)}, got {name!r}")


# ----------------------------------------------------------------------------- KV bytes

def kv_bytes_per_token(shape: ModelShape, kv_dtype: str = "fp16") -> int:
    """Bytes of K and V stored for one token, all layers: ``2 · L · H_kv · d_head · bytes``.

    Llama 3 8B in fp16 → 2·32·8·128·2 = 131,072 B = 128 KiB.

    Raises:
        ValueError: unknown ``kv_dtype``.
    """
    elements = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim
    check_choice("kv_dtype", kv_dtype, DTYPE_BITS)
    return elements * dtype_bits(kv_dtype) // 8


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that hold ``num_tokens`` tokens: ⌈num_tokens / block_size⌉ —
    the block maths of the paged cache, in one place (the block manager, attention metadata, the
    runner's slots, the simulators and benchmarks call it). Unchecked arithmetic for the hot path:
    :func:`labsupport.serving_math.blocks_needed` is the checked public form."""
    return -(-int(num_tokens) // int(block_size))


def kv_bytes(shape: ModelShape, seq_len: int, batch: int = 1, kv_dtype: str = "fp16") -> int:
    """Bytes of the whole KV cache for ``batch`` sequences of ``seq_len`` tokens.

    Raises:
        TypeError: ``seq_len`` or ``batch`` not an integer.
        ValueError: ``seq_len`` or ``batch`` < 1, or unknown ``kv_dtype``.
    """
    check_int("seq_len", seq_len, 1)
    check_int("batch", batch, 1)
    return kv_bytes_per_token(shape, kv_dtype) * seq_len * batch


def weight_bytes(shape: ModelShape, dtype: str = "bf16") -> int:
    """Bytes of the weights: ``N × bytes per parameter`` (bf16 by default)."""
    return shape.n_params * dtype_bits(dtype) // 8


def layer_weight_bytes(shape: ModelShape, dtype: str = "bf16") -> float:
    """Bytes of one decoder layer's weights: the parameters outside the embeddings and an untied LM
    head (``shape.non_layer_params``), over ``n_layers`` — what tensor parallelism splits per layer.
    With ``non_layer_params = 0`` (unknown) it is all the weights over ``n_layers``, an overestimate."""
    return (shape.n_params - shape.non_layer_params) * dtype_bits(dtype) / 8 / shape.n_layers


def format_bytes(n: float) -> str:
    """Binary units: ``36 KiB``, ``288 MiB``, ``2.5 GiB``.

    Raises:
        TypeError: ``n`` not a number.
        ValueError: ``n`` negative or not finite.
    """
    n = check_real("n", n, 0)
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class MemoryBudget:
    """Weights + KV cache of one configuration against an accelerator's memory (all in bytes)."""

    weights: int
    kv: int
    kv_per_token: int
    capacity: int

    @property
    def total(self) -> int:
        return self.weights + self.kv

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def kv_over_weights(self) -> float:
        return self.kv / self.weights


def memory_budget(shape: ModelShape, seq_len: int, batch: int = 1, kv_dtype: str = "fp16",
                  weight_dtype: str = "bf16", capacity: float = 80e9) -> MemoryBudget:
    """A KV memory calculator: weights (bf16) + KV vs one 80 GB H100.

    Raises:
        TypeError, ValueError: as :func:`kv_bytes`; ``capacity`` not a number > 0.
    """
    check_positive("capacity", capacity)
    return MemoryBudget(weights=weight_bytes(shape, weight_dtype), kv=kv_bytes(shape, seq_len, batch, kv_dtype),
                        kv_per_token=kv_bytes_per_token(shape, kv_dtype), capacity=int(capacity))


# ----------------------------------------------------------------------------- counting

def kv_positions_computed(prompt_len: int, new_tokens: int, use_cache: bool) -> int:
    """K,V positions computed to generate ``new_tokens``, counted as the KV-cache animation does.

    One unit ("token-forward") = one position's K,V computed (in every layer). Step 0 is the
    prefill: ``P`` positions either way. Steps ``1..n`` each append one generated token, so
    the cache ends holding all ``P + n`` positions:

    * with a cache each step computes only the new position: ``P + n``;
    * without one, step ``t`` recomputes the whole sequence of ``P + t``:
      ``Σ_{t=0}^{n} (P + t) = (n + 1)·P + n(n + 1)/2``.

    P = 12, n = 28 → 754 vs 40, ≈ 18.9× ("about 19×").

    This counts one step more than :func:`labsupport.generation.token_forwards`, which counts
    what :func:`~labsupport.generation.generate` actually runs: the last sampled token is
    never fed back (``P + n − 1`` and ``Σ_{i=0}^{n−1} (P + i)``: 39 vs 714, ≈ 18.3×).

    Raises:
        TypeError: an argument not an integer.
        ValueError: ``prompt_len < 1`` or ``new_tokens < 0``.
    """
    check_int("prompt_len", prompt_len, 1)
    check_int("new_tokens", new_tokens, 0)
    if use_cache:
        return prompt_len + new_tokens
    return (new_tokens + 1) * prompt_len + new_tokens * (new_tokens + 1) // 2


def kv_saving(prompt_len: int, new_tokens: int) -> float:
    """How many times fewer positions are computed with a cache (P=12, n=28 → ≈ 19)."""
    return kv_positions_computed(prompt_len, new_tokens, False) / kv_positions_computed(prompt_len, new_tokens, True)


def kv_step_cells(prompt_len: int, step: int, use_cache: bool) -> tuple[int, int]:
    """For the cache animation: ``(positions in the sequence, positions computed)`` at ``step``.

    Step 0 is the prefill (``P`` positions, all computed); at step ``t ≥ 1`` the sequence has
    ``P + t`` positions, of which 1 (cache) or ``P + t`` (no cache) are computed.

    Raises:
        TypeError: an argument not an integer.
        ValueError: ``prompt_len < 1`` or ``step < 0``.
    """
    check_int("prompt_len", prompt_len, 1)
    check_int("step", step, 0)
    length = prompt_len + step
    return length, (length if step == 0 or not use_cache else 1)
