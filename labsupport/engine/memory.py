"""Will a KV pool fit? The bytes a pool of ``num_blocks`` takes, checked against the memory free now.

A pool is one tensor ``(num_layers, 2, num_blocks, block_size, num_heads, head_dim)``, so it takes
``num_blocks · block_size · 2 · L · H · D · bytes_per_element`` bytes (plus the 8-bit cache's fp16
scales). Asking for more than the device has free would end in an allocator error deep inside
PyTorch (or, on Linux, a process killed later when the zero pages are touched); the engine refuses
it up front instead, naming the setting and the bytes.
"""

from __future__ import annotations

import os

import torch

__all__ = ["available_bytes", "check_pool_fits"]


def available_bytes(device: torch.device) -> int | None:
    """Bytes free for a new tensor on ``device`` now, or ``None`` where it cannot be told.

    CPU: ``MemAvailable`` of ``/proc/meminfo`` (Linux), else the free physical pages (``os.sysconf``).
    CUDA: ``torch.cuda.mem_get_info``.
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_pool_fits(name: str, num_blocks: int, bytes_per_block: int, device: torch.device) -> None:
    """Refuse a pool of ``num_blocks`` blocks that cannot fit the memory free on ``device``.

    Raises:
        ValueError: ``name`` (``"num_blocks"`` / ``"num_cpu_blocks"``) would take more bytes than are free,
            with both figures and the most blocks that would fit.
    """
    need = num_blocks * bytes_per_block
    free = available_bytes(device)
    if free is not None and need > free:
        raise ValueError(f"{name}={num_blocks} would take {need:,} bytes of KV cache ({bytes_per_block:,} per block) "
                         f"but {device.type} memory has {free:,} bytes free: at most {free // bytes_per_block:,} blocks fit")
