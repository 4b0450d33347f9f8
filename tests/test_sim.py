"""Worked numbers of serving_math and the simulators of labsupport.sim (no model needed)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labsupport import serving_math as sm
from labsupport.sim import batching as sb
from labsupport.sim import fragmentation as sf
from labsupport.sim import serving as ss
from labsupport.sim import timeline as tl

MiB = sm.MiB


# ----------------------------------------------------------------------------- reservation vs paged allocation

def test_reservation_worked_numbers():
    r = sm.reservation_report()
    assert sm.LLAMA3_8B_KV_BYTES_PER_TOKEN == 128 * 1024                       # Llama 3 8B, fp16
    assert r.reserved_bytes == 256 * MiB                                   # 2048 × 128 KB
    assert r.used_bytes == 37.5 * MiB                                      # 300 × 128 KB
    assert round(100 * r.utilisation) == 15                                # ≈ 15 %
    assert r.requests_contiguous == 234                                    # 60 GB / 256 MB
    assert r.requests_exact == 1600                                        # 60 GB / 37.5 MB
    assert round(r.used_by_contiguous_batch_bytes / MiB / 1000, 1) == 8.8  # ≈ 8.8 GB actually used
    assert 6.8 < r.capacity_gain < 6.9                                     # "almost 7×"
    assert r.paged_waste_bound_tokens == 15                                # block 16 wastes ≤ 15 tokens
    assert round(r.paged_waste_bound_bytes / MiB, 1) == 1.9                # ≈ 1.9 MB
    assert r.paged_waste_tokens == 19 * 16 - 300 == 4
    assert r.requests_paged >= 1000                                        # "more than 1,000"
    assert r.paged_waste_bound_tokens / 300 <= 0.05 and r.paged_waste_bound_tokens / 2048 < 0.008


def test_reservation_units_do_not_change_the_ratio():
    strict = sm.reservation_report(memory_bytes=60e9)
    assert strict.requests_contiguous == 223 and strict.requests_exact == 1525
    assert strict.utilisation == sm.reservation_report().utilisation


def test_blocks_and_internal_waste():
    assert [sm.blocks_needed(n, 16) for n in (0, 1, 16, 17, 300)] == [0, 1, 1, 2, 19]
    assert sm.internal_waste_fraction([16, 32], 16) == 0.0
    assert sm.internal_waste_fraction([1], 16) == 15 / 16
    assert sm.internal_waste_fraction([300], 1) == 0.0


@pytest.mark.parametrize("call", [
    lambda: sm.reservation_report(used_tokens=3000),
    lambda: sm.reservation_report(block_size=0),
    lambda: sm.reservation_report(kv_bytes_per_token=-1),
    lambda: sm.requests_that_fit(0, 1),
    lambda: sm.internal_waste_fraction([], 16),
    lambda: sm.internal_waste_fraction([0], 16),
    lambda: sm.batching_report([], 8),
    lambda: sm.batching_report([10], 0),
    lambda: sm.bimodal_lengths(7, 50, 400),
])
def test_serving_math_bad_input(call):
    with pytest.raises(ValueError):
        call()


# ----------------------------------------------------------------------------- static vs continuous batching

def test_batching_worked_numbers():
    r = sm.batching_report()
    assert sm.bimodal_lengths(8, 50, 400) == list(sm.BIMODAL_OUTPUT_LENS)
    assert (r.useful_slot_steps, r.occupied_slot_steps) == (1800, 3200)
    assert round(100 * r.utilisation) == 56
    assert (r.static_steps, r.continuous_steps) == (400, 225)
    assert round(r.speedup, 2) == 1.78


def test_batching_extremes():
    assert sm.batching_report([400] * 8, 8).utilisation == 1.0
    one_long = sm.batching_report([4000] + [50] * 7, 8)
    assert round(100 * one_long.utilisation, 1) == 13.6                  # a "single digit" utilisation needs B ≥ 12
    wide = sm.batching_report([4000] + [50] * 15, 16)
    assert wide.utilisation < 0.1 and wide.speedup > 10


def test_simulated_static_matches_closed_form():
    lens = list(sm.BIMODAL_OUTPUT_LENS)
    static = sb.simulate_batching(lens, 8, "static")
    assert static.num_steps == 400 and static.utilisation == 0.5625
    # eight requests only: continuous batching cannot beat the longest request either
    assert sb.simulate_batching(lens, 8, "continuous").num_steps == 400
    # an endless queue of such batches: continuous → 1,800 / 8 steps per batch
    stream = lens * 50
    st_run, co_run = (sb.simulate_batching(stream, 8, p) for p in sb.POLICIES)
    assert st_run.num_steps == 50 * 400
    assert abs(st_run.num_steps / co_run.num_steps - sm.batching_report(stream, 8).speedup) < 0.01
    assert co_run.utilisation > 0.99


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 30), min_size=1, max_size=25), b=st.integers(1, 6),
       arrivals=st.lists(st.integers(0, 20), min_size=25, max_size=25))
def test_batching_simulator_invariants(lens, b, arrivals):
    arr = arrivals[:len(lens)]
    runs = {p: sb.simulate_batching(lens, b, p, arr) for p in sb.POLICIES}
    for run in runs.values():
        assert sorted(s.request_id for s in run.segments) == list(range(len(lens)))    # nobody lost
        for s in run.segments:
            assert s.end - s.start == lens[s.request_id] and s.start >= arr[s.request_id]
            assert 0 <= s.slot < b
        for k in range(b):                                                  # a slot holds one request at a time
            segs = sorted((s.start, s.end) for s in run.segments if s.slot == k)
            assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(segs))
        assert sum(run.active_per_step) == sum(lens) and max(run.active_per_step) <= b
    assert runs["continuous"].num_steps <= runs["static"].num_steps


def test_run_seconds_and_lengths():
    run = sb.simulate_batching([2, 4], 2, "static")
    assert run.active_per_step == (2, 2, 1, 1)
    assert sb.run_seconds(run, lambda b: 1.0 + b) == 3 + 3 + 2 + 2
    assert sb.run_seconds(run, lambda b: 1.0 + b, idle_slots_cost=True) == 12
    assert sb.spread_lengths(225, 7 / 9) == (50, 400)
    assert sb.spread_lengths(100, 0) == (100, 100)
    s = sb.bimodal_stream(50, 3, 9, seed=1)
    assert set(s) == {3, 9} and s == sb.bimodal_stream(50, 3, 9, seed=1)
    assert run.first_token_step() == [1, 1] and run.finish_step() == [2, 4]
    with pytest.raises(ValueError):
        sb.simulate_batching([1], 1, "dynamic")
    with pytest.raises(ValueError):
        sb.spread_lengths(100, 1.0)
    with pytest.raises(ValueError):
        sb.run_seconds(run, lambda b: 0.0)


# ----------------------------------------------------------------------------- fragmentation

@pytest.fixture(scope="module")
def frag_runs():
    w = sf.Workload(reservation=256, arrival_rate=0.5, num_steps=80)
    return w, sf.make_requests(w), sf.compare(w, 16)


def test_stream_is_seeded_and_in_range(frag_runs):
    w, reqs, _ = frag_runs
    assert reqs == sf.make_requests(w)
    assert reqs != sf.make_requests(sf.Workload(reservation=256, arrival_rate=0.5, num_steps=80, seed=1))
    assert all(w.prompt_len <= r.final_len <= w.reservation for r in reqs)


def test_nobody_is_lost_and_memory_is_consistent(frag_runs):
    w, reqs, runs = frag_runs
    for name, run in runs.items():
        arrived = np.array([sum(r.arrival_step <= k for r in reqs) for k in range(w.num_steps)])
        # finished requests left in the step they finished; the rest are running or queued
        assert np.all(run.completed + run.running + run.queued == arrived), name
        assert np.all(run.used <= (run.owner >= 0))                     # KV only in held slots
        for k in (10, 40, 79):
            tables = run.block_tables[k]
            assert len(tables) == run.running[k]
            held = sum(len(t) for t in tables.values()) * run.block_size
            assert held == (run.owner[k] >= 0).sum()
    contiguous, paged = runs["contiguous"], runs["paged"]
    assert contiguous.block_size == w.reservation
    assert np.all(contiguous.allocated == contiguous.running * w.reservation)
    # paged: at most block_size - 1 empty slots per running request
    assert np.all(paged.allocated - paged.used.sum(axis=1) <= paged.running * 15)


def test_paged_beats_contiguous(frag_runs):
    _, _, runs = frag_runs
    c, p = runs["contiguous"].summary(), runs["paged"].summary()
    assert p["waste"] < 0.1 and c["waste"] > 0.5
    assert p["running"] > 1.5 * c["running"]
    assert p["completed"] > c["completed"] and p["queued"] < c["queued"]
    assert c["preemptions"] == 0


def test_block_size_sweep_trade_off():
    rows = sf.block_size_sweep(sf.Workload(num_steps=60), (1, 16, 128))
    assert rows[0]["waste"] == 0.0
    assert rows[0]["waste"] < rows[1]["waste"] < rows[2]["waste"]
    assert rows[0]["table_entries"] > rows[1]["table_entries"] > rows[2]["table_entries"]


@pytest.mark.parametrize("kwargs", [{"reservation": 8}, {"reservation": 2048}, {"arrival_rate": -1},
                                    {"num_steps": 0}])
def test_workload_bad_input(kwargs):
    with pytest.raises(ValueError):
        sf.Workload(**kwargs)


def test_simulate_bad_input():
    w = sf.Workload(num_steps=5, reservation=1000)
    with pytest.raises(ValueError):
        sf.simulate(w, "buddy")
    with pytest.raises(ValueError):
        sf.simulate(w, "paged", block_size=0)
    with pytest.raises(ValueError):
        sf.simulate(w, "paged", block_size=600)          # one 600-slot block cannot hold 1,000 tokens
    assert sf.simulate(w, "paged", block_size=512).block_size == 512


# ----------------------------------------------------------------------------- serving (chunked / disaggregated)

def test_one_request_alone_follows_the_cost_model():
    cost = ss.llama3_8b_h100_cost_model()
    req = [ss.ServedRequest(0, 1000, 3, ss.RequestMetrics(0.5))]
    (colo,) = ss.simulate(req, "colocated", cost)
    assert colo.metrics.ttft == pytest.approx(cost.prefill(1000))
    gaps = colo.metrics.itl
    assert gaps == pytest.approx([cost.decode_step([1001]), cost.decode_step([1002])])
    (dis,) = ss.simulate(req, "disaggregated", cost)
    assert dis.metrics.ttft == pytest.approx(cost.prefill(1000))
    assert dis.metrics.itl[0] == pytest.approx(cost.transfer(1000) + cost.decode_step([1001]))
    assert req[0].metrics.token_times == []                                  # input not modified
    # prefill of Llama 3 8B at 50 % MFU: 2·N / (989 TFLOP/s · 0.5) per token
    assert cost.prefill_s_per_token == pytest.approx(2 * 8_030_261_248 / (989e12 * 0.5))


def test_long_prefill_stalls_decodes_unless_chunked():
    cost = ss.llama3_8b_h100_cost_model()
    reqs = [ss.ServedRequest(0, 64, 40, ss.RequestMetrics(0.0)),
            ss.ServedRequest(1, 8192, 2, ss.RequestMetrics(0.05))]
    colo = ss.simulate(reqs, "colocated", cost, replicas=1)
    chunked = ss.simulate(reqs, "chunked", cost, replicas=1, chunk=512)
    assert max(colo[0].metrics.itl) >= cost.prefill(8192)                   # the decoder waited for the whole prompt
    assert max(chunked[0].metrics.itl) <= cost.decode_step([64 + 40, 8192]) + cost.prefill(512) + 1e-12
    assert chunked[1].metrics.ttft > colo[1].metrics.ttft                  # chunking delays the long prompt's TTFT
    for runs in (colo, chunked):
        assert all(len(r.metrics.token_times) == r.output_len and r.metrics.finish_time is not None for r in runs)


def test_policies_serve_every_token():
    reqs = ss.poisson_requests(8.0, 40, [128, 2048], 16, seed=3)
    assert reqs[0].arrival < reqs[-1].arrival
    for p in ("colocated", "chunked", "disaggregated"):
        out = ss.simulate(reqs, p, max_batch=8)
        assert all(len(r.metrics.token_times) == 16 for r in out)
        assert all(np.all(np.diff(r.metrics.token_times) > 0) for r in out)
        stats = ss.latency_stats(out)
        assert stats["TTFT p50"] <= stats["TTFT p90"] and stats["ITL p99"] <= stats["max ITL"]
    with pytest.raises(ValueError):
        ss.simulate(reqs, "pipelined")
    with pytest.raises(ValueError):
        ss.poisson_requests(0, 1, 1, 1)


# ----------------------------------------------------------------------------- timelines

def test_assign_slots_and_states():
    segs = tl.assign_slots([["a", "b"], ["a", "b"], ["b", "c"], ["c"], []])
    assert [(s.slot, s.request_id, s.start, s.end) for s in segs] == [
        (0, "a", 0, 2), (1, "b", 0, 3), (0, "c", 2, 4)]
    frames = [{"waiting": ["b"], "running": ["a"], "prefill": ["a"]},
              {"running": ["a", "b"], "prefill": ["b"], "finished": ["a"]},
              {"swapped": ["b"]}]
    states = tl.state_matrix(frames, ["a", "b", "c"])
    assert states == {"a": ["prefill", "decode", "finished"], "b": ["waiting", "prefill", "swapped"],
                      "c": ["not arrived"] * 3}
    assert tl.STATES[0] == "not arrived" and len(tl.STATES) == 6


# ----------------------------------------------------------------------------- simulator vs the real engine

@pytest.mark.parametrize("policy", sb.POLICIES)
def test_engine_steps_equal_the_slot_simulator(tiny_lm, policy):
    from labsupport.engine import LLMEngine
    from labsupport.sampling import SamplingParams

    lens = [2, 7, 3, 7, 1, 5, 2, 6, 4, 3]
    eng = LLMEngine(tiny_lm, block_size=4, num_blocks=64, max_num_seqs=4, record_history=True)
    fixed = SamplingParams(temperature=0, ignore_eos=True)
    groups = [range(k, min(k + 4, len(lens))) for k in range(0, len(lens), 4)] if policy == "static" else [range(len(lens))]
    for group in groups:
        for i in group:
            eng.add_request([5, 6, 7], fixed, max_tokens=lens[i], request_id=str(i))
        eng.run()
    sim = sb.simulate_batching(lens, 4, policy)
    assert eng.step_count == sim.num_steps
    running = [list(s.scheduled_tokens) for s in eng.history]
    assert [len(r) for r in running] == list(sim.active_per_step)
    segs = tl.assign_slots(running)
    assert sorted((int(s.request_id), s.end - s.start) for s in segs) == sorted(enumerate(lens))
