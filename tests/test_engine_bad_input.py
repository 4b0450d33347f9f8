"""Bad inputs and edge cases of the paged-KV engine (LLMEngine, ModelRunner, block manager,
scheduler): settings out of range, request ids, pools at the edge, swap of shared blocks,
chunked prefill, prefix caching, seeds, random streams with forks.

Rules checked: bad input raises an error naming the parameter; no IndexError; every request
added to the engine ends with a finish reason and the block pool is whole at the end.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers import pool_is_whole, prompts_for

from labsupport.engine import LLMEngine, ModelRunner
from labsupport.engine.attention import build_metadata
from labsupport.engine.metrics import goodput
from labsupport.generation import generate
from labsupport.sampling import GREEDY, SamplingParams

NO_EOS = GREEDY.replace(ignore_eos=True)


@pytest.mark.parametrize("prompt", [[1.7, 2], ["a"], [[1, 2]], None, 5, [True, 3], torch.tensor([[1, 2]])])
def test_add_request_prompt_of_wrong_type_is_a_type_error(tiny_lm, prompt):
    with pytest.raises(TypeError, match="prompt"):
        LLMEngine(tiny_lm, block_size=4, num_blocks=8).add_request(prompt, NO_EOS, max_tokens=2)


# ============================================================================ engine: settings and ids
@pytest.mark.parametrize("setting, value", [
    ("num_blocks", 0), ("num_blocks", -3), ("block_size", 0), ("block_size", -1),
    ("num_cpu_blocks", -1), ("max_num_batched_tokens", 0), ("max_num_seqs", 0),
    ("max_prefill_chunk", 0),
])
def test_engine_settings_out_of_range(tiny_lm, setting, value):
    """max_num_batched_tokens=0 used to be silently replaced by the default; num_cpu_blocks=-1
    was accepted in recompute mode; seed='a' was a RuntimeError from torch."""
    kwargs = {"enable_chunked_prefill": True} if setting == "max_prefill_chunk" else {}
    with pytest.raises(ValueError, match=setting):
        LLMEngine(tiny_lm, **{setting: value}, **kwargs)


@pytest.mark.parametrize("setting, value", [("block_size", 2.0), ("seed", "a"), ("num_blocks", True)])
def test_engine_settings_of_wrong_type(tiny_lm, setting, value):
    with pytest.raises(TypeError, match=setting):
        LLMEngine(tiny_lm, **{setting: value})


def test_auto_request_ids_skip_ids_the_user_took(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=16)
    assert engine.add_request([1, 2], NO_EOS, max_tokens=2, request_id="1") == "1"
    assert engine.add_request([1, 2], NO_EOS, max_tokens=2) == "0"
    assert engine.add_request([1, 2], NO_EOS, max_tokens=2) == "2"   # was "already in use"
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1], NO_EOS, request_id="2")
    engine.run()
    pool_is_whole(engine)


@pytest.mark.parametrize("finish_first", [False, True])
def test_fork_children_never_clobber_a_user_request(tiny_lm, finish_first):
    """A user request named "0.2" and a request "0" with n = 3: the children used to be named
    "0.2" (a ValueError in the middle of step, or the finished user request overwritten)."""
    a, b = prompts_for(tiny_lm, [3, 4], seed=5)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    engine.add_request(a, NO_EOS, max_tokens=2, request_id="0.2")
    if finish_first:
        engine.run()
    outs = engine.generate([b], NO_EOS.replace(n=3), max_tokens=3)
    assert [o.request_id for o in outs] == ["0", "0.1", "0.3"]
    assert all(o.token_ids == generate(tiny_lm, b, NO_EOS, max_new_tokens=3).token_ids for o in outs)
    user = engine.output("0.2")
    assert user.prompt_ids == a and user.token_ids == generate(tiny_lm, a, NO_EOS, max_new_tokens=2).token_ids
    pool_is_whole(engine)


def test_add_request_bad_arrival_time(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8, clock=lambda: 10.0)
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([1], NO_EOS, arrival_time=11.0)          # in the future: negative queue time
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([1], NO_EOS, arrival_time="now")
    rid = engine.add_request([1], NO_EOS, max_tokens=1, arrival_time=4.0)
    engine.run()
    assert engine.output(rid).metrics.ttft == 6.0


def test_goodput_bad_slo_types():
    for value in ("1", float("nan"), -1.0, True):
        with pytest.raises(ValueError, match="ttft_slo"):
            goodput([], ttft_slo=value)


def test_runner_rejects_empty_batch_bad_ids_and_negative_starts(tiny_lm):
    runner = ModelRunner(tiny_lm, 4, 8)
    vocab = tiny_lm.model.config.vocab_size
    with pytest.raises(ValueError, match="empty batch"):
        runner.forward([], [], [])
    with pytest.raises(ValueError, match="token ids"):
        runner.forward([[vocab]], [0], [[0]])                        # was an IndexError
    with pytest.raises(ValueError, match="token ids"):
        runner.forward([[-1]], [0], [[0]])
    with pytest.raises(ValueError, match="start_positions"):
        build_metadata([1], [-1], [[0]], 4)                          # position -1 wrapped to the last one
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        ModelRunner(tiny_lm, 4, 8, num_cpu_blocks=-2)


# ============================================================================ engine: pools at the edge
def test_step_with_nothing_queued(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=4)
    assert engine.step() == [] and engine.step() == [] and not engine.has_unfinished_requests()
    assert engine.run() == [] and engine.generate([]) == []
    pool_is_whole(engine)


def test_one_block_pool_and_a_prompt_exactly_filling_the_pool(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=1)
    ok = engine.add_request([1, 2, 3], NO_EOS, max_tokens=2)     # 4 slots: exactly one block
    bad = engine.add_request([1, 2, 3], NO_EOS, max_tokens=3)    # 5 slots
    engine.run()
    assert engine.output(ok).token_ids == generate(tiny_lm, [1, 2, 3], NO_EOS, max_new_tokens=2).token_ids
    assert engine.output(bad).finish_reason == "error" and engine.output(bad).token_ids == []
    pool_is_whole(engine)
    (p8, p7) = prompts_for(tiny_lm, [8, 7], seed=9)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=2)
    ids = [engine.add_request(p8, NO_EOS, max_tokens=1),        # prompt = the whole pool
           engine.add_request(p7, NO_EOS, max_tokens=2),
           engine.add_request(p8, NO_EOS, max_tokens=2)]         # one slot too many
    engine.run()
    assert engine.output(ids[0]).token_ids == generate(tiny_lm, p8, NO_EOS, max_new_tokens=1).token_ids
    assert engine.output(ids[1]).token_ids == generate(tiny_lm, p7, NO_EOS, max_new_tokens=2).token_ids
    assert engine.output(ids[2]).finish_reason == "error"
    pool_is_whole(engine)


def test_requests_added_while_running_and_never_fitting_ones_mixed_in(tiny_lm):
    prompts = prompts_for(tiny_lm, [5, 30, 7, 3, 33], seed=13)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=7, max_num_seqs=2)   # 28 slots
    ids = []
    for p in prompts:
        ids.append(engine.add_request(p, NO_EOS, max_tokens=6))
        engine.step()
    engine.run()
    for rid, p in zip(ids, prompts):
        out = engine.output(rid)
        if len(p) + 5 > 28:
            assert out.finish_reason == "error" and "blocks" in out.error
        else:
            assert out.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=6).token_ids
    pool_is_whole(engine)


# ============================================================================ engine: swap of shared blocks
@pytest.mark.parametrize("params", [NO_EOS, SamplingParams(temperature=0.8, top_k=20, seed=3, ignore_eos=True)])
def test_swapping_out_two_forks_that_share_a_block(tiny_lm, params):
    """Two forks sharing a block swapped out in one step: the step's swap-out plan was a dict
    keyed by the device block, so the second fork's copy replaced the first's and that fork
    later swapped in a CPU block that was never written (zeros, or stale KV)."""
    a, b = prompts_for(tiny_lm, [3, 5], seed=26)
    engine = LLMEngine(tiny_lm, block_size=8, num_blocks=2, preemption_mode="swap", num_cpu_blocks=8)
    engine.add_request(a, NO_EOS, max_tokens=4)
    engine.add_request(b, params.replace(n=3), max_tokens=8, request_id="b")
    engine.step()                                                   # both prefills; b forks into b, b.1, b.2
    engine.step()                                                   # b's copy-on-write preempts b.2 and b.1
    bm, runner = engine.block_manager, engine.runner
    assert bm.is_swapped("b.1") and bm.is_swapped("b.2")
    m = bm.num_slots("b.1")
    resident = runner.kv_cache[:, :, bm.block_table("b")[0], :m]   # the same prompt + first token
    for fork in ("b.1", "b.2"):
        torch.testing.assert_close(runner.cpu_cache[:, :, bm.block_table(fork)[0], :m], resident)
    engine.run()
    for k, rid in enumerate(["b", "b.1", "b.2"]):
        ref = generate(tiny_lm, b, params.replace(seed=None if params.seed is None else params.seed + k),
                       max_new_tokens=8)
        assert engine.output(rid).token_ids == ref.token_ids, rid
    pool_is_whole(engine)


@pytest.mark.parametrize("mode, cpu", [("recompute", 0), ("swap", 16), ("swap", 0), ("swap", 1)])
def test_parallel_sampling_under_memory_pressure(tiny_lm, mode, cpu):
    """n = 4 seeded samples in a pool that holds about two: forks are preempted (copy-on-write
    blocks shared), swapped or recomputed; sample k equals generate() with seed + k."""
    (p,) = prompts_for(tiny_lm, [6], seed=31)
    params = SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.1, n=4, seed=7, ignore_eos=True)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=5, preemption_mode=mode, num_cpu_blocks=cpu)
    outs = engine.generate([p], params, max_tokens=8)
    assert [o.request_id for o in outs] == ["0", "0.1", "0.2", "0.3"]
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for k, o in enumerate(outs):
        assert o.finish_reason == "length"
        assert o.token_ids == generate(tiny_lm, p, params.replace(seed=7 + k, n=1), max_new_tokens=8).token_ids
    pool_is_whole(engine)


# ============================================================================ engine: chunked prefill, prefix caching
def test_chunked_prefill_with_chunk_one(tiny_lm):
    prompts = prompts_for(tiny_lm, [5, 3, 9], seed=41)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=16, enable_chunked_prefill=True, max_prefill_chunk=1,
                       max_num_batched_tokens=2, max_num_seqs=2, record_history=True)
    outs = engine.generate(prompts, NO_EOS, max_tokens=5)
    for p, o in zip(prompts, outs):
        assert o.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=5).token_ids
    assert max(n for h in engine.history for n in h.scheduled_tokens.values()) == 1
    pool_is_whole(engine)


def test_prefix_caching_identical_prompts_diverging_in_the_last_partial_block(tiny_lm):
    (base,) = prompts_for(tiny_lm, [6], seed=51)                    # one full block + 2 tokens
    prompts = [base + [11], base + [12], base + [11], base[:4]]
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=12, enable_prefix_caching=True)
    first = engine.generate(prompts[:1], NO_EOS, max_tokens=4)
    rest = engine.generate(prompts[1:], NO_EOS, max_tokens=4)
    for p, o in zip(prompts, first + rest):
        assert o.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=4).token_ids
    bm = engine.block_manager
    assert bm.num_prefix_hit_tokens(base + [99]) == 4           # only the full block is shared
    assert bm.num_prefix_hit_tokens(base[:4]) == 0               # a hit must leave one token to compute
    assert bm.num_prefix_hit_blocks == 2
    pool_is_whole(engine)


def test_eviction_then_the_same_prefix_again(tiny_lm):
    """Pool of 8 blocks of 4: A is cached, enough other prompts evict it, then A again is a
    miss (recomputed, same output), and right after that a hit."""
    prompts = prompts_for(tiny_lm, [6] * 6, seed=15)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8, enable_prefix_caching=True)
    bm = engine.block_manager
    ref = {i: generate(tiny_lm, p, NO_EOS, max_new_tokens=4).token_ids for i, p in enumerate(prompts)}
    (out,) = engine.generate([prompts[0]], NO_EOS, max_tokens=4)
    assert bm.num_prefix_hit_tokens(prompts[0]) == 4
    for i in range(1, 6):
        engine.generate([prompts[i]], NO_EOS, max_tokens=4)
    assert bm.num_evictions > 0 and bm.num_prefix_hit_tokens(prompts[0]) == 0
    hits = bm.num_prefix_hit_blocks
    (again,) = engine.generate([prompts[0]], NO_EOS, max_tokens=4)
    assert again.token_ids == out.token_ids == ref[0] and bm.num_prefix_hit_blocks == hits
    (third,) = engine.generate([prompts[0]], NO_EOS, max_tokens=4)
    assert third.token_ids == ref[0] and bm.num_prefix_hit_blocks == hits + 1
    pool_is_whole(engine)


# ============================================================================ engine: seeds
def test_seeded_engine_outputs_reproducible_and_equal_to_generate(tiny_lm):
    """Same seed → same tokens, whatever the batch mates, pool size or preemption; equal to
    labsupport.generation.generate with the same SamplingParams (both draw one multinomial per
    token from a torch.Generator seeded with params.seed)."""
    prompts = prompts_for(tiny_lm, [5, 7, 4], seed=61)
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
                             seed=100 + i, ignore_eos=True) for i in range(3)]
    refs = [generate(tiny_lm, p, sp, max_new_tokens=10).token_ids for p, sp in zip(prompts, params)]
    for settings in ({"num_blocks": 64}, {"num_blocks": 6, "preemption_mode": "recompute"},
                     {"num_blocks": 6, "preemption_mode": "swap", "num_cpu_blocks": 8},
                     {"num_blocks": 64, "enable_chunked_prefill": True, "max_prefill_chunk": 2,
                      "max_num_batched_tokens": 4, "max_num_seqs": 4}):
        engine = LLMEngine(tiny_lm, block_size=4, **settings)
        ids = [engine.add_request(p, sp, max_tokens=10) for p, sp in zip(prompts, params)]
        engine.run()
        assert [engine.output(r).token_ids for r in ids] == refs, settings
        pool_is_whole(engine)


# ============================================================================ engine: random streams with forks
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_with_forks_sampling_swap_and_chunks(tiny_lm, seed):
    """Random small pools with n > 1, seeded sampling, swap (with little CPU space), prefix
    caching and 1-token chunks; every output equals its generate() reference."""
    rng = random.Random(seed)
    vocab = tiny_lm.model.config.vocab_size
    bs = rng.choice([1, 2, 4, 8])
    chunk = rng.choice([None, 1, 3])
    max_num_seqs = rng.randint(1, 4)
    engine = LLMEngine(tiny_lm, block_size=bs, num_blocks=max(2, rng.randint(8, 40) // bs),
                       preemption_mode=rng.choice(["recompute", "swap"]), num_cpu_blocks=rng.choice([0, 2, 64]),
                       enable_prefix_caching=rng.random() < 0.5, enable_chunked_prefill=chunk is not None,
                       max_prefill_chunk=chunk, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max(4, max_num_seqs) if chunk else 64)
    shared = [rng.randrange(vocab) for _ in range(8)]
    pending = []
    for _ in range(rng.randint(2, 5)):
        p = (shared[:rng.choice([0, 4, 8])] + [rng.randrange(vocab) for _ in range(rng.randint(1, 10))])
        sp = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), top_k=rng.choice([0, 5]),
                            repetition_penalty=rng.choice([1.0, 1.2]), n=rng.choice([1, 2, 3]),
                            seed=rng.randrange(100), ignore_eos=True)
        pending.append((rng.randint(0, 4), p, sp, rng.randint(1, 8)))
    pending.sort(key=lambda r: r[0])
    added, step = {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, p, sp, m = pending.pop(0)
            added[engine.add_request(p, sp, max_tokens=m)] = (p, sp, m)
        engine.step()
        engine.block_manager.audit()
        step += 1
        assert step < 1000
    for rid, (p, sp, m) in added.items():
        out = engine.output(rid)
        forks = sorted((r for r in engine.requests if r.startswith(rid + ".")), key=lambda r: engine.requests[r].order)
        if out.finish_reason == "error":
            assert out.token_ids == [] and not forks
            continue
        samples = [rid, *forks]
        assert len(samples) == sp.n
        for k, r in enumerate(samples):
            ref = generate(tiny_lm, p, sp.replace(seed=sp.seed + k, n=1), max_new_tokens=m, record=False)
            assert engine.output(r).token_ids == ref.token_ids, (r, engine.config)
    pool_is_whole(engine)


def test_parallel_samples_of_a_one_token_request(tiny_lm):
    """n = 3 with max_new_tokens = 1: the forks are made and finish in the same step."""
    (p,) = prompts_for(tiny_lm, [5], seed=81)
    params = SamplingParams(temperature=1.0, n=3, seed=9, ignore_eos=True)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=2)
    outs = engine.generate([p], params, max_tokens=1)
    assert [(o.request_id, o.finish_reason) for o in outs] == [("0", "length"), ("0.1", "length"), ("0.2", "length")]
    for k, o in enumerate(outs):
        assert o.token_ids == generate(tiny_lm, p, params.replace(seed=9 + k, n=1), max_new_tokens=1).token_ids
    pool_is_whole(engine)
