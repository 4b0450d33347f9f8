"""The paged-KV engine (vLLM vocabulary), in nano-vllm's shape. The module map, in the order a request
meets them:

* ``engine`` — ``LLMEngine.step()``: schedule → move blocks → run the model → sample → finish;
  ``intake`` — how a request comes in and goes out (``add_request``, ``add_prefilled_request``,
  ``abort_request``, ``fork``); ``config`` — ``EngineConfig``, vLLM's setting names, checked once.
* ``sequence`` — the request inside the engine, one object: its tokens and status (what the scheduler
  queues) and its sampling settings, stop rule, generator, grammar cursor and metrics.
* ``scheduler`` — continuous batching, preemption (recompute or swap), chunked prefill; it owns the queues.
* ``block_manager`` — block tables, copy-on-write, the slot mapping; on ``block_pool`` (physical blocks,
  ref counts, the prefix-cache index) and ``swap_space`` (CPU blocks, preemption by swap).
* ``model_runner`` — GPT-2 over the paged cache (takes block tables, not the manager): ``gpt2`` (the
  blocks' weights), ``kv_cache`` (the cache tensors and every block move), ``attention`` (paged attention
  by gather, ``TORCH_SDPA``), ``native_attention`` + ``paged_attention.c`` (``CPU_ATTN``, blocks read in
  place), ``linear`` (the matmul kernel per row count), ``memory`` (will a pool fit), ``extend`` (several
  tokens per sequence: speculative verification, trees), ``batch_invariant`` (fixed-order matmuls and
  attention: a request's logits the same in any batch).
* ``sampler`` — one token per sequence, batched; ``outputs`` (``RequestOutput``, snapshots) and
  ``metrics`` (TTFT, TPOT, ITL, goodput).
* ``beam_search`` — vLLM's ``LLM.beam_search`` on this engine.
"""

from .block_manager import BlockManager
from .block_pool import Block, BlockPool, NoFreeBlocksError, block_hash
from .config import EngineConfig
from .engine import LLMEngine
from .metrics import RequestMetrics
from .model_runner import ModelRunner
from .outputs import EngineSnapshot, RequestOutput
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .sequence import Sequence, SequenceStatus

__all__ = [
    "Block",
    "BlockManager",
    "BlockPool",
    "EngineConfig",
    "EngineSnapshot",
    "LLMEngine",
    "ModelRunner",
    "NoFreeBlocksError",
    "RequestMetrics",
    "RequestOutput",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "Sequence",
    "SequenceStatus",
    "block_hash",
]

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "ModelRunner": "model_runner",
    "Scheduler": "scheduler",
    "build_metadata": "attention",
    "paged_attention": "attention",
    "paged_beam_search": "beam_search",
    "tree_ancestors": "attention",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
