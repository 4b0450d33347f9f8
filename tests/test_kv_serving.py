"""Serving around the KV cache: KV transfer and disaggregation, KV tiers, CacheBlend, routing,
context caching. Small random GPT-2s; the two-process test starts real workers (a few seconds)."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import make_tiny_lm

from labsupport import kv
from labsupport.engine import LLMEngine, NoFreeBlocksError
from labsupport.sampling import GREEDY
from labsupport.serving.cacheblend import CacheBlend
from labsupport.serving.context_cache import context_cache_report, prefill_flops
from labsupport.serving.disagg import DisaggregatedServer, ServeRequest, mixed_workload, run_colocated
from labsupport.serving.kv_transfer import KVConnector, LayerAssembler, LayerwiseKVConnector, recv_blocks
from labsupport.serving.router import ReplicaClock, Router, system_prompt_workload
from labsupport.serving.tiers import TieredKVCache, run_chat


@pytest.fixture(scope="module")
def lm():
    return make_tiny_lm(seed=3, n_positions=128)


def _prompts(n: int, vocab: int, seed: int, low: int = 3, high: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(low, high))).tolist() for _ in range(n)]


def _vocab(lm) -> int:
    return lm.model.config.vocab_size


# ----------------------------------------------------------------------------- KV transfer

def test_read_kv_then_write_kv_round_trips_through_other_blocks(lm):
    eng = LLMEngine(lm, block_size=4, num_blocks=32)
    r = eng.runner
    src, dst = [3, 7, 1], [10, 2, 20]
    r.kv_cache.normal_(generator=torch.Generator().manual_seed(0))
    kv = r.read_kv(src, 10)
    assert kv.shape == (r.num_layers, 2, 10, r.num_heads, r.head_dim)
    r.write_kv(dst, kv)
    assert torch.equal(r.read_kv(dst, 10), kv)
    assert torch.equal(r.kv_cache[:, :, 10], r.kv_cache[:, :, 3])            # whole first block moved
    with pytest.raises(ValueError, match="block table"):
        r.read_kv(src, 13)
    with pytest.raises(ValueError, match="shape"):
        r.write_kv(dst, kv[:, :1])


def test_prefilled_requests_decode_exactly_like_one_engine(lm):
    """Prefill engine (max 1 token) → connector → add_prefilled_request on a second engine:
    greedy outputs equal one colocated engine's, bytes shipped = prompt_len · 2·L·H·D·4."""
    prompts = _prompts(6, _vocab(lm), seed=1)
    ref = LLMEngine(lm, block_size=4, num_blocks=128).generate(prompts, GREEDY, max_tokens=12)
    prefill = LLMEngine(lm, block_size=4, num_blocks=64)
    prefill.kv_connector = KVConnector()
    for i, p in enumerate(prompts):
        prefill.add_request(p, GREEDY, 1, str(i))
        prefill.kv_connector.max_new_tokens[str(i)] = 12
    prefill.run()
    assert prefill.block_manager.num_used_blocks == 0
    decode = LLMEngine(lm, block_size=8, num_blocks=128)                         # another block size
    shape = kv.shape_from_config(lm.model.config)
    for payload in prefill.kv_connector.sent:
        assert payload.num_bytes == kv.kv_bytes(shape, len(payload.prompt_ids), kv_dtype="fp32")
        assert payload.num_bytes == len(payload.prompt_ids) * decode.runner.kv_bytes_per_token
        decode.add_prefilled_request(payload.prompt_ids, payload.first_token, payload.kv, GREEDY,
                                     payload.max_new_tokens, payload.request_id)
    decode.run()
    for i, out in enumerate(ref):
        assert decode.output(str(i)).token_ids == out.token_ids
    decode.block_manager.audit()
    assert prefill.kv_connector.bytes_sent == sum(len(p) for p in prompts) * decode.runner.kv_bytes_per_token


@pytest.mark.slow
def test_layerwise_streaming_assembles_the_same_kv(lm):
    """Layer pieces streamed during a chunked prefill with prefix hits add up to the whole KV:
    a decode engine given them continues exactly as one engine would."""
    import multiprocessing as mp

    recv_end, send_end = mp.Pipe(duplex=False)
    prompts = _prompts(2, _vocab(lm), seed=11, low=30, high=40)
    prompts.append(prompts[0][:20] + prompts[1][:7])                            # shares 5 blocks with prompt 0
    eng = LLMEngine(lm, block_size=4, num_blocks=64, enable_prefix_caching=True, enable_chunked_prefill=True,
                    max_prefill_chunk=8)
    conn = LayerwiseKVConnector(send_end)
    conn.attach(eng)
    for i, p in enumerate(prompts):
        conn.layerwise.add(str(i))
        eng.add_request(p, GREEDY, 1, str(i))
        eng.run()
    conn.close()
    assert eng.requests["2"].num_prefix_hit_tokens == 20                    # the prefix-hit path was taken
    assembler, done, pieces = LayerAssembler(), {}, 0
    while recv_end.poll(0.5):
        payload = assembler.add(recv_blocks(recv_end, 1.0))
        pieces += payload is None
        if payload is not None:
            done[payload.request_id] = payload
    assert pieces > 3 * eng.runner.num_layers                                   # several chunks per layer
    for i, p in enumerate(prompts):
        got = done[str(i)]
        assert got.kv.shape == (eng.runner.num_layers, 2, len(p), eng.runner.num_heads, eng.runner.head_dim)
        want = LLMEngine(lm, block_size=4, num_blocks=64).generate([p], GREEDY, 6)[0].token_ids
        assert got.first_token == want[0]
        dec = LLMEngine(lm, block_size=8, num_blocks=64)
        dec.add_prefilled_request(p, got.first_token, got.kv, GREEDY, 6)
        assert dec.run()[0].token_ids == want, i


def test_add_prefilled_request_checks_before_changing_anything(lm):
    eng = LLMEngine(lm, block_size=4, num_blocks=3, max_num_seqs=1)
    r = eng.runner
    good = torch.zeros(r.num_layers, 2, 5, r.num_heads, r.head_dim)
    with pytest.raises(ValueError, match="shape"):
        eng.add_prefilled_request([1, 2, 3, 4, 5], 7, good[:, :, :4])
    assert not eng.requests and eng.block_manager.num_used_blocks == 0
    # 20 tokens can never fit 3 blocks of 4: an error result at once, not a NoFreeBlocksError to wait on forever
    never = eng.add_prefilled_request(list(range(20)), 7, torch.zeros(r.num_layers, 2, 20, r.num_heads, r.head_dim))
    assert eng.block_manager.num_used_blocks == 0
    rid = eng.add_prefilled_request([1, 2, 3, 4, 5], 7, good, GREEDY, 1)         # one token: done at once
    outs = eng.step()
    assert [o.request_id for o in outs] == [never, rid]
    assert outs[0].finish_reason == "error" and "KV slots" in outs[0].error and outs[0].token_ids == []
    assert outs[1].finish_reason == "length" and outs[1].token_ids == [7]
    eng.block_manager.audit()
    busy = eng.add_prefilled_request([1, 2, 3], 7, good[:, :, :3], GREEDY, 4)    # running: max_num_seqs=1 is full
    with pytest.raises(NoFreeBlocksError):                                       # room later, not never
        eng.add_prefilled_request([4, 5, 6], 7, good[:, :, :3], GREEDY, 4)
    assert eng.requests[busy].status.name == "RUNNING" and len(eng.requests) == 3


@pytest.mark.slow
def test_two_process_disaggregation_matches_colocated(lm):
    reqs = mixed_workload(_vocab(lm), num_pairs=2, long_prompt=60, long_new=3, short_prompt=6, short_new=10,
                          gap=0.0, seed=4)
    kw = {"block_size": 8, "num_blocks": 64, "max_num_seqs": 4}
    colo = run_colocated(lm, reqs, **kw)
    with DisaggregatedServer(lm, kw, kw, timeout=90) as server:
        runs = [server.serve(reqs), server.serve([replace(r, request_id=r.request_id + "L") for r in reqs], layerwise=True)]
        procs = list(server._procs)
    assert all(not p.is_alive() for p in procs)                                # cleaned up
    per_token = LLMEngine(lm, **kw).runner.kv_bytes_per_token
    for suffix, dis in zip(("", "L"), runs):
        for r in reqs:
            got = dis[r.request_id + suffix]
            assert got.token_ids == colo[r.request_id].token_ids, (r.request_id, suffix)
            assert got.kv_bytes == len(r.prompt_ids) * per_token
            assert got.transfer_time >= 0
            assert len(got.token_times) == len(got.token_ids)


def test_disaggregated_server_rejects_non_gpt2():
    with pytest.raises(ValueError, match="GPT-2"):
        DisaggregatedServer(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError):
        mixed_workload(100, num_pairs=0)
    assert isinstance(ServeRequest("a", [1], 1), ServeRequest)


# ----------------------------------------------------------------------------- tiers

def _chat(lm, seed=0):
    rng = np.random.default_rng(seed)
    v = _vocab(lm)
    system = rng.integers(0, v, 10).tolist()
    convs = [[rng.integers(0, v, 6).tolist() for _ in range(4)] for _ in range(4)]
    return system, convs


@pytest.mark.parametrize("cpu,disk", [(6, 40), (0, 40), (4, 0), (2, 3)])
def test_tiers_account_for_every_block_and_keep_outputs(lm, cpu, disk, tmp_path):
    system, convs = _chat(lm)
    base = LLMEngine(lm, block_size=4, num_blocks=12, enable_prefix_caching=True)
    plain = run_chat(base, None, convs, system, new_tokens=4)
    eng = LLMEngine(lm, block_size=4, num_blocks=12, enable_prefix_caching=True)
    with TieredKVCache(eng, cpu, disk, disk_dir=str(tmp_path)) as tiers:
        recs = run_chat(eng, tiers, convs, system, new_tokens=4)
        tiers.audit()
        assert eng.block_manager.num_evictions > 0                              # the pool was too small
        assert sum(tiers.demoted.values()) > 0
        assert tiers.promoted["cpu"] + tiers.promoted["disk"] > 0 or cpu + disk <= 3
        assert len(tiers.cpu) <= cpu and len(tiers.disk) <= disk
        assert len(os.listdir(tmp_path)) == len(tiers.disk)
        # every request's blocks: served by a tier or missed, nothing else
        for r in recs:
            assert r["pool"] + r["cpu"] + r["disk"] + r["miss"] == (r["prompt_tokens"] - 1) // 4
        assert sum(r["computed"] for r in recs) <= sum(r["computed"] for r in plain)
        for a, b in zip(recs, plain):
            assert eng.output(a["request_id"]).token_ids == base.output(b["request_id"]).token_ids
    assert os.listdir(tmp_path) == [] and eng.block_manager.pool.on_evict is None


def test_tier_promotion_restores_the_exact_kv(lm):
    eng = LLMEngine(lm, block_size=4, num_blocks=6, enable_prefix_caching=True)
    tiers = TieredKVCache(eng, cpu_capacity=1, disk_capacity=8)
    prompt = _prompts(1, _vocab(lm), seed=9, low=17, high=18)[0]                # 4 full blocks + 1
    tiers.add_request(prompt, GREEDY, 1)
    eng.run()
    table_kv = {k: eng.runner.kv_cache[:, :, b].clone() for k, b in eng.block_manager.pool._hash_index.items()}
    tiers.add_request(_prompts(1, _vocab(lm), seed=10, low=23, high=24)[0], GREEDY, 1)   # evicts all of them
    eng.run()
    assert set(table_kv) <= set(tiers.cpu) | set(tiers.disk) | set(eng.block_manager.pool._hash_index)
    counts = tiers.promote(prompt)
    assert counts["cpu"] + counts["disk"] >= 3 and counts["miss"] == 0
    for key, data in table_kv.items():
        assert torch.equal(eng.runner.kv_cache[:, :, eng.block_manager.pool._hash_index[key]], data)
    tiers.audit()
    tiers.close()


def test_tiers_reject_bad_settings(lm):
    with pytest.raises(ValueError, match="prefix_caching"):
        TieredKVCache(LLMEngine(lm, block_size=4, num_blocks=8), 4, 4)
    eng = LLMEngine(lm, block_size=4, num_blocks=8, enable_prefix_caching=True)
    with pytest.raises(ValueError):
        TieredKVCache(eng, -1, 4)
    with pytest.raises(TypeError):
        TieredKVCache(eng, 2.5, 4)


# ----------------------------------------------------------------------------- CacheBlend

@pytest.fixture(scope="module")
def blends(lm):
    chunks = _prompts(3, _vocab(lm), seed=5, low=12, high=20)
    q = _prompts(1, _vocab(lm), seed=6, low=5, high=6)[0]
    return {p: CacheBlend(LLMEngine(lm, block_size=4, num_blocks=1), chunks, q, answer_len=6, positions=p)
            for p in ("final", "zero")}


def test_cacheblend_full_prefill_matches_the_model(lm, blends):
    cb = blends["final"]
    ids = torch.tensor([cb.context + cb.question + cb.answer])
    with torch.no_grad():
        hf = torch.log_softmax(lm.model(ids).logits[0, -len(cb.answer) - 1:].float(), -1)
    assert torch.allclose(hf, cb.full_logprobs, atol=1e-4)


@pytest.mark.parametrize("positions", ["final", "zero"])
@pytest.mark.parametrize("method", ["deviation", "random"])
def test_cacheblend_recompute_all_equals_full_prefill(blends, positions, method):
    cb = blends[positions]
    res = cb.run(1.0, method)
    assert res.kl == 0.0 and res.top1 == 1.0 and res.selected == list(range(cb.T))
    keys, values = cb.blend(res.selected)
    assert torch.equal(keys, cb.full_k) and torch.equal(values, cb.full_v)


def test_cacheblend_reuse_as_is_has_an_error(blends):
    for cb in blends.values():
        none = cb.run(0.0, "none")
        assert none.kl > 0 and none.selected == [] and none.compute_fraction == 0
    # the first chunk is computed exactly as in the full prefill when chunks sit at their offsets
    cb = blends["final"]
    n0 = len(cb.chunks[0])
    assert torch.allclose(cb.reused_k[:, :n0], cb.full_k[:, :n0], atol=1e-6)
    assert torch.allclose(cb.reused_k[0], cb.full_k[0], atol=1e-6)              # layer 0: no cross-chunk term
    dev = cb.deviation()
    assert dev[:n0].max() < 1e-4 < dev[n0:].max()
    assert cb.select(0.25) == sorted(torch.topk(dev, round(0.25 * cb.T)).indices.tolist())


def test_cacheblend_rejects_bad_input(blends, lm):
    cb = blends["final"]
    with pytest.raises(ValueError, match="r"):
        cb.run(1.5)
    with pytest.raises(ValueError, match="method"):
        cb.run(0.5, "best")
    with pytest.raises(ValueError):
        CacheBlend(LLMEngine(lm, block_size=4, num_blocks=1), [[1, 2], []], [3])
    with pytest.raises(ValueError, match="n_positions"):
        CacheBlend(LLMEngine(lm, block_size=4, num_blocks=1), [[1] * 120], [3], answer_len=16)


# ----------------------------------------------------------------------------- routing

def test_routing_hit_rates_are_computed_from_the_replicas(lm):
    rng = np.random.default_rng(2)
    v = _vocab(lm)
    systems = [rng.integers(0, v, 24).tolist() for _ in range(4)]
    questions = [rng.integers(0, v, 5).tolist() for _ in range(6)]
    work = system_prompt_workload(systems, questions, 24, gap=0.001, new_tokens=2, seed=1)
    stats = {}
    for policy in ("round_robin", "prefix_affinity"):
        reps = Router.make_replicas(lm, 2, block_size=4, num_blocks=20, max_num_seqs=4)
        st = Router(reps, policy).run(work)
        for rid, i in st.replica.items():                                      # each number from its engine
            assert st.hit_tokens[rid] == reps[i].requests[rid].num_prefix_hit_tokens
            assert st.ttft[rid] == reps[i].requests[rid].metrics.ttft > 0
        assert st.hit_rate == sum(st.hit_tokens.values()) / sum(len(p) for _, p, _ in work)
        stats[policy] = st
    rr, pa = stats["round_robin"], stats["prefix_affinity"]
    assert sorted(set(rr.replica.values())) == [0, 1]
    assert pa.hit_rate > rr.hit_rate and pa.tokens_computed < rr.tokens_computed
    # affinity keeps each system prompt on one replica once it is cached there
    by_system = {}
    for (_, p, _), rid in zip(work, pa.replica):
        by_system.setdefault(tuple(p[:24]), set()).add(pa.replica[rid])
    assert sum(len(s) == 1 for s in by_system.values()) >= 3


def test_replica_clock_and_router_checks(lm):
    c = ReplicaClock()
    c.advance_to(2.0)
    assert c() == 2.0
    c.start()
    c.stop()
    assert c() >= 2.0
    with pytest.raises(ValueError, match="policy"):
        Router(Router.make_replicas(lm, 1, block_size=4, num_blocks=8), "random")
    with pytest.raises(ValueError, match="ReplicaClock"):
        Router([LLMEngine(lm, block_size=4, num_blocks=8, enable_prefix_caching=True)])


# ----------------------------------------------------------------------------- context caching

def test_context_cache_arithmetic():
    shape = kv.preset("Llama 3 8B")
    rep = context_cache_report()
    assert (rep.rag_tokens, rep.cached_tokens) == (6000, 500)
    assert rep.kv_held == 100_000 * 131_072                                    # 128 KiB per token
    lhd = 4 * 32 * 32 * 128
    assert prefill_flops(shape, 500, 100_000) == 500 * 2 * shape.n_params + lhd * 500 * (100_000 + 250.5)
    assert rep.rag_ttft == pytest.approx(prefill_flops(shape, 6000) / (0.5 * kv.H100_SXM.peak_flops))
    assert 1 < rep.ttft_ratio < 6000 / 500                                     # attention to 100k eats into 12×
    assert rep.cached_step > rep.rag_step
    with pytest.raises(ValueError):
        context_cache_report(mfu=0)


# ----------------------------------------------------------------------------- figures and panels

def test_figures_and_panels_build(lm, blends):
    from labsupport.viz import serving as vs
    from labsupport.widgets.serving import cacheblend_lab, tier_lab

    row = {"ttft_p50": 1.0, "ttft_p95": 2.0, "itl_p50": 0.5, "itl_p95": 0.9}
    assert len(vs.latency_bars_figure({"a": row, "b": row}).data) == 4
    assert len(vs.tier_figure({"pool": 3, "cpu": 1, "disk": 0, "miss": 2}, {"pool": 1.0, "miss": float("nan")}).data) == 2
    assert len(vs.blend_curve_figure({"x": ([0, 1], [0.1, 0.0], [0.5, 1.0])}, marker_r=0.5).data) == 2
    assert len(vs.routing_figure({"rr": {"hit_rate": 0.3, "ttft_p50_ms": 3, "tokens_computed": 10}}).data) == 3
    assert len(vs.serving_stack_figure().layout.shapes) == len(vs.STACK)
    assert len(vs.tradeoff_table_figure([("a", "b", "c", "d", "e")]).data) == 1
    panel = cacheblend_lab(blends, r=0.2)
    assert "KL" in panel.children[1].value
    r_s, method, _ = panel.children[0].children
    method.value = "none"                                  # reuse as is: r is greyed out, not "r = 20 %"
    assert r_s.disabled and "r does not apply" in panel.children[1].value and "r = 20" not in panel.children[1].value
    method.value = "deviation"
    assert not r_s.disabled and "r = 20 %" in panel.children[1].value
    system, convs = _chat(lm)
    panel = tier_lab(lm, system, convs[:2], num_blocks=8, block_size=4, new_tokens=2)
    assert "audit of every tier passed" in panel.children[1].value
    panel.children[0].children[1].value = 0                                     # callback runs, no exception
    assert "passed" in panel.children[1].value


def test_bounded_affinity_caps_the_favourites_load_and_a_policy_function_routes(lm):
    from labsupport.serving.router import MAX_LOAD_GAP, bounded_affinity, prefix_affinity

    prompt = list(range(20))
    assert prefix_affinity(prompt, [32, 16], [5, 0]) == 0                     # affinity ignores load
    assert bounded_affinity(prompt, [32, 16], [MAX_LOAD_GAP, 0]) == 0          # within the gap: the favourite
    assert bounded_affinity(prompt, [32, 16], [MAX_LOAD_GAP + 1, 0]) == 1      # beyond it: the least loaded
    assert bounded_affinity(prompt, [0, 0, 0], [0, 0, 0]) == prefix_affinity(prompt, [0, 0, 0], [0, 0, 0])
    assert prefix_affinity(prompt, [16, 16], [3, 1]) == 1                      # ties: the less loaded
    rng = np.random.default_rng(3)
    v = _vocab(lm)
    systems = [rng.integers(0, v, 24).tolist() for _ in range(2)]
    work = system_prompt_workload(systems, [rng.integers(0, v, 5).tolist() for _ in range(4)], 12, gap=0.0,
                                  new_tokens=2, seed=2)
    seen = []

    def to_last(prompt_ids, hits, loads):
        seen.append((len(hits), len(loads)))
        return len(hits) - 1

    st = Router(Router.make_replicas(lm, 2, block_size=4, num_blocks=20, max_num_seqs=4), to_last).run(work)
    assert set(st.replica.values()) == {1} and st.policy == "to_last" and seen == [(2, 2)] * len(work)
    with pytest.raises(ValueError, match="replica index"):
        Router(Router.make_replicas(lm, 2, block_size=4, num_blocks=20), lambda p, h, l: 7).run(work[:1])


def test_tier_economics_compares_a_copy_with_the_prefill_it_saves():
    from labsupport.serving.tiers import STORAGE_TIERS, StorageTier, tier_economics

    s = kv.preset("Llama 3 8B")
    per_token = kv.kv_bytes_per_token(s)
    recompute = kv.prefill_time(1, s.n_params) / 0.5
    slow = StorageTier("tape", 1e12, per_token / recompute / 2, 0.0)          # half the crossover bandwidth
    assert tier_economics(s, slow, 1000)["speedup"] == pytest.approx(0.5)
    assert tier_economics(s, slow, 1000)["crossover_tokens"] == math.inf
    dram = tier_economics(s, STORAGE_TIERS[1], 4096)
    assert dram["load_s"] == pytest.approx(10e-6 + 4096 * per_token / 64e9)
    assert dram["recompute_s"] == pytest.approx(4096 * recompute)
    assert dram["crossover_bandwidth"] == pytest.approx(per_token / recompute)
    hbm = tier_economics(s, STORAGE_TIERS[0], 16)
    assert hbm["tokens"] == int((80e9 - kv.weight_bytes(s, "bf16")) // per_token)   # what the weights leave
    with pytest.raises(ValueError, match="mfu"):
        tier_economics(s, STORAGE_TIERS[1], 16, mfu=0.0)
    with pytest.raises(ValueError, match="prefix_tokens"):
        tier_economics(s, STORAGE_TIERS[1], 0)


def test_cacheblend_context_only_is_the_yardstick_of_what_the_answer_reads(blends):
    """Every chunk alone at its final offset is exactly reuse as-is (r = 0, chunks at final offsets);
    no context at all is a real, different score; a bad chunk index is refused."""
    cb = blends["final"]
    kl_all, top1_all = cb.context_only(list(range(len(cb.chunks))))
    r0 = cb.run(0.0)
    assert kl_all == pytest.approx(r0.kl, abs=1e-6) and top1_all == pytest.approx(r0.top1)
    kl_none, _ = cb.context_only([])
    assert kl_none > 0 and kl_none != pytest.approx(kl_all)
    assert blends["zero"].context_only([0]) == pytest.approx(cb.context_only([0]))    # both prefill it at its offset
    with pytest.raises(ValueError, match="chunk indices"):
        cb.context_only([len(cb.chunks)])



def test_router_leaves_nothing_behind_when_a_policy_fails_and_checks_its_answer(lm):
    """A policy that fails on a later request must not strand the earlier ones (they used to stay
    running, ids taken); a numpy index is an index; a bool or float is a TypeError."""
    from labsupport.serving.router import prefix_affinity

    reps = Router.make_replicas(lm, 2, block_size=4, num_blocks=20)
    calls = []

    def flaky(prompt_ids, hits, loads):
        calls.append(1)
        return 0 if len(calls) < 2 else 1 // 0

    work = [(0.01 * k, [5, 6, 7, 8, 9, 10, 11, 12, k], 3) for k in range(3)]
    with pytest.raises(ZeroDivisionError):
        Router(reps, flaky).run(work)
    assert all(not e.has_unfinished_requests() and e.block_manager.num_used_blocks == 0 for e in reps)
    st = Router(reps, "round_robin").run(work[:2])                    # the same replicas, fresh ids
    assert len(st.replica) == 2 and all(e.block_manager.num_used_blocks == 0 for e in reps)
    assert Router(reps, lambda p, h, l: np.int64(1)).run(work[:1]).replica      # numpy ints are indices
    for answer in (True, 1.0, None):
        with pytest.raises(TypeError, match="replica index"):
            Router(reps, lambda p, h, l, a=answer: a).run(work[:1])
    with pytest.raises(ValueError, match="or a function"):
        Router(reps, 3)
    with pytest.raises(ValueError, match="one entry per replica"):
        prefix_affinity([1, 2], [], [])
    with pytest.raises(ValueError, match="one entry per replica"):
        prefix_affinity([1, 2], [3, 4], [0])
    with pytest.raises(ValueError, match="block_size"):
        prefix_affinity([1], [0, 0], [0, 0], block_size=0)


def test_tiers_and_accelerators_refuse_impossible_hardware():
    from labsupport.serving.tiers import STORAGE_TIERS, StorageTier, tier_economics

    for kw in ({"bandwidth": 0}, {"bandwidth": -1e9}, {"capacity": float("nan")}, {"latency_s": -1}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            StorageTier(**{"name": "x", "capacity": 1e12, "bandwidth": 1e9, "latency_s": 0.0, **kw})
    for kw in ({"peak_flops": 0}, {"bandwidth": float("nan")}, {"memory": -1}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            kv.Accelerator(**{"name": "z", "peak_flops": 1e12, "bandwidth": 1e12, "memory": 1e9, **kw})
    s = kv.preset("Llama 3 8B")
    with pytest.raises(TypeError, match="tier"):
        tier_economics(s, "disk", 16)
    with pytest.raises(TypeError, match="acc"):
        kv.prefill_time(10, s.n_params, None)
    with pytest.raises(ValueError, match="weight_dtype"):
        tier_economics(s, STORAGE_TIERS[1], 16, weight_dtype="fp7")


def test_cacheblend_context_only_reads_its_argument_once(blends):
    cb = blends["final"]
    assert cb.context_only(np.array([0, 1])) == pytest.approx(cb.context_only([0, 1]))
    for bad in (None, 1, "01", [0.0, 1.0], [True], (i for i in [0, 1])):
        with pytest.raises(TypeError, match="keep"):
            cb.context_only(bad)
