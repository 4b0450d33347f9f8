"""The request API of the engine: abort_request, several end-of-sequence ids, the context window."""

from __future__ import annotations

import random

import pytest
from helpers import prompts_for

from labsupport.engine import EngineConfig, LLMEngine
from labsupport.generation import generate
from labsupport.sampling import SamplingParams

GREEDY_NO_EOS = SamplingParams(temperature=0.0, ignore_eos=True)


def solo(lm, prompt, n):
    return generate(lm, list(prompt), GREEDY_NO_EOS, max_new_tokens=n, record=False).token_ids


def test_abort_in_every_state_frees_blocks_and_leaves_others_unchanged(tiny_lm):
    prompts = prompts_for(tiny_lm, [6, 30, 5, 7], seed=3)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=14, max_num_seqs=3, enable_chunked_prefill=True,
                       max_prefill_chunk=8, preemption_mode="swap", num_cpu_blocks=16)
    ids = [engine.add_request(p, GREEDY_NO_EOS, max_tokens=10) for p in prompts]
    engine.step()
    assert engine.requests[ids[1]].num_computed_tokens < 30          # mid chunked prefill
    assert engine.requests[ids[3]].status == "waiting"
    aborted = engine.abort_request([ids[1], ids[3]])                     # running-in-prefill and waiting
    assert [o.request_id for o in aborted] == [ids[1], ids[3]]
    assert all(o.finished and o.finish_reason == "abort" for o in aborted)
    assert not engine.block_manager.has_seq(ids[1])
    engine.block_manager.audit()
    outs = {o.request_id: o for o in engine.run()}
    assert ids[1] not in outs and ids[3] not in outs                    # reported once, by abort_request
    for i in (0, 2):
        assert outs[ids[i]].token_ids == solo(tiny_lm, prompts[i], 10)
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == bm.num_blocks
    with pytest.raises(ValueError, match="unknown"):
        engine.abort_request("nope")
    assert engine.abort_request(ids[0]) == []                           # already finished: nothing to do


def test_random_aborts_keep_survivors_identical_and_pool_whole(tiny_lm):
    rng = random.Random(11)
    for trial in range(6):
        prompts = prompts_for(tiny_lm, [rng.randint(1, 20) for _ in range(6)], seed=100 + trial)
        engine = LLMEngine(tiny_lm, block_size=4, num_blocks=rng.randint(10, 24), max_num_seqs=4,
                           enable_chunked_prefill=rng.random() < 0.5, max_prefill_chunk=6,
                           enable_prefix_caching=rng.random() < 0.5,
                           preemption_mode=rng.choice(["recompute", "swap"]), num_cpu_blocks=32)
        ids = [engine.add_request(p, GREEDY_NO_EOS, max_tokens=rng.randint(1, 12)) for p in prompts]
        doomed = set(rng.sample(ids, 2))
        done = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = o
            engine.block_manager.audit()
            live = [r for r in doomed if not engine.requests[r].is_finished]
            if live and rng.random() < 0.4:
                engine.abort_request(live[0])
                doomed.discard(live[0])
                engine.block_manager.audit()
        for rid, p in zip(ids, prompts):
            o = engine.output(rid)
            assert o.finished
            if o.finish_reason != "abort":
                assert o.token_ids == solo(tiny_lm, p, engine.requests[rid].max_new_tokens)
        bm = engine.block_manager
        assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == bm.num_blocks
        assert bm.num_free_cpu_blocks == bm.num_cpu_blocks


def test_every_eos_id_of_the_model_stops_a_request(tiny_lm):
    for seed in range(50):                                             # a prompt whose greedy run changes token
        prompt = prompts_for(tiny_lm, [8], seed=seed)[0]
        free_run = solo(tiny_lm, prompt, 12)
        k = next((i for i in range(1, len(free_run)) if free_run[i] not in free_run[:i]), None)
        if k is not None:
            break
    third = free_run[k]                                                # a token first produced at step k
    tiny_lm.model.generation_config.eos_token_id = [tiny_lm.eos_token_id, third]
    try:
        engine = LLMEngine(tiny_lm, block_size=4, num_blocks=16)
        out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12))[0]
    finally:
        tiny_lm.model.generation_config.eos_token_id = tiny_lm.eos_token_id
    assert third in engine.eos_token_ids
    stop_at = free_run.index(third) + 1
    assert out.finish_reason == "stop" and out.token_ids == free_run[:stop_at]
    assert out.text == tiny_lm.decode(free_run[:stop_at - 1])          # the end id is not in the text


def test_engine_config_checks_its_own_fields():
    with pytest.raises(TypeError, match="enable_chunked_prefill"):
        EngineConfig(enable_chunked_prefill="False")
    with pytest.raises(TypeError, match="clock"):
        EngineConfig(clock=None)
    with pytest.raises(TypeError, match="block_size"):
        EngineConfig(block_size=4.0)
    with pytest.raises(ValueError, match="num_blocks"):
        EngineConfig(num_blocks=0)
    with pytest.raises(ValueError, match="preemption_mode"):
        EngineConfig(preemption_mode="evict")
    import numpy as np
    assert EngineConfig(block_size=np.int64(8)).block_size == 8 and type(EngineConfig(block_size=np.int64(8)).block_size) is int


def test_forks_never_exceed_max_num_seqs(tiny_lm):
    params = SamplingParams(temperature=1.0, seed=7, n=10, max_tokens=5, ignore_eos=True)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=64, max_num_seqs=2, record_history=True)
    outs = engine.generate([[5, 6, 7, 8, 9]], params)
    assert len(outs) == 10 and all(len(o.token_ids) == 5 for o in outs)
    assert max(len(s.running) for s in engine.history) <= 2
    wide = LLMEngine(tiny_lm, block_size=4, num_blocks=64, max_num_seqs=16)
    assert [o.token_ids for o in wide.generate([[5, 6, 7, 8, 9]], params)] == [o.token_ids for o in outs]
    bm = engine.block_manager
    assert bm.num_used_blocks == 0


def test_runner_checks_block_ids_before_touching_the_cache(tiny_lm):
    from labsupport.engine import ModelRunner

    runner = ModelRunner(tiny_lm, 4, 8)
    with pytest.raises(ValueError, match="block_tables"):
        runner.forward([[1, 2]], [0], [[99]])
    with pytest.raises(ValueError, match="pairs"):
        runner.copy_blocks([(0, 99)])
    with pytest.raises(ValueError, match="mapping"):
        runner.swap_out({0: 3})                                       # no CPU swap space at all
    with pytest.raises(ValueError, match="mapping"):
        runner.swap_in({0: 1})


def test_add_request_takes_max_tokens_and_keeps_the_old_name_with_a_warning(tiny_lm):
    """vLLM's and SamplingParams' word is max_tokens; max_new_tokens still works, with a DeprecationWarning."""
    import warnings

    from labsupport.engine import LLMEngine
    from labsupport.sampling import SamplingParams

    greedy = SamplingParams(temperature=0, ignore_eos=True)
    new = LLMEngine(tiny_lm, block_size=4, num_blocks=16)
    new.add_request([1, 2, 3], greedy, max_tokens=5, request_id="a")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = LLMEngine(tiny_lm, block_size=4, num_blocks=16)
        old.add_request([1, 2, 3], greedy, max_new_tokens=5, request_id="a")
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == \
        ["max_new_tokens is deprecated: use max_tokens"]
    outs = [{o.request_id: o for o in engine.run()}["a"].token_ids for engine in (new, old)]
    assert outs[0] == outs[1] and len(outs[0]) == 5
    with pytest.raises(ValueError, match="give max_tokens or its old name max_new_tokens, not both"):
        new.add_request([1], greedy, max_tokens=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1, got 0"):
        new.add_request([1], greedy, max_tokens=0)
