"""The benchmark runner and the speculative-variants measurements, on stubs and the tiny random model."""

from __future__ import annotations

import importlib
import statistics

import pytest

from labsupport.bench import BENCHMARKS
from labsupport.bench import __main__ as bench_main
from labsupport.bench import speculative_variants as variants
from labsupport.speculative.self_spec import SelfSpecProposer
from labsupport.timing import median_range


def test_bench_all_runs_every_benchmark_once(monkeypatch):
    """``all`` runs each benchmark once: the speculative benchmark must not also run the variants' table."""
    calls = []
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(f"labsupport.bench.{module_name}")
        if name != "speculative":                    # speculative's own main runs, with its work stubbed
            monkeypatch.setattr(module, "main", lambda argv, name=name: calls.append(name) or 0)
        monkeypatch.setattr(module, "unavailable", lambda: None, raising=False)
    spec = importlib.import_module("labsupport.bench.speculative")
    monkeypatch.setattr("labsupport.models.load_model", lambda name, device="cpu": name)
    monkeypatch.setattr(spec, "run_pairs", lambda *a, **k: calls.append("speculative") or {"rows": [], "costs": {}})
    monkeypatch.setattr(spec, "run_engine", lambda *a, **k: [])
    monkeypatch.setattr(spec, "runner_verification_costs", lambda target, context, gammas, **k: {g: [1.0] for g in gammas})
    monkeypatch.setattr(spec, "_print_tables", lambda *a, **k: None)
    assert bench_main.main(["all"]) == 0
    assert sorted(calls) == sorted(BENCHMARKS), calls         # speculative-variants exactly once
    calls.clear()
    assert bench_main.main(["speculative"]) == 0             # alone, speculative still ends with the variants
    assert calls == ["speculative", "speculative-variants"]


def test_variant_speedups_and_the_batch_sweep_share_their_runs(tiny_lm, monkeypatch):
    methods = {"plain": lambda: None, "self-spec k=1": lambda: SelfSpecProposer(1, 2)}
    engines = {m: [] for m in methods}                     # each run's (seconds, engine), warm-up first
    real_run = variants._run

    def recording_run(target, make, prompts, params, max_new, block_size=16):
        dt, eng, outs = real_run(target, make, prompts, params, max_new, block_size)
        engines[next(m for m, f in methods.items() if f is make)].append((dt, eng))
        return dt, eng, outs

    monkeypatch.setattr(variants, "_run", recording_run)
    rows = variants.measure_methods(tiny_lm, methods, {"prose": "Return the number of"}, batches=(1,),
                                    max_new_tokens=4, repeats=3)
    monkeypatch.setattr(variants, "_run", real_run)
    median_eng = {m: sorted(runs[1:], key=lambda r: r[0])[1][1] for m, runs in engines.items()}
    e = median_eng["plain"]
    t_round = (e.draft_seconds + e.target_seconds) / e.num_rounds
    row = next(r for r in rows if r.method == "self-spec k=1")
    assert len(row.measured_runs) == 3 and all(x > 0 for x in row.measured_runs)
    assert row.measured == statistics.median(row.measured_runs)
    assert min(row.measured_runs) <= row.measured <= max(row.measured_runs)
    shown = median_range(row.measured_runs, unit="×")
    assert "3 runs" in shown and f"{row.measured:.2f}×" in shown
    # the prediction: the decoding phase sped up, each method's prompt prefill (timed in its median run,
    # in plain rounds) not
    plain = next(r for r in rows if r.method == "plain")
    assert plain.decode_speedup == pytest.approx(1.0) and plain.predicted == pytest.approx(1.0)
    for r in (plain, row):
        assert r.prefill == pytest.approx(median_eng[r.method].prefill_seconds / t_round) and r.prefill > 0
    assert row.decode_speedup == pytest.approx(row.tokens_per_round / (row.c_round + row.v))
    assert row.predicted == pytest.approx((plain.prefill + 4) / (row.prefill + 4 / row.decode_speedup))

    batches_run = []

    def counting_run(target, make, prompts, params, max_new, block_size=16):
        batches_run.append(len(prompts))
        return real_run(target, make, prompts, params, max_new, block_size)

    monkeypatch.setattr(variants, "_run", counting_run)
    sweep = variants.batch_sweep_runs(tiny_lm, methods["self-spec k=1"], "Return the number of", batches=(1, 2),
                                      max_new_tokens=4, repeats=2, known={1: row.measured_runs})
    assert sweep[1] == row.measured_runs                     # batch 1 is the table's runs, not measured again
    assert set(batches_run) == {2} and len(batches_run) == 2 * 3   # (1 warm-up + 2 repeats) x (plain, method)
    assert len(sweep[2]) == 2
    medians = variants.batch_sweep(tiny_lm, methods["self-spec k=1"], "Return the number of", batches=(1,),
                                   max_new_tokens=4, repeats=1, known={1: [1.5, 0.5, 1.0]})
    assert medians == {1: 1.0}
    with pytest.raises(ValueError, match="repeats"):
        variants.batch_sweep_runs(tiny_lm, methods["plain"], "Return the number of", repeats=0)


def test_runner_verification_costs_are_ratios_to_a_one_token_forward(tiny_lm):
    from labsupport.bench.speculative import runner_verification_costs

    v = runner_verification_costs(tiny_lm, "Return the number of", [1, 4], repeats=2, inner=2)
    assert sorted(v) == [1, 4] and all(len(r) == 2 and all(x > 0 for x in r) for r in v.values())


def test_the_weight_pass_is_timed_from_the_caches_and_from_memory(tiny_lm, monkeypatch):
    """Both floors time every weight matrix once per pass; the cold one writes the eviction buffer
    before each pass (counted here, not timed)."""
    import torch

    from labsupport.bench import engine as bench_engine
    from labsupport.engine import LLMEngine
    runner = LLMEngine(tiny_lm, block_size=4, num_blocks=8).runner
    from labsupport.engine.linear import Linear
    calls, real_call = [], Linear.__call__
    monkeypatch.setattr(Linear, "__call__", lambda self, x: calls.append(1) or real_call(self, x))
    writes = []
    real_zeros = torch.zeros
    monkeypatch.setattr(bench_engine.torch, "zeros", lambda n: writes.append(n) or real_zeros(n))
    warm = bench_engine.weight_pass_seconds(runner, repeats=3)
    cold = bench_engine.weight_pass_seconds(runner, repeats=3, cold=True)
    assert warm > 0 and cold > 0
    assert len(calls) == 2 * 5 * (4 * len(runner.layers) + 1)      # (repeats + 2) passes, every matrix, twice
    assert writes == [bench_engine.EVICT_BYTES // 4]               # the buffer only for the cold floor
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        bench_engine.weight_pass_seconds(runner, repeats=0)


def test_kv_slot_use_counts_slots_by_hand_and_paging_meets_its_bound(tiny_lm):
    """Prompts of 5 and 7 tokens, 3 and 6 new, blocks of 4, both running at once. Seen after each
    step (a request is freed in the step that samples its last token): step 1 holds 5 + 7 tokens in
    2 + 2 blocks, step 2 6 + 8 in 2 + 2, then only the second: 9, 10, 11 in 3 blocks. So 56 tokens in
    68 paged slots and in 7 × 32 reserved ones; at their longest 6 + 11 tokens in 2 + 3 blocks."""
    from labsupport.bench.engine import kv_slot_use

    use = kv_slot_use(tiny_lm, [list(range(1, 6)), list(range(1, 8))], [3, 6], block_size=4, num_blocks=16,
                      max_running=2, reservation=32)
    assert use["paged_steps"] == pytest.approx(56 / 68) and use["contiguous_steps"] == pytest.approx(56 / 224)
    assert use["paged_final"] == pytest.approx(17 / 20) and use["contiguous_final"] == pytest.approx(17 / 64)
    assert use["bound_steps"] == use["paged_steps"] and use["bound_final"] == use["paged_final"]


def test_the_variants_benchmark_prints_the_kernel_each_matrix_uses(tiny_lm):
    from labsupport.engine import ModelRunner

    runner = ModelRunner(tiny_lm, 16, 4)
    line = variants.kernel_choice_line(runner)
    assert line.startswith("matmul kernel per row bucket") and "linear-kernels.json" in line
    for (shape, *_), choice in runner.kernel_choices.items():
        assert f"{shape[0]}×{shape[1]}: " + ", ".join(f"{b} {k}" for b, k in sorted(choice.items())) in line
