"""LLMEngine and ModelRunner: logits equal to Hugging Face, greedy equal to ``model.generate``
with preemption (recompute, swap), prefix caching and chunked prefill; preemption keeps every output; a randomised
stream test (hypothesis); speculative-decoding hooks."""

import pytest
import torch
from helpers import prompts_for
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from labsupport import timing
from labsupport.engine import BlockManager, EngineConfig, LLMEngine, ModelRunner
from labsupport.engine.extend import extend
from labsupport.generation import generate
from labsupport.sampling import GREEDY

GREEDY_NO_EOS = GREEDY.replace(ignore_eos=True)


_SOLO: dict = {}


def solo(lm, prompt, n):
    """Tokens of the request's solo run: greedy, KV-cached HF forward, EOS ignored (memoised)."""
    key = (id(lm), tuple(prompt), n)
    if key not in _SOLO:
        _SOLO[key] = generate(lm, list(prompt), GREEDY_NO_EOS, max_new_tokens=n, record=False).token_ids
    return _SOLO[key]


def hf_generate(lm, prompt, n):
    """``model.generate`` greedy (stops at EOS, which it includes, like the engine's token_ids)."""
    ids = torch.tensor([prompt])
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                            pad_token_id=lm.eos_token_id)
    new = out[0, len(prompt):].tolist()
    return new[:new.index(lm.eos_token_id) + 1] if lm.eos_token_id in new else new


# ---------------------------------------------------------------------------- logits
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_logits_equal_hf_at_prefill_and_every_decode_step(tiny_lm, block_size):
    lengths = [5, 11, 1, 17]
    prompts = prompts_for(tiny_lm, lengths, seed=block_size)
    bm = BlockManager(num_blocks=256 // block_size + 8, block_size=block_size)
    runner = ModelRunner(tiny_lm, block_size, bm.num_blocks)
    seqs = {i: list(p) for i, p in enumerate(prompts)}
    out = extend(runner, bm, seqs)                                  # mixed-length prefill batch
    with torch.no_grad():
        for i, p in seqs.items():
            ref = tiny_lm.model(torch.tensor([p])).logits[0]
            assert out[i].shape == ref.shape
            torch.testing.assert_close(out[i], ref, atol=1e-4, rtol=0)
        for step in range(6):                                      # decode steps (seq 0: 2 tokens each)
            new = {i: [int(out[i][-1].argmax())] * (2 if i == 0 else 1) for i in seqs}
            out = extend(runner, bm, new)
            for i in seqs:
                seqs[i] += new[i]
                ref = tiny_lm.model(torch.tensor([seqs[i]])).logits[0, -len(new[i]):]
                torch.testing.assert_close(out[i], ref, atol=1e-4, rtol=0)
    bm.audit()


def test_logits_equal_hf_with_prefill_and_decode_rows_mixed(tiny_lm):
    """One forward holding a prefill chunk of one sequence and decode rows of others."""
    p1, p2, p3 = prompts_for(tiny_lm, [9, 14, 20], seed=7)
    bm = BlockManager(num_blocks=32, block_size=4)
    runner = ModelRunner(tiny_lm, 4, 32)
    extend(runner, bm, {"a": p1, "b": p2})
    out = extend(runner, bm, {"a": [3], "c": p3[:8], "b": [5]})   # decode, prefill chunk, decode
    out2 = extend(runner, bm, {"c": p3[8:]})                        # the rest of c's prompt
    with torch.no_grad():
        ref_a = tiny_lm.model(torch.tensor([p1 + [3]])).logits[0, -1:]
        ref_b = tiny_lm.model(torch.tensor([p2 + [5]])).logits[0, -1:]
        ref_c = tiny_lm.model(torch.tensor([p3])).logits[0]
    torch.testing.assert_close(out["a"], ref_a, atol=1e-4, rtol=0)
    torch.testing.assert_close(out["b"], ref_b, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.cat([out["c"], out2["c"]]), ref_c, atol=1e-4, rtol=0)


def test_runner_rejects_non_gpt2_and_long_sequences(tiny_lm):
    with pytest.raises(ValueError, match="GPT-2"):
        ModelRunner(torch.nn.Linear(2, 2), 4, 4)
    runner = ModelRunner(tiny_lm, 16, 8)
    bm = BlockManager(8, 16)
    with pytest.raises(ValueError, match="n_positions"):
        extend(runner, bm, {0: [1] * 65})


# ---------------------------------------------------------------------------- speculative hooks
def test_extend_and_rollback_for_draft_verification(tiny_lm):
    prompt, drafts = prompts_for(tiny_lm, [7, 5], seed=3)
    bm = BlockManager(num_blocks=16, block_size=4)
    runner = ModelRunner(tiny_lm, 4, 16)
    extend(runner, bm, {"s": prompt})
    last = 11
    out = extend(runner, bm, {"s": [last] + drafts})               # γ = 5 drafts: γ + 1 rows
    assert out["s"].shape[0] == 6
    accepted = drafts[:2]                                          # say 2 accepted, 3 rejected
    table = bm.block_table("s")                                    # 13 tokens in 4 blocks of 4
    freed = bm.truncate("s", bm.num_slots("s") - 3)
    assert bm.num_slots("s") == len(prompt) + 1 + 2
    assert freed == table[3:] and bm.block_table("s") == table[:3]  # 10 tokens need 3 blocks
    out = extend(runner, bm, {"s": [42]})                           # the correction token
    seq = prompt + [last] + accepted + [42]
    with torch.no_grad():
        ref = tiny_lm.model(torch.tensor([seq])).logits[0, -1:]
    torch.testing.assert_close(out["s"], ref, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="num_tokens"):
        bm.truncate("s", 99)
    bm.audit()


# ---------------------------------------------------------------------------- greedy = model.generate
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_equals_model_generate_under_preemption(tiny_lm, mode):
    prompts = prompts_for(tiny_lm, [5, 8, 12, 3, 7, 10], seed=12)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=12, preemption_mode=mode, num_cpu_blocks=64)
    outs = engine.generate(prompts, GREEDY_NO_EOS, max_tokens=20)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for p, o in zip(prompts, outs):
        assert o.token_ids == solo(tiny_lm, p, 20)
    bm = engine.block_manager
    assert bm.num_free_blocks == 12 and bm.num_free_cpu_blocks == bm.num_cpu_blocks


def test_prefix_caching_reuses_blocks_and_keeps_outputs(tiny_lm):
    (shared,) = prompts_for(tiny_lm, [13], seed=21)
    tails = prompts_for(tiny_lm, [3, 5, 2], seed=22)
    prompts = [shared + t for t in tails]
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=64, enable_prefix_caching=True, record_history=True)
    first = engine.generate(prompts[:1], GREEDY, max_tokens=8)
    rest = engine.generate(prompts[1:], GREEDY, max_tokens=8)
    for p, o in zip(prompts, first + rest):
        assert o.token_ids == hf_generate(tiny_lm, p, 8)
    assert engine.block_manager.num_prefix_hit_blocks >= 2 * 3               # 3 full shared blocks, twice
    admitted = next(h.scheduled_tokens for h in engine.history if set(h.scheduled_tokens) & {"1", "2"})
    assert admitted["1"] == len(prompts[1]) - 12                       # only the uncached tail is computed


# ---------------------------------------------------------------------------- preemption keeps every output
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_every_output(tiny_lm, mode):
    prompts = prompts_for(tiny_lm, [6, 6, 6, 6], seed=16)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=10, preemption_mode=mode, num_cpu_blocks=16)
    outs = engine.generate(prompts, GREEDY_NO_EOS, max_tokens=12)
    assert sum(o.metrics.num_preemptions for o in outs) > 0            # the pool forced preemption
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == 12 and o.finish_reason == "length"
        assert o.token_ids == solo(tiny_lm, p, 12)                    # no duplicate or missing token
        assert len(o.metrics.token_times) == 12
    bm = engine.block_manager
    assert bm.num_free_blocks == 10 and bm.num_used_blocks == 0 and bm.num_free_cpu_blocks == bm.num_cpu_blocks
    bm.audit()


# ---------------------------------------------------------------------------- requests that can never fit
def test_request_that_never_fits_errors_at_once_and_others_go_on(tiny_lm):
    prompts = prompts_for(tiny_lm, [5, 40, 6], seed=41)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8)           # 32 slots
    ids = [engine.add_request(p, GREEDY_NO_EOS, max_tokens=6) for p in prompts]
    first = {o.request_id: o for o in engine.step()}
    assert first[ids[1]].finished and first[ids[1]].finish_reason == "error"
    assert "blocks" in first[ids[1]].error and first[ids[1]].token_ids == []
    outs = {o.request_id: o for o in engine.run()}
    for i in (0, 2):
        assert outs[ids[i]].token_ids == solo(tiny_lm, prompts[i], 6)
    wide = LLMEngine(tiny_lm, block_size=4, num_blocks=32)            # 128 slots, n_positions = 64
    full = wide.add_request([1] * 64, GREEDY, max_tokens=1)       # the prompt alone fills the window
    assert wide.output(full).finish_reason == "error" and "context window" in wide.output(full).error
    near = wide.add_request([1] * 60, GREEDY_NO_EOS, max_tokens=10)   # fits: runs until the window is full
    done = {o.request_id: o for o in wide.run()}
    assert done[near].finish_reason == "length" and len(done[near].token_ids) == 4
    assert done[near].token_ids == solo(tiny_lm, [1] * 60, 4)
    engine2 = LLMEngine(tiny_lm, block_size=4, num_blocks=64, max_num_batched_tokens=16)
    rid = engine2.add_request([1] * 20, GREEDY, max_tokens=2)
    assert engine2.run()[0].finish_reason == "error" and rid == "0"


def test_bad_input_raises_value_error(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([])
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([10 ** 6])
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        engine.add_request([1], max_tokens=0)
    engine.add_request([1], request_id="x")
    with pytest.raises(ValueError, match="already"):
        engine.add_request([1], request_id="x")
    with pytest.raises(ValueError, match="unknown engine settings"):
        LLMEngine(tiny_lm, blocksize=4)
    with pytest.raises(ValueError, match="preemption_mode"):
        LLMEngine(tiny_lm, preemption_mode="drop")


# ---------------------------------------------------------------------------- sampling, fork, stop, metrics
def test_parallel_sampling_shares_prompt_blocks_copy_on_write(tiny_lm):
    (p,) = prompts_for(tiny_lm, [6], seed=61)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32, record_history=True)
    outs = engine.generate([p], GREEDY_NO_EOS.replace(n=3), max_tokens=5)
    assert [o.request_id for o in outs] == ["0", "0.1", "0.2"]
    assert all(o.token_ids == solo(tiny_lm, p, 5) for o in outs)
    after_fork = engine.history[1]
    tables = after_fork.block_tables
    assert tables["0"][0] == tables["0.1"][0] == tables["0.2"][0]    # the full prompt block is shared
    assert after_fork.ref_counts[tables["0"][0]] == 3
    assert len(after_fork.copied) == 2                                 # the half block: two copies, one in place
    assert engine.block_manager.num_used_blocks == 0


def test_stop_string_cuts_text(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    (p,) = prompts_for(tiny_lm, [5], seed=71)
    full = engine.generate([p], GREEDY_NO_EOS, max_tokens=12)[0]
    half = len(full.text) // 2                  # a stop string from the second half, not blank (a fixed seed: always found)
    stop = next(full.text[i:i + 3] for i in range(half, len(full.text) - 2) if full.text[i:i + 3].strip())
    out = engine.generate([p], GREEDY_NO_EOS.replace(stop=(stop,)), max_tokens=12)[0]
    assert out.finish_reason == "stop" and stop not in out.text
    assert full.text.startswith(out.text) and len(out.token_ids) < 12


def test_metrics_with_a_virtual_clock(tiny_lm):
    from labsupport.engine.metrics import goodput, summarize, throughput

    ticks = iter(range(1000))
    engine = LLMEngine(tiny_lm, EngineConfig(block_size=4, num_blocks=32, clock=lambda: float(next(ticks))))
    a, b = prompts_for(tiny_lm, [4, 4], seed=81)
    engine.add_request(a, GREEDY_NO_EOS, max_tokens=3)             # arrives at t=0
    engine.add_request(b, GREEDY_NO_EOS, max_tokens=5)             # t=1
    outs = engine.run()                                                # steps stamp t=2,3,4,5,6
    m0, m1 = outs[0].metrics, outs[1].metrics
    assert m0.token_times == [2.0, 3.0, 4.0] and m1.token_times == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert (m0.ttft, m1.ttft, m0.tpot, m1.tpot) == (2.0, 1.0, 1.0, 1.0)
    assert m0.itl == [1.0, 1.0] and m1.e2e_latency == 5.0
    assert throughput([m0, m1]) == 8 / 6
    assert goodput([m0, m1], ttft_slo=1.5) == 1 / 6                    # only b met TTFT ≤ 1.5
    assert summarize([m0, m1])["requests"] == 2
    with pytest.raises(ValueError, match="ttft_slo"):
        goodput([m0], ttft_slo=0)


# ---------------------------------------------------------------------------- randomised streams
request_st = st.tuples(st.integers(0, 6),       # arrival step
                       st.integers(1, 14),      # prompt length
                       st.integers(1, 16),      # output length
                       st.integers(0, 2))       # shares a prefix with others (0 = no)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@example(requests=[(0, 6, 12, 0)] * 4 + [(2, 9, 14, 1)], block_size=4, pool_tokens=40, mode="swap",
         prefix_caching=False, chunk=None, max_num_seqs=4, seed=0)
@example(requests=[(0, 10, 16, 2), (0, 12, 16, 2), (1, 5, 16, 1), (3, 14, 8, 0)], block_size=2, pool_tokens=36,
         mode="swap", prefix_caching=True, chunk=3, max_num_seqs=4, seed=1)
@example(requests=[(0, 10, 16, 2), (0, 12, 16, 2), (1, 5, 16, 1), (3, 14, 8, 0)], block_size=4, pool_tokens=40,
         mode="recompute", prefix_caching=True, chunk=7, max_num_seqs=3, seed=2)
@given(requests=st.lists(request_st, min_size=1, max_size=7),
       block_size=st.sampled_from([1, 2, 4, 8]),
       pool_tokens=st.integers(8, 48),
       mode=st.sampled_from(["recompute", "swap"]),
       prefix_caching=st.booleans(),
       chunk=st.sampled_from([None, 3, 7]),
       max_num_seqs=st.integers(2, 4),
       seed=st.integers(0, 3))
def test_random_request_streams(tiny_lm, requests, block_size, pool_tokens, mode, prefix_caching, chunk,
                                max_num_seqs, seed):
    """Random arrivals, lengths, pools (often too small, forcing preemption) and settings."""
    num_blocks = max(2, pool_tokens // block_size)
    vocab = tiny_lm.model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, vocab, (10,), generator=g).tolist()
    engine = LLMEngine(tiny_lm, block_size=block_size, num_blocks=num_blocks, preemption_mode=mode,
                       num_cpu_blocks=64, enable_prefix_caching=prefix_caching,
                       enable_chunked_prefill=chunk is not None, max_prefill_chunk=chunk,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max(8, max_num_seqs) if chunk else 64)
    bm = engine.block_manager
    prompts, lengths, pending = {}, {}, sorted(enumerate(requests), key=lambda r: r[1][0])
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][0] <= step:
            _, (_, plen, olen, share) = pending.pop(0)
            tail = torch.randint(0, vocab, (plen,), generator=g).tolist()
            prompt = (shared[:4 * share] + tail)[:max(plen, 4 * share)]
            rid = engine.add_request(prompt, GREEDY_NO_EOS, max_tokens=olen)
            prompts[rid], lengths[rid] = prompt, olen
        if engine.has_unfinished_requests():
            engine.step()
        bm.audit()
        assert bm.num_free_blocks + bm.num_used_blocks + bm.num_evictable_blocks == num_blocks
        step += 1
        assert step < 2000, "the engine stopped making progress"
    for rid, prompt in prompts.items():
        out = engine.output(rid)
        assert out.finished
        if out.finish_reason == "error":
            slots = len(prompt) + lengths[rid] - 1
            assert bm.blocks_needed(slots) > num_blocks or (chunk is None and slots > 64)
            assert out.token_ids == []
        else:
            assert out.token_ids == solo(tiny_lm, prompt, lengths[rid])
    assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == num_blocks
    assert bm.num_free_cpu_blocks == bm.num_cpu_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.scheduler.swapped


# ---------------------------------------------------------------------------- pool recycling through the engine, fork, snapshots
def test_sequential_requests_recycle_the_pool(tiny_lm):
    prompts = prompts_for(tiny_lm, [6] * 11, seed=15)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8, enable_prefix_caching=True)
    bm = engine.block_manager
    for p in prompts[:10]:
        (out,) = engine.generate([p], GREEDY_NO_EOS, max_tokens=4)
        assert out.token_ids == solo(tiny_lm, p, 4)
        assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == 8
        bm.audit()
    assert bm.num_evictions > 0
    (out,) = engine.generate([prompts[10]], GREEDY_NO_EOS, max_tokens=4)     # the 11th allocates
    assert out.token_ids == solo(tiny_lm, prompts[10], 4)
    assert bm.num_prefix_hit_tokens(prompts[0]) == 0                          # evicted: a miss
    assert bm.num_prefix_hit_tokens(prompts[10]) == 4                         # recent: a hit


def test_fork_a_decoding_request(tiny_lm):
    (p,) = prompts_for(tiny_lm, [5], seed=91)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    rid = engine.add_request(p, GREEDY_NO_EOS, max_tokens=8)
    engine.step()
    engine.step()
    with pytest.raises(ValueError, match="n must be"):
        engine.fork(rid, 0)
    children = engine.fork(rid, 2)
    assert children == ["0.1", "0.2"]
    assert engine.block_manager.block_table("0.1") == engine.block_manager.block_table(rid)
    engine.run()
    ref = solo(tiny_lm, p, 8)
    assert all(engine.output(r).token_ids == ref for r in [rid, *children])
    assert engine.block_manager.num_used_blocks == 0


def test_snapshot_describes_queues_and_pool(tiny_lm):
    prompts = prompts_for(tiny_lm, [6, 6, 6], seed=92)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=6, max_num_seqs=2, record_history=True)
    for p in prompts:
        engine.add_request(p, GREEDY_NO_EOS, max_tokens=6)
    engine.run()
    first = engine.history[0]
    assert first.step == 1 and first.running == ["0", "1"] and first.waiting == ["2"]
    assert first.scheduled_tokens == {"0": 6, "1": 6} and first.num_batched_tokens == 12
    assert first.num_slots == {"0": 6, "1": 6}
    assert [len(t) for t in first.block_tables.values()] == [2, 2]
    for snap in engine.history:
        assert snap.num_free_blocks + snap.num_evictable_blocks + snap.num_used_blocks == snap.num_blocks == 6
        used = {b for t in snap.block_tables.values() for b in t}
        assert all((snap.ref_counts[b] > 0) == (b in used) for b in range(6))
    assert engine.history[-1].finished and not engine.history[-1].running


def test_row_bucket_is_the_first_bucket_that_holds_the_rows_and_rejects_bad_counts():
    from labsupport.engine.linear import ROW_BUCKETS, bucket_of
    assert [bucket_of(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 65, 500)] == [1, 2, 4, 4, 8, 8, 16, 16, 64, 64, 64, 64]
    assert ROW_BUCKETS[-1] == 64
    with pytest.raises(ValueError, match=r"m must be an integer >= 1, got 0"):
        bucket_of(0)
    with pytest.raises(TypeError, match="m must be an integer"):
        bucket_of(1.5)


def test_linear_and_measure_name_the_bad_argument():
    from labsupport.engine.linear import Linear, measure
    with pytest.raises(TypeError, match="weight must be a tensor, got list"):
        Linear([[1.0]])
    with pytest.raises(TypeError, match="bias must be a tensor or None, got list"):
        Linear(torch.ones(2, 2), [1.0, 2.0])
    with pytest.raises(TypeError, match="out_in must be True or False"):
        Linear(torch.ones(2, 2), out_in="yes")
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\), got \(2,\)"):
        Linear(torch.ones(2, 3), torch.ones(2))
    lin = Linear(torch.ones(8, 4))
    with pytest.raises(ValueError, match="linears must hold at least one matrix"):
        measure([], 1)
    with pytest.raises(ValueError, match="m must be an integer >= 1, got 0"):
        measure([lin], 0)
    with pytest.raises(ValueError, match="after must be one of .*got 'foo'"):
        measure([lin], 2, "foo")
    assert set(measure([lin], 2, "x W", repeats=1, rounds=1)) == set(lin.kernels)


@pytest.mark.parametrize("out_in", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_helper_gives_x_w_plus_b_on_every_kernel(out_in, with_bias):
    """x W, Wᵀ xᵀ and prepacked oneDNN at every row count, and after a choice has pruned the rest:
    the same product."""
    from labsupport.engine.linear import KERNELS, ROW_BUCKETS, Linear

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 80, generator=gen)                                 # (in, out)
    b = torch.randn(80, generator=gen) if with_bias else None
    lin = Linear(w.t().contiguous() if out_in else w, b, out_in=out_in)
    assert lin.shape == (48, 80)
    assert lin.kernels[:2] == KERNELS[:2]                                   # oneDNN where the build has it
    assert lin.copies == ("x W",) and (lin.w_io.data_ptr() == w.data_ptr()) == (not out_in)   # the model's own
    xs = [torch.randn(m, 48, generator=gen) for m in (1, 2, 5, 17, 70)]
    for k in lin.kernels:
        for x in xs:
            y = lin.run(x, k)
            assert y.shape == (x.shape[0], 80) and y.is_contiguous()
            torch.testing.assert_close(y, x @ w + (0 if b is None else b), atol=1e-4, rtol=1e-4)
    lin.choose({bk: "Wᵀ xᵀ" for bk in ROW_BUCKETS[1:]})                    # one row keeps x W
    assert lin.copies == ("x W", "Wᵀ xᵀ") and lin.packed is None
    assert lin.choices == {1: "x W", **{bk: "Wᵀ xᵀ" for bk in ROW_BUCKETS[1:]}}
    for x in xs:
        torch.testing.assert_close(lin(x), x @ w + (0 if b is None else b), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="kernel must be one of"):
        lin.run(xs[0], "x  W")                                              # a typo runs nothing
    with pytest.raises(ValueError, match="bucket must be one of"):
        lin.choose({3: "x W"})


def test_tune_takes_the_fastest_kernel_per_bucket_with_a_margin_for_x_w(monkeypatch, tmp_path):
    """A fake clock: each kernel costs what the table says; tune must pick the cheapest per bucket,
    keep x W on a near-tie (< MARGIN), count the cost of switching after a one-row step (up to 16
    rows: verification steps), and cache the choice per shape."""
    from labsupport.engine import linear as L

    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])       # linear times through labsupport.timing
    monkeypatch.setattr(L, "_TUNED", {})
    monkeypatch.setenv("LABSUPPORT_CACHE_DIR", str(tmp_path))                 # no choice cached for this machine yet
    cost = {"x W": lambda m: 1.0 + m, "Wᵀ xᵀ": lambda m: 1.0 + 0.5 * m if m < 16 else 1.0 + 0.98 * m,
            "oneDNN": lambda m: 2.0 if m <= 8 else 99.0 if m < 64 else 0.98 * (1.0 + m)}
    calls = []
    real_run = L.Linear.run

    def fake_run(self, x, kernel):                   # switching kernels costs 5: oneDNN's 2.0 at 4–8 rows loses
        clock[0] += cost[kernel](x.shape[0]) + (5.0 if calls and calls[-1] != kernel else 0.0)
        calls.append(kernel)
        return real_run(self, x, kernel)
    monkeypatch.setattr(L.Linear, "run", fake_run)
    lins = [L.Linear(torch.randn(8, 12), torch.randn(12)) for _ in range(2)]
    if "oneDNN" not in lins[0].kernels:
        pytest.skip("this torch build has no oneDNN linear")
    got = L.tune(lins)
    # 16: 0.98× of x W alone, but x W pays two switches a step after the one-row Wᵀ xᵀ; 64 (timed alone): near-ties
    expect = {1: "Wᵀ xᵀ", 2: "Wᵀ xᵀ", 4: "Wᵀ xᵀ", 8: "Wᵀ xᵀ", 16: "Wᵀ xᵀ", 64: "x W"}
    assert list(got.values()) == [expect] and lins[0].choices == lins[1].choices == expect
    assert lins[0].copies == ("x W", "Wᵀ xᵀ") and lins[0].packed is None            # oneDNN's copy pruned
    n = len(calls)
    more = L.Linear(torch.randn(8, 12), torch.randn(12))
    assert L.tune([more]) == got and len(calls) == n and more.choices == expect       # cached: not timed again
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        L.measure(lins, 2, repeats=0)


def test_measure_repeats_a_short_pass_until_a_block_lasts_min_timed(monkeypatch):
    """Fake clock, x W costs 3 units a pass at 2 rows: with MIN_TIMED = 0 each kernel runs its
    repeats (1) after one untimed pass; with MIN_TIMED = 100 units, ⌈100 / 3⌉ = 34 of them."""
    from labsupport.engine import linear as L

    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])       # linear times through labsupport.timing
    calls = []
    real_run = L.Linear.run

    def fake_run(self, x, kernel):
        clock[0] += 1.0 + x.shape[0]
        calls.append(kernel)
        return real_run(self, x, kernel)
    monkeypatch.setattr(L.Linear, "run", fake_run)
    lin = L.Linear(torch.randn(8, 12))
    kernels = len(lin.kernels)
    for floor, repeats in ((0.0, 1), (100.0, 34)):
        monkeypatch.setattr(L, "MIN_TIMED", floor)
        calls.clear()
        times = L.measure([lin], 2, repeats=1, rounds=1)
        assert times == {k: 3.0 for k in lin.kernels}
        assert len(calls) == 2 + kernels * (repeats + 1)           # the calibrating pass, then each kernel


def test_linear_takes_a_strided_bias_and_refuses_bad_shapes():
    from labsupport.engine.linear import Linear

    w, x = torch.randn(16, 8), torch.randn(6, 16)
    bias = torch.randn(16)[::2]                                           # not contiguous
    torch.testing.assert_close(Linear(w, bias)(x), x @ w + bias, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        Linear(w, torch.randn(1))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        Linear(torch.randn(8))
    with pytest.raises(TypeError, match="weight must be a tensor, got list"):
        Linear([[1.0]])


def test_kernel_choices_are_timed_once_per_machine_and_read_back_by_every_process(monkeypatch, tmp_path):
    """#51/#53: a choice timed anew in each process could differ and round a seeded request's logits
    differently; tune stores it per machine and shape, and a new process (an empty _TUNED) reads it back."""
    import json

    from labsupport.engine import linear as L

    monkeypatch.setenv("LABSUPPORT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(L, "_TUNED", {})
    timed = []
    choice = {b: ("Wᵀ xᵀ" if b in (2, 4) else "x W") for b in L.ROW_BUCKETS}
    monkeypatch.setattr(L, "_choose", lambda group, repeats: timed.append(group[0].shape) or dict(choice))
    lins = [L.Linear(torch.randn(16, 8)), L.Linear(torch.randn(16, 8)), L.Linear(torch.randn(8, 4))]
    first = L.tune(lins)
    assert len(timed) == 2 and all(L.SOURCES[k] == "measured" for k in first)          # two shapes, timed once each
    stored = json.loads(L.cache_path().read_text())
    assert list(stored) == [L.machine_key()] and len(stored[L.machine_key()]) == 2
    monkeypatch.setattr(L, "_TUNED", {})                                                 # a new process
    again = L.tune([L.Linear(torch.randn(16, 8))])
    assert len(timed) == 2 and again == {k: v for k, v in first.items() if k in again}   # read, not timed
    assert all(L.SOURCES[k] == "cached" for k in again)
    monkeypatch.setattr(L, "machine_key", lambda: "another machine")                    # another CPU: timed anew
    monkeypatch.setattr(L, "_TUNED", {})
    L.tune([L.Linear(torch.randn(16, 8))])
    assert len(timed) == 3 and len(json.loads(L.cache_path().read_text())) == 2
    L.cache_path().write_text("{not json")                                               # a broken file: timed, rewritten
    monkeypatch.setattr(L, "_TUNED", {})
    L.tune([L.Linear(torch.randn(16, 8))])
    assert len(timed) == 4 and json.loads(L.cache_path().read_text())
