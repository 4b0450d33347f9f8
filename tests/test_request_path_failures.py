"""The request path around the engine core under bad input: a pool larger than memory, beam search
with too few blocks, CacheBlend's positions, and model / KV-shape folders that do not exist. Each
is a ValueError (or TypeError) naming the parameter and the valid range, raised before any work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import make_tiny_lm

from labsupport import kv
from labsupport.beam import beam_search
from labsupport.engine import LLMEngine
from labsupport.engine.beam_search import paged_beam_search
from labsupport.engine.memory import available_bytes
from labsupport.models import load_model
from labsupport.serving.cacheblend import CacheBlend


@pytest.fixture(scope="module")
def lm():
    return make_tiny_lm(seed=3, n_positions=128)


# ----------------------------------------------------------------------------- pool size vs memory
@pytest.mark.parametrize("setting", ["num_blocks", "num_cpu_blocks"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_a_pool_larger_than_memory_is_refused_with_its_bytes(lm, setting, kv_cache_dtype):
    free = available_bytes(torch.device("cpu"))
    assert free is not None and free > 0
    probe = LLMEngine(lm, block_size=8, num_blocks=4, kv_cache_dtype=kv_cache_dtype)
    per_block = probe.runner.kv_cache[:, :, 0].numel() * probe.runner.kv_cache.element_size()
    if kv_cache_dtype != "auto":
        per_block += probe.runner.kv_scales[:, :, 0].numel() * 2
    blocks = 2 * free // per_block + 1                                   # twice what is free now
    with pytest.raises(ValueError, match=rf"{setting}={blocks} would take ([\d,]+) bytes of KV cache \(([\d,]+) per block\)") as err:
        LLMEngine(lm, block_size=8, **{setting: blocks}, kv_cache_dtype=kv_cache_dtype)
    found = re.search(r"would take ([\d,]+) bytes of KV cache \(([\d,]+) per block", str(err.value))
    need, each = (int(g.replace(",", "")) for g in found.groups())
    assert each == per_block and need == blocks * per_block
    assert "blocks fit" in str(err.value)


# ----------------------------------------------------------------------------- beam search on the paged pool
def test_paged_beam_search_refuses_too_few_blocks_up_front(lm):
    prompts = [[5, 9, 2, 7, 1], [3] * 11]
    least = 4 * ((5 + 10 + 3) // 4) + 4 * ((11 + 10 + 3) // 4)           # 4 beams · ⌈(prompt + 10) / 4⌉ each
    with pytest.raises(ValueError, match=rf"num_blocks must be at least {least} .* got {least - 1}"):
        paged_beam_search(lm, prompts, 4, max_new_tokens=10, block_size=4, num_blocks=least - 1, ignore_eos=True)
    with pytest.raises(TypeError, match="num_blocks must be an integer"):
        paged_beam_search(lm, prompts, 4, max_new_tokens=10, block_size=4, num_blocks=40.0)
    out = paged_beam_search(lm, prompts, 4, max_new_tokens=10, block_size=4, num_blocks=least, ignore_eos=True)
    for prompt, res in zip(prompts, out.results):
        assert res.best.token_ids == beam_search(lm, prompt, 4, max_new_tokens=10, ignore_eos=True).best.token_ids


# ----------------------------------------------------------------------------- CacheBlend positions
@pytest.fixture(scope="module")
def blend(lm):
    return CacheBlend(LLMEngine(lm, block_size=4, num_blocks=64), [[1, 2, 3, 4], [5, 6, 7]], [8, 9], answer_len=3)


@pytest.mark.parametrize("selected,kind,message", [
    ([0, 7], ValueError, r"selected must hold context positions in \[0, 7\), got \[7\]"),
    ([-1], ValueError, r"in \[0, 7\), got \[-1\]"),                   # no wrap-around to the last token
    ([2, 3, 2], ValueError, r"each context position once, got \[2\] more than once"),
    ([1.0], TypeError, "selected must be a list of context positions"),
    ("12", TypeError, "selected must be a list of context positions"),
])
def test_cacheblend_blend_checks_its_positions(blend, selected, kind, message):
    with pytest.raises(kind, match=message):
        blend.blend(selected)


def test_cacheblend_blend_takes_tensors_and_recomputing_all_is_the_full_prefill(blend):
    keys, _ = blend.blend(torch.arange(blend.T))
    assert torch.allclose(keys, blend.full_k, atol=1e-5)
    assert torch.equal(blend.blend([])[0], blend.reused_k)


# ----------------------------------------------------------------------------- folders that do not exist
@pytest.mark.parametrize("path", ["/nonexistent/model", "./no-such-model", "assets/no-such-model",
                                  Path("no-such-model"), "~/no-such-model-here"])
def test_loading_a_model_from_a_missing_folder_names_the_path(path):
    with pytest.raises(ValueError, match=rf"name_or_path '{re.escape(str(path))}' names a local folder that does not exist"):
        load_model(path)


def test_a_kv_shape_from_a_missing_or_unreadable_config_names_the_path(tmp_path):
    with pytest.raises(ValueError, match=r"config '/nonexistent/model' must be a model folder holding config.json"):
        kv.shape_from_config("/nonexistent/model")
    with pytest.raises(ValueError, match="config.json does not exist"):
        kv.shape_from_config(tmp_path)                                   # a folder without a config
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a readable JSON config"):
        kv.shape_from_config(tmp_path)
    assert kv.shape_from_config(Path("assets/models/tiny-gpt2")).n_layers == 4
