import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Property tests draw the same examples on every run (CI must be repeatable).
settings.register_profile("course", derandomize=True, deadline=None)
settings.load_profile("course")
torch.set_num_threads(int(os.environ.get("LABSUPPORT_TEST_THREADS", "1")))
# The matrix kernels chosen per machine (engine.linear.tune) go to a file of this run, not the user's cache.
os.environ.setdefault("LABSUPPORT_CACHE_DIR", tempfile.mkdtemp(prefix="labsupport-test-cache-"))

from helpers import make_tiny_lm


@pytest.fixture(scope="session")
def tiny_lm():
    """Random 2-layer GPT-2 (n_embd 64, 64 positions) with the shipped tokenizer."""
    return make_tiny_lm(seed=0)


@pytest.fixture(scope="session", params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA is not available"))])
def device(request) -> torch.device:
    """Each device the package runs on here: ``cpu``, and ``cuda`` where CUDA is available (else skipped)."""
    return torch.device(request.param)
