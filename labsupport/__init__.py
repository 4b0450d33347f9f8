"""labsupport: the package every chapter of the course imports.

Core (no widgets, no plotting): ``models``, ``sampling``, ``generation``, ``beam``, ``kv``,
``engine``, ``speculative``. Figures: ``viz``. Panels: ``widgets``.
"""

from .models import load_model
from .sampling import SamplingParams

__all__ = ["SamplingParams", "load_model", "seed_everything"]
__version__ = "0.1.0"


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, NumPy's and torch's global generators (chapters call this once at the top)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
