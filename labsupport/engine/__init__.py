"""The paged-KV engine (vLLM vocabulary), in nano-vllm's shape.

``sequence`` (a sequence and its status) · ``block_pool`` (physical blocks, ref counts, the
prefix-cache index) · ``block_manager`` (block tables, copy-on-write, swap) · ``attention``
(paged attention by gather) · ``model_runner`` (GPT-2 over paged KV; takes block tables) ·
``scheduler`` (continuous batching, preemption, chunked prefill) · ``sampler`` · ``engine``
(``LLMEngine``: add_request / abort_request / step) · ``outputs`` · ``metrics``.
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
__all__ = sorted({*__all__, *_FACE})
