"""``EngineConfig``: the engine's settings, with vLLM's names, checked once when made."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from ..quant.int8 import QUANTIZATIONS
from ..quant.kv import KV_CACHE_DTYPES
from ..validation import check_bool, check_callable, check_choice, check_int, check_type
from .batch_invariant import check_settings
from .native_attention import check_backend_name


@dataclass
class EngineConfig:
    """Engine settings (vLLM's names); every field is checked when the config is made.

    Attributes:
        block_size: token slots per KV block.
        num_blocks: blocks in the KV pool (its capacity is ``num_blocks · block_size`` tokens).
        max_num_seqs: most sequences running in one step (forked samples included).
        max_num_batched_tokens: token budget of one step; ``None`` = the model's ``n_positions``.
        preemption_mode: ``"recompute"`` or ``"swap"``.
        num_cpu_blocks: CPU swap space in blocks (used with ``"swap"``).
        enable_prefix_caching: reuse the KV of full blocks shared by prompts.
        enable_chunked_prefill: split long prompts into chunks that share steps with decodes.
        max_prefill_chunk: most prompt tokens of one sequence per step (``None`` = the budget).
        record_history: keep an :class:`EngineSnapshot` after every step in ``engine.history``.
        clock: seconds for the metrics (``time.perf_counter``; simulators pass a virtual clock).
        seed: seed of the engine's ``torch.Generator`` (requests without their own seed use it).
        kv_cache_dtype: ``"auto"`` (the model's dtype) or ``"int8"`` / ``"fp8"`` / ``"fp8_e4m3"`` /
            ``"fp8_e5m2"``: KV blocks in 8 bits with a scale per token and head (:mod:`labsupport.quant.kv`).
        quantization: ``None`` or ``"int8"``: int8 matmuls (:mod:`labsupport.quant.int8`).
        attention_backend: ``None`` (the fastest that runs here), ``"TORCH_SDPA"`` (paged attention by
            gather) or ``"CPU_ATTN"`` (the KV blocks read in place; :mod:`labsupport.engine.native_attention`).
        batch_invariant: a request's logits bit-identical alone and in any batch, chunked or served from
            the prefix cache (:mod:`labsupport.engine.batch_invariant`; vLLM's ``VLLM_BATCH_INVARIANT=1``).

    Raises:
        TypeError: a field of the wrong type (flags must be bools, ``clock`` callable).
        ValueError: a field outside its range.
    """

    block_size: int = 16
    num_blocks: int = 256
    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    preemption_mode: str = "recompute"
    num_cpu_blocks: int = 256
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    max_prefill_chunk: int | None = None
    record_history: bool = False
    clock: Callable[[], float] = time.perf_counter
    seed: int = 0
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    attention_backend: str | None = None
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        for name, low in (("block_size", 1), ("num_blocks", 1), ("max_num_seqs", 1), ("num_cpu_blocks", 0)):
            setattr(self, name, check_int(name, getattr(self, name), low))
        for name in ("max_num_batched_tokens", "max_prefill_chunk"):
            if getattr(self, name) is not None:
                setattr(self, name, check_int(name, getattr(self, name), 1, hint=" or None"))
        check_choice("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "record_history"):
            check_bool(name, getattr(self, name))
        check_callable("clock", self.clock)
        self.seed = check_int("seed", self.seed, 0, 2 ** 63 - 1)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("quantization", self.quantization, QUANTIZATIONS)
        check_backend_name(self.attention_backend)
        check_settings(self.batch_invariant, self.quantization, self.attention_backend)


def make_config(config: EngineConfig | None = None, overrides: dict | None = None,
                name: str = "engine settings") -> EngineConfig:
    """``config`` (default :class:`EngineConfig()`) with ``overrides`` applied, every field checked.

    Args:
        name: what the caller calls ``overrides`` in its messages (``"decode_kwargs"``, ...).

    Raises:
        TypeError: ``config`` not an EngineConfig, ``overrides`` not a dict, a field of the wrong type.
        ValueError: an unknown setting (the valid ones are listed), a field outside its range.
    """
    if config is not None:
        check_type("config", config, EngineConfig)
    overrides = {} if overrides is None else check_type(name, overrides, dict)
    names = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(overrides) - names, key=str)
    if unknown:
        raise ValueError(f"unknown {name} {unknown}; valid ones are {sorted(names)}")
    return replace(config or EngineConfig(), **overrides)
