"""Saving and loading the draft heads trained for the frozen target (Medusa, EAGLE): a folder with
``model.safetensors`` and ``config.json`` (the sizes, the architecture and the training stats),
found by a shipped name under ``assets/models`` or by a path."""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from ..models import MODELS_DIR


def save_head(module: nn.Module, path: str | Path, config: dict, stats: dict | None = None) -> None:
    """Write ``module``'s weights and ``config`` (+ ``stats``) under ``path`` (created if needed)."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({**config, **({"stats": stats} if stats else {})}, indent=2) + "\n")


def read_head(name_or_path: str | Path, what: str, command: str) -> tuple[dict, dict]:
    """``(config, state_dict)`` of a saved head.

    Raises:
        FileNotFoundError: no such folder (the message names ``command``, which builds it).
    """
    from safetensors.torch import load_file
    path = Path(name_or_path)
    if not path.is_absolute() and not path.exists():
        path = MODELS_DIR / path
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no {what} at {path}; run `{command}` to build it")
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))
