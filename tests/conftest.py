import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(int(os.environ.get("LABSUPPORT_TEST_THREADS", "1")))

from helpers import make_tiny_lm


@pytest.fixture(scope="session")
def tiny_lm():
    """Random 2-layer GPT-2 (n_embd 64, 64 positions) with the shipped tokenizer."""
    return make_tiny_lm(seed=0)
