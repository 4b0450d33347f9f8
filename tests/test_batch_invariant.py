"""Batch-invariant mode (``batch_invariant=True``): a request's logits bit-identical alone and in any
batch, for prefill and decode, chunked or whole, from the prefix cache or computed, with 8-bit KV —
and the settings it refuses."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import prompts_for

from labsupport.engine import BlockManager, EngineConfig, LLMEngine, ModelRunner
from labsupport.engine.batch_invariant import TILE_ROWS, tiled_matmul
from labsupport.engine.extend import extend
from labsupport.sampling import GREEDY, SamplingParams


@pytest.fixture(scope="module")
def runner(tiny_lm):
    return ModelRunner(tiny_lm, 16, 256, batch_invariant=True)


def _random_prompts(vocab: int, count: int, seed: int, longest: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(1, longest))] for _ in range(count)]


def _logits(runner, batch: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Every row's logits of one forward over ``batch`` (each a fresh prompt) in a fresh pool."""
    return extend(runner, BlockManager(runner.num_blocks, runner.block_size), batch)


def test_tiled_matmul_is_the_product_and_a_row_ignores_its_neighbours():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 80, generator=g), torch.randn(80, generator=g)
    x = torch.randn(2 * TILE_ROWS + 3, 48, generator=g)
    y = tiled_matmul(x, w, b)
    assert y.shape == (2 * TILE_ROWS + 3, 80)
    assert torch.allclose(y, x @ w + b, atol=1e-5)
    for m in range(1, 2 * TILE_ROWS + 2):                       # row 0 alone, and with m − 1 other rows
        others = torch.randn(m, 48, generator=g)
        others[0] = x[0]
        assert torch.equal(tiled_matmul(others, w, b)[0], y[0]), m


@pytest.mark.parametrize("batch_size", [2, 3, 8, 17])
def test_prefill_logits_are_bit_identical_alone_and_in_a_batch(runner, tiny_lm, batch_size):
    vocab = runner.vocab_size
    target = _random_prompts(vocab, 1, seed=1, longest=50)[0] + [5]
    alone = _logits(runner, {"t": target})["t"]
    for trial in range(3):
        others = _random_prompts(vocab, batch_size - 1, seed=10 * batch_size + trial)
        batch = {f"o{i}": p for i, p in enumerate(others)}
        where = trial % batch_size                                # the target first, last, in the middle
        items = list(batch.items())
        batch = dict(items[:where] + [("t", target)] + items[where:])
        assert torch.equal(_logits(runner, batch)["t"], alone), (batch_size, trial)


def test_chunked_prefill_and_decode_give_the_rows_of_one_whole_prefill(runner):
    prompt = _random_prompts(runner.vocab_size, 1, seed=3, longest=40)[0] + [1, 2, 3]
    whole = _logits(runner, {"t": prompt})["t"]                                # (len, V)
    for chunk in (1, 5, 16):                                                   # 1 = a decode per token
        bm, rows = BlockManager(runner.num_blocks, runner.block_size), []
        others = {f"o{i}": p for i, p in enumerate(_random_prompts(runner.vocab_size, 3, seed=chunk, longest=12))}
        extend(runner, bm, others)                                             # decoding neighbours
        for start in range(0, len(prompt), chunk):
            feed = {"t": prompt[start:start + chunk]} | {o: [start] for o in others}   # each neighbour decodes one
            rows.append(extend(runner, bm, feed)["t"])
        assert torch.equal(torch.cat(rows), whole), chunk


def test_prefix_cache_hits_give_the_same_logits_as_computing_the_prefix(tiny_lm):
    prompt = prompts_for(tiny_lm, [40])[0]
    shared, own = prompt[:32], prompt[32:]
    r = ModelRunner(tiny_lm, 16, 64, batch_invariant=True)
    bm = BlockManager(64, 16, enable_prefix_caching=True)
    first = extend(r, bm, {"a": shared + own})["a"]
    second = extend(r, bm, {"b": shared + own})["b"]                  # its first 32 tokens come from the cache
    assert len(second) < len(first)
    assert torch.equal(second, first[-len(second):])


def test_token_tree_rows_equal_the_chain_they_form(runner):
    prompt = _random_prompts(runner.vocab_size, 1, seed=4, longest=30)[0] + [9]
    chain = [11, 12, 13, 14]
    plain = extend(runner, BlockManager(runner.num_blocks, runner.block_size), {"t": prompt + chain})["t"]
    bm = BlockManager(runner.num_blocks, runner.block_size)
    extend(runner, bm, {"t": prompt})
    tree = extend(runner, bm, {"t": chain}, tree_parents={"t": [-1, 0, 1, 2]})["t"]
    assert torch.equal(tree, plain[-len(chain):])


def test_eight_bit_kv_is_batch_invariant_too(tiny_lm):
    r = ModelRunner(tiny_lm, 16, 128, kv_cache_dtype="int8", batch_invariant=True)
    target = _random_prompts(r.vocab_size, 1, seed=5)[0] + [7]
    alone = _logits(r, {"t": target})["t"]
    batch = {f"o{i}": p for i, p in enumerate(_random_prompts(r.vocab_size, 4, seed=6))} | {"t": target}
    assert torch.equal(_logits(r, batch)["t"], alone)


@pytest.mark.parametrize("params", [GREEDY.replace(ignore_eos=True),
                                    SamplingParams(temperature=1.0, seed=7, ignore_eos=True)],
                         ids=["greedy", "seeded"])
def test_the_engine_gives_one_request_the_same_tokens_in_any_mix(tiny_lm, params):
    """The request alone, then among other requests of other lengths with chunked prefill and
    prefix caching on: the same tokens every time (seeded sampling: draws from per-row logits)."""
    target = prompts_for(tiny_lm, [30], seed=1)[0]

    def run(others, **config):
        eng = LLMEngine(tiny_lm, EngineConfig(batch_invariant=True, **config))
        for p in others[:len(others) // 2]:
            eng.add_request(p, GREEDY, max_tokens=12)
        rid = eng.add_request(target, params, max_tokens=20)
        for p in others[len(others) // 2:]:
            eng.add_request(p, SamplingParams(temperature=0.8, seed=3), max_tokens=9)
        eng.run()
        return eng.output(rid).token_ids

    alone = run([])
    assert len(alone) == 20
    for k, config in enumerate([{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 24},
                                {"enable_prefix_caching": True, "max_num_seqs": 3}]):
        others = prompts_for(tiny_lm, [5 + 9 * i for i in range(1 + 2 * k)], seed=20 + k)
        if config.get("enable_prefix_caching"):
            others = [target[:16] + o for o in others]                      # they share its first block
        assert run(others, **config) == alone, config


def test_batch_invariant_refuses_what_it_cannot_run(tiny_lm):
    with pytest.raises(TypeError, match="batch_invariant must be a bool"):
        ModelRunner(tiny_lm, 16, 8, batch_invariant="yes")
    with pytest.raises(ValueError, match="quantization=None"):
        ModelRunner(tiny_lm, 16, 8, batch_invariant=True, quantization="int8")
    with pytest.raises(ValueError, match="'CPU_ATTN'"):
        EngineConfig(batch_invariant=True, attention_backend="CPU_ATTN")
    with pytest.raises(TypeError, match="batch_invariant"):
        EngineConfig(batch_invariant=1)
    r = ModelRunner(tiny_lm, 16, 8, batch_invariant=True)
    assert r.attention_backend == "TORCH_SDPA" and r.kernel_choices == {}
    assert all(m.choices == dict.fromkeys(m.choices, "x W") and m.copies == ("x W",) for m in r.matrices())
