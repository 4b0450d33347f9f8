"""The paged-KV engine (vLLM vocabulary): block manager, paged attention, model runner,
scheduler, ``LLMEngine`` and serving metrics.

``BlockManager`` and the scheduler are pure Python (the simulators in ``labsupport.sim``
use them without loading torch); the torch parts are imported on first use.
"""

from .block_manager import Block, BlockManager, NoFreeBlocksError, block_hash

_LAZY = {
    "LLMEngine": "engine", "EngineConfig": "engine", "RequestOutput": "engine", "EngineSnapshot": "engine",
    "ModelRunner": "model_runner", "RequestMetrics": "metrics",
    "Scheduler": "scheduler", "SchedulerConfig": "scheduler", "Sequence": "scheduler",
    "SchedulerOutput": "scheduler",
}

__all__ = [
    "Block",
    "BlockManager",
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
    "block_hash",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
