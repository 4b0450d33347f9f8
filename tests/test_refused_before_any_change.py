"""A call the package refuses changes nothing first, and an awkward but valid input is served: a KV-tier
promotion that evicts its own entry, non-finite or non-float prefilled K/V, token ids checked before a block
is taken, errors that name the argument, shape_from_config naming what a config lacks, a prompt character a
panel cannot encode, a goodput panel given an errored request, and an unpicklable worker task refused at once."""

from __future__ import annotations

import time

import pytest
import torch

from labsupport.engine import LLMEngine
from labsupport.engine.block_manager import BlockManager
from labsupport.models import load_model
from labsupport.sampling import GREEDY, SamplingParams


@pytest.fixture(scope="module")
def shipped():
    return load_model("tiny-gpt2", device="cpu")


# ---------------------------------------------------------------------------- KV tiers
@pytest.mark.parametrize("disk_capacity", [8, 0])
def test_promotion_survives_its_own_block_demoting_the_entry(shipped, disk_capacity):
    """Taking a pool block for A demotes B's block into the one-entry CPU tier, which used to push
    A itself down to disk (AttributeError) or drop it (KeyError) in the middle of its promotion."""
    from labsupport.serving.tiers import TieredKVCache

    eng = LLMEngine(shipped, block_size=4, num_blocks=4, enable_prefix_caching=True)
    tiers = TieredKVCache(eng, cpu_capacity=1, disk_capacity=disk_capacity)
    a = list(range(10, 15))
    eng.add_request(a, GREEDY, max_tokens=1)
    eng.run()
    eng.add_request(list(range(100, 116)), GREEDY, max_tokens=1)
    eng.run()
    counts = tiers.promote(a)
    assert counts["cpu"] + counts["disk"] == 1 and counts["miss"] == 0
    tiers.audit()
    out = tiers.engine.generate([a], GREEDY, max_tokens=3)[0]
    assert out.token_ids == LLMEngine(shipped, block_size=4, num_blocks=16).generate([a], GREEDY, 3)[0].token_ids


# ---------------------------------------------------------------------------- prefilled requests
@pytest.mark.parametrize("bad, error", [(lambda z: z.long(), TypeError), (lambda z: z.bool(), TypeError),
                                        (lambda z: z + float("nan"), ValueError),
                                        (lambda z: z + float("inf"), ValueError)])
def test_add_prefilled_request_refuses_kv_that_is_not_finite_floats(tiny_lm, bad, error):
    eng = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    r = eng.runner
    kv = bad(torch.zeros(r.num_layers, 2, 3, r.num_heads, r.head_dim))
    with pytest.raises(error, match="kv"):
        eng.add_prefilled_request([5, 6, 7], 8, kv)
    assert eng.block_manager.num_free_blocks == 32 and not eng.requests


# ---------------------------------------------------------------------------- the block manager
@pytest.mark.parametrize("ids", ["abcd", [1.0, 2.5], [1, None], [True, 2]])
def test_allocate_validates_token_ids_before_taking_a_block(ids):
    bm = BlockManager(8, 4)
    with pytest.raises(TypeError, match="token_ids"):
        bm.allocate("a", ids)
    assert bm.num_free_blocks == 8 and bm.block_tables() == {}
    bm.audit()
    bm.allocate("b", [1, 2, 3])
    with pytest.raises(TypeError, match="token_ids"):
        bm.append_slots("b", [4, "x"])
    assert bm.num_slots("b") == 3 and bm.num_free_blocks == 7
    bm.audit()


# ---------------------------------------------------------------------------- bad arguments, named
def test_bad_arguments_raise_errors_that_name_them(tiny_lm):
    from labsupport.serving.cacheblend import CacheBlend
    from labsupport.speculative import MedusaHeads, MedusaProposer, SpeculativeEngine

    eng = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        eng.add_request([1, 2], None)
    with pytest.raises(TypeError, match="seed"):
        SamplingParams(seed="a")
    with pytest.raises(TypeError, match="request_id"):
        eng.abort_request(0)
    with pytest.raises(ValueError, match="choices"):
        MedusaProposer(MedusaHeads(64, 3), choices=[])
    with pytest.raises(TypeError, match="heads"):
        MedusaProposer("heads")
    with pytest.raises(ValueError, match="n_embd 32"):
        SpeculativeEngine(tiny_lm, MedusaProposer(MedusaHeads(32, 3))).generate(["hi"], GREEDY)
    with pytest.raises(ValueError, match=r"chunks\[1\]"):
        CacheBlend(eng.runner, [[1, 2, 3], [4, -5, 6]], [7, 8])
    with pytest.raises(ValueError, match="question"):
        CacheBlend(eng.runner, [[1, 2, 3]], [])
    with pytest.raises(TypeError, match="text must be a str"):
        tiny_lm.encode(None)


def test_shape_from_config_names_what_is_missing():
    from transformers import GPT2Config

    from labsupport.kv import shape_from_config

    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64).to_dict()
    assert shape_from_config(cfg).n_layers == 2
    with pytest.raises(ValueError, match="vocab_size"):
        shape_from_config({k: v for k, v in cfg.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="n_positions"):
        shape_from_config({k: v for k, v in cfg.items() if k != "n_positions"})
    with pytest.raises(ValueError, match="n_head must be an integer >= 1"):
        shape_from_config(dict(cfg, n_head=0))
    with pytest.raises(TypeError, match="config must be"):
        shape_from_config(None)


# ---------------------------------------------------------------------------- panels say what was typed wrong
def test_panels_name_a_prompt_character_that_cannot_be_encoded(shipped):
    from labsupport.widgets.sampling import sampling_lab, temperature_panel

    for make in (sampling_lab, temperature_panel):
        box = make(shipped)
        box.controls["prompt"].value = "ab\ud800c"
        shown = box.stats.value
        assert "U+D800" in shown and "position 2" in shown, shown
        box.controls["prompt"].value = "The default value is"            # and it keeps working
        assert "U+D800" not in box.stats.value


def test_goodput_lab_takes_a_request_that_finished_with_an_error(tiny_lm):
    from labsupport.widgets.batching import goodput_lab

    outs = LLMEngine(tiny_lm, block_size=4, num_blocks=8).generate([[1, 2, 3], [5] * 60], GREEDY, 4)
    assert [o.finish_reason for o in outs][1] == "error" and outs[1].metrics.ttft is None
    box = goodput_lab({"8 blocks": [o.metrics for o in outs]})
    assert box is not None


# ---------------------------------------------------------------------------- worker processes
@pytest.mark.slow
def test_an_unpicklable_task_argument_fails_at_once_naming_it():
    from labsupport.parallel.launcher import WorkerGroup

    with WorkerGroup(1, backend="gloo", timeout_s=30, wait=False) as g:
        t0 = time.monotonic()
        with pytest.raises(TypeError, match="argument 'fn'.*not picklable"):
            g.run("labsupport.parallel.tensor:tp_generate", timeout_s=30, fn=lambda x: x)
        assert time.monotonic() - t0 < 10

