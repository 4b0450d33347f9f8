"""labsupport: the package every chapter of the course imports.

Core (no widgets, no plotting): ``models``, ``sampling``, ``generation``, ``beam``, ``kv``,
``engine``, ``speculative``. Figures: ``viz``. Panels: ``widgets``. Chapter setup: ``lab``.

``load_model`` and ``SamplingParams`` are imported lazily (on first access), so the pure
arithmetic modules (``labsupport.kv``, ``labsupport.serving_math``) load without torch.
"""

from __future__ import annotations

__all__ = ["SamplingParams", "load_model", "seed_everything", "set_language"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "load_model":
        from .models import load_model
        return load_model
    if name == "SamplingParams":
        from .sampling import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'labsupport' has no attribute {name!r}")


def set_language(lang: str) -> str:
    """The language of the package's panels, quizzes and checks: ``"en"`` or ``"ko"`` (:mod:`labsupport.i18n`)."""
    from .i18n import set_language as _set
    return _set(lang)


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, NumPy's and torch's global generators (chapters call this once at the top)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
