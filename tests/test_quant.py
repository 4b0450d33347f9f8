"""Quantisation (chapter 11): formats, the quantiser, weight-only RTN / AWQ, int8 matmuls, 8-bit KV
in the paged engine, the compressed KV transfer, outliers and the at-scale arithmetic."""

import math
import multiprocessing as mp

import pytest
import torch

from labsupport.engine import LLMEngine
from labsupport.engine.config import EngineConfig
from labsupport.engine.model_runner import ModelRunner
from labsupport.quant import (
    FORMATS,
    fake_quantize,
    greedy_agreement,
    number_format,
    quantize,
    quantize_model,
    relative_error,
    score,
    top1_agreement,
)
from labsupport.quant.int8 import Int8Linear
from labsupport.bench.quant import budget_run
from labsupport.quant.kv import dequantize_kv, kv_bytes_per_token, quantize_kv
from labsupport.quant.outliers import outlier_errors, plant_outlier
from labsupport.quant.scale import at_scale
from labsupport.quant.weights import out_in, awq_scale, layer_inputs, linear_layers
from labsupport.sampling import SamplingParams
from labsupport.serving.kv_transfer import KVConnector, KVPayload, recv_blocks, send_blocks


# ----------------------------------------------------------------------------- formats

@pytest.mark.parametrize("name, bits, max_code, rel_step", [
    ("fp32", 32, 3.4028234663852886e38, 2 ** -23), ("bf16", 16, 3.3895313892515355e38, 2 ** -7),
    ("fp16", 16, 65504.0, 2 ** -10), ("fp8_e4m3", 8, 448.0, 2 ** -3), ("fp8_e5m2", 8, 57344.0, 2 ** -2),
    ("int8", 8, 127.0, 1 / 127), ("int4", 4, 7.0, 1 / 7)])
def test_number_formats(name, bits, max_code, rel_step):
    f = number_format(name)
    assert (f.bits, f.max_code, f.rel_step) == (bits, pytest.approx(max_code), pytest.approx(rel_step))
    assert f.scaled == (name.startswith("int") or name.startswith("fp8"))


def test_int8_per_channel_by_hand():
    x = torch.tensor([[1.0, -2.0, 0.5, 4.0], [0.0, 0.0, 0.0, 0.0]])
    q = quantize(x, "int8", "channel")
    scale = torch.tensor(4.0 / 127).half().float()
    assert q.scale[0, 0] == scale and q.scale[1, 0] == 2.0 ** -14      # an all-zero row: the smallest fp16 scale
    assert q.codes[0].tolist() == [round(1 / float(scale)), round(-2 / float(scale)), round(0.5 / float(scale)), 127]
    assert torch.equal(q.dequantize()[1], torch.zeros(4))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("granularity", ["tensor", "channel", "group"])
def test_integer_rounding_is_within_half_a_step(fmt, granularity):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=g) * torch.linspace(0.1, 5, 64)
    q = quantize(x, fmt, granularity, group_size=16)
    steps = q.scale.repeat_interleave(q.group_size, dim=1)
    assert ((q.dequantize() - x).abs() <= steps / 2 + 1e-6).all()
    assert q.codes.abs().max() <= number_format(fmt).max_code


def test_finer_scales_give_smaller_errors():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g) * torch.rand(64, 1, generator=g) * 3
    x[:, 5] *= 20                                                          # one outlier column
    errs = [relative_error(x, fake_quantize(x, "int4", gran, size)) for gran, size in
            (("tensor", 0), ("channel", 0), ("group", 128), ("group", 32))]
    assert errs == sorted(errs, reverse=True) and errs[-1] < errs[0] / 2


def test_fp8_codes_are_values_of_the_format():
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(2)) * 7
    for fmt, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        q = quantize(x, fmt, "channel")
        assert q.codes.dtype == dtype
        values = q.codes.float()
        assert torch.equal(values.to(dtype).float(), values)
        assert values.abs().max() <= number_format(fmt).max_code


def test_bytes_as_stored():
    x = torch.randn(256, 256)
    assert quantize(x, "int4", "group", 128).nbytes == 256 * 256 // 2 + 2 * 256 * 2
    assert quantize(x, "int8", "channel").nbytes == 256 * 256 + 2 * 256
    assert quantize(x, "bf16", "tensor").nbytes == 2 * 256 * 256
    assert quantize(x, "fp32", "tensor").scale is None


@pytest.mark.parametrize("args, kind, words", [
    ((torch.ones(4, 8), "int3"), ValueError, "fmt"),
    ((torch.ones(4, 8), "int8", "row"), ValueError, "granularity"),
    ((torch.ones(4, 8), "int8", "group", 3), ValueError, "group_size must divide the row width 8, got 3"),
    ((torch.ones(4, 8), "int8", "group", 0), ValueError, "group_size"),
    ((torch.tensor([[1.0, float("nan")]]), "int8"), ValueError, "finite"),
    ((torch.ones(2, 2, dtype=torch.long), "int8"), TypeError, "float16/bfloat16/float32/float64"),
    (([1.0, 2.0], "int8"), TypeError, "x must be"),
    ((torch.ones(0, 4), "int8"), ValueError, "non-empty"),
])
def test_quantize_refuses_bad_input(args, kind, words):
    with pytest.raises(kind, match=words):
        quantize(*args)


# ----------------------------------------------------------------------------- weight-only

def test_quantize_model_leaves_the_original_and_counts_bytes(tiny_lm):
    before = {k: v.clone() for k, v in tiny_lm.model.state_dict().items()}
    q = quantize_model(tiny_lm, "int8", granularity="channel", targets=("attn", "mlp", "lm_head"))
    assert all(torch.equal(before[k], v) for k, v in tiny_lm.model.state_dict().items())
    layers = linear_layers(tiny_lm.model)
    assert set(q.errors) == set(layers) and all(0 < e < 0.02 for e in q.errors.values())
    assert q.lm.model.lm_head.weight is q.lm.model.transformer.wte.weight          # still tied
    n = sum(out_in(m).numel() for m in layers.values())
    rows = sum(out_in(m).shape[0] for m in layers.values())
    assert q.model_bytes == q.fp32_bytes - 4 * n + n + 2 * rows
    w = out_in(linear_layers(q.lm.model)["h.0.mlp.c_fc"])
    assert torch.equal(w, fake_quantize(out_in(layers["h.0.mlp.c_fc"]), "int8", "channel"))


def test_awq_is_never_worse_than_rtn_on_its_calibration(tiny_lm):
    ids = torch.randint(0, tiny_lm.model.config.vocab_size, (128,), generator=torch.Generator().manual_seed(0))
    x = layer_inputs(tiny_lm, ids, ["h.0.mlp.c_proj"])["h.0.mlp.c_proj"]
    w = out_in(linear_layers(tiny_lm.model)["h.0.mlp.c_proj"])
    s, alpha = awq_scale(w, x, "int4", "group", 32)
    err = lambda w_hat: float((x @ w_hat.t() - x @ w.t()).norm())            # noqa: E731
    assert err(fake_quantize(w * s, "int4", "group", 32) / s) <= err(fake_quantize(w, "int4", "group", 32)) + 1e-6
    assert 0.0 <= alpha <= 1.0
    with pytest.raises(TypeError, match="calibration_ids"):
        quantize_model(tiny_lm, "int4", method="awq")
    with pytest.raises(ValueError, match="group_size must divide"):
        quantize_model(tiny_lm, "int4", granularity="group", group_size=48)
    with pytest.raises(ValueError, match="targets"):
        quantize_model(tiny_lm, "int8", targets=("embeddings",))
    with pytest.raises(ValueError, match=r"calibration_ids must hold token ids in \[0, "):
        quantize_model(tiny_lm, "int4", method="awq", calibration_ids=torch.full((32,), 10 ** 6))


def test_score_is_the_same_through_hugging_face_and_the_engine(tiny_lm):
    ids = torch.randint(0, tiny_lm.model.config.vocab_size, (100,), generator=torch.Generator().manual_seed(3))
    hf = score(tiny_lm, ids, window=32)
    runner = score(ModelRunner(tiny_lm, 8, 8), ids, window=32)
    assert hf.tokens == runner.tokens == 99
    assert runner.perplexity == pytest.approx(hf.perplexity, rel=1e-4)
    assert top1_agreement(hf, runner) > 0.98
    with torch.no_grad():
        manual = torch.nn.functional.cross_entropy(tiny_lm.model(ids[:33].unsqueeze(0)).logits[0, :-1], ids[1:33])
    assert score(tiny_lm, ids[:33], window=32).perplexity == pytest.approx(math.exp(float(manual)), rel=1e-5)


def test_greedy_agreement_counts_up_to_the_first_difference():
    assert greedy_agreement([[1, 2, 3, 4]], [[1, 2, 9, 4]]) == 0.5
    assert greedy_agreement([[1, 2], [5, 6]], [[1, 2], [0, 6]]) == 0.5
    with pytest.raises(ValueError):
        greedy_agreement([[1]], [])


# ----------------------------------------------------------------------------- int8 matmul

def test_int8_linear_is_close_to_fp32():
    g = torch.Generator().manual_seed(4)
    w, b, x = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(5, 64, generator=g)
    lin = Int8Linear(w, b)
    assert lin.shape == (64, 96)
    assert relative_error(x @ w.t() + b, lin(x)) < 0.03
    with pytest.raises(ValueError, match="bias"):
        Int8Linear(w, torch.zeros(3))


def test_engine_settings_are_checked():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="awq")


# ----------------------------------------------------------------------------- 8-bit KV

@pytest.mark.parametrize("dtype, bound", [("int8", 0.5 / 127), ("fp8", 2 ** -4), ("fp8_e5m2", 2 ** -3)])
def test_kv_quantisation_error_is_bounded_per_vector(dtype, bound):
    x = torch.randn(6, 4, 64, generator=torch.Generator().manual_seed(5)) * 3
    codes, scale = quantize_kv(x, dtype)
    assert scale.shape == (6, 4) and scale.dtype == torch.float16
    err = (dequantize_kv(codes, scale, dtype) - x).abs()
    # absolute bound relative to each vector's absmax (int8: half a step; fp8: half an ulp at the top)
    assert (err <= bound * x.abs().amax(-1, keepdim=True) * 1.01 + 1e-3).all()
    with pytest.raises(ValueError, match="auto"):
        quantize_kv(x, "auto")


def test_engine_with_8_bit_kv_stays_close_and_holds_4x_the_tokens(tiny_lm):
    cfg = tiny_lm.model.config
    assert kv_bytes_per_token(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, "int8") == \
        ModelRunner(tiny_lm, 4, 4, kv_cache_dtype="int8").kv_bytes_per_token == 2 * 2 * 2 * (32 + 2)
    ids = torch.randint(0, tiny_lm.model.config.vocab_size, (60,), generator=torch.Generator().manual_seed(6)).tolist()
    ref = ModelRunner(tiny_lm, 8, 8).forward([ids], [0], [list(range(8))], all_logits=True)
    for dtype in ("int8", "fp8", "fp8_e5m2"):
        got = ModelRunner(tiny_lm, 8, 8, kv_cache_dtype=dtype).forward([ids], [0], [list(range(8))], all_logits=True)
        kl = torch.nn.functional.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean")
        assert not torch.equal(got, ref) and abs(float(kl)) < 1e-2, dtype


def test_8_bit_kv_survives_copy_on_write_and_swap(tiny_lm):
    """Forked samples (copy-on-write) and swapping under a small pool give what a roomy pool gives:
    the scales travel with the codes."""
    prompts = [list(range(10 + i, 40 + i)) for i in range(4)]
    params = SamplingParams(temperature=1.0, seed=1, n=2, max_tokens=12, ignore_eos=True)
    roomy = LLMEngine(tiny_lm, block_size=4, num_blocks=128, kv_cache_dtype="int8").generate(prompts, params)
    tight = LLMEngine(tiny_lm, block_size=4, num_blocks=26, kv_cache_dtype="int8", preemption_mode="swap",
                      num_cpu_blocks=64, record_history=True)
    out = tight.generate(prompts, params)
    assert any(s.swapped_out for s in tight.history) and any(s.copied for s in tight.history)
    assert [o.token_ids for o in out] == [o.token_ids for o in roomy]
    assert tight.block_manager.num_free_blocks == 26


def test_a_budget_in_8_bits_runs_a_bigger_batch(tiny_lm):
    prompts = [list(range(i, i + 24)) for i in range(8)]
    budget = 8 * 8 * 1024                                  # 8 fp32 blocks of 8 slots: 64 tokens
    fp32 = budget_run(tiny_lm, budget, "auto", prompts, 16, block_size=8)
    int8 = budget_run(tiny_lm, budget, "int8", prompts, 16, block_size=8)
    assert int8.num_blocks == budget // (8 * 2 * 2 * 2 * 34) and fp32.num_blocks == 8
    assert int8.mean_running > fp32.mean_running and int8.steps < fp32.steps
    assert fp32.finish_reasons == int8.finish_reasons == ["length"] * 8             # no lost request
    assert all(len(t) == 16 for t in fp32.token_ids + int8.token_ids)
    with pytest.raises(ValueError, match="budget_bytes"):
        budget_run(tiny_lm, 10, "int8", prompts, 4)


def test_tiers_and_layerwise_streaming_refuse_an_8_bit_cache(tiny_lm):
    from labsupport.serving.kv_transfer import LayerwiseKVConnector
    from labsupport.serving.tiers import TieredKVCache
    eng = LLMEngine(tiny_lm, block_size=4, num_blocks=16, enable_prefix_caching=True, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype='auto'"):
        TieredKVCache(eng)
    parent, child = mp.Pipe()
    conn = LayerwiseKVConnector(child)
    try:
        with pytest.raises(ValueError, match="kv_cache_dtype='auto'"):
            conn.attach(eng)
    finally:
        conn.close()
        parent.close()
        child.close()


# ----------------------------------------------------------------------------- compressed KV transfer

def test_compressed_transfer_ships_a_quarter_and_round_trips(tiny_lm):
    kv = torch.randn(2, 2, 10, 2, 32, generator=torch.Generator().manual_seed(7))
    payload = KVPayload("r", list(range(10)), 5, kv, 4, 0.0, 0.0)
    a, b = mp.Pipe()
    try:
        sent = send_blocks(a, payload, "int8")
        got = recv_blocks(b, 5.0)
    finally:
        a.close()
        b.close()
    assert sent == got.num_bytes == kv.numel() + 2 * kv.numel() // 32
    assert got.kv.dtype == torch.float32 and got.kv.shape == kv.shape
    assert relative_error(kv, got.kv) < 0.01
    with pytest.raises(ValueError, match="compress"):
        KVConnector(None, "auto")


def test_compressed_connector_feeds_a_decode_engine(tiny_lm):
    prompts = [list(range(3, 30)), list(range(50, 70))]
    results = {}
    for compress in (None, "int8"):
        prefill = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
        prefill.kv_connector = conn = KVConnector(None, compress)
        for p in prompts:
            conn.max_new_tokens[prefill.add_request(p, SamplingParams(max_tokens=1))] = 10
        while prefill.has_unfinished_requests():
            prefill.step()
        decode = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
        ids = [decode.add_prefilled_request(p.prompt_ids, p.first_token, p.kv, SamplingParams(max_tokens=10))
               for p in conn.sent]
        while decode.has_unfinished_requests():
            decode.step()
        results[compress] = (conn.bytes_sent, [decode.output(i).token_ids for i in ids])
    cfg = tiny_lm.model.config
    tokens = sum(map(len, prompts))
    assert results[None][0] == tokens * 2 * cfg.n_layer * cfg.n_embd * 4
    assert results["int8"][0] == tokens * 2 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head + 2)
    assert greedy_agreement(results[None][1], results["int8"][1]) >= 0.5


# ----------------------------------------------------------------------------- outliers, scale

def test_outliers_break_per_tensor_int8_and_both_fixes_help():
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(256, 64, generator=g), torch.randn(128, 64, generator=g) * 0.1
    calm = outlier_errors(x, w)
    wild = outlier_errors(plant_outlier(x, 3, 60.0), w)
    assert wild.outlier_ratio > 30 and calm.outlier_ratio < 3
    assert wild.per_tensor > 3 * calm.per_tensor
    assert wild.llm_int8 < wild.per_tensor / 5 and wild.smoothquant < wild.per_tensor / 2
    with pytest.raises(ValueError, match="share 'in'"):
        outlier_errors(x, w.t())


def test_at_scale_arithmetic():
    rows = {(r.model, r.weight_format): r for r in at_scale()}
    big = rows[("Llama 3 70B", "bf16")]
    assert not big.fits and big.kv_tokens == 0
    small = rows[("Llama 3 70B", "int4")]
    assert small.fits and small.weight_bytes == pytest.approx(big.weight_bytes * (4 + 1 / 8) / 16)
    r8 = rows[("Llama 3 8B", "bf16")]
    assert r8.kv_per_token == 131072
    assert r8.kv_tokens == int((80e9 - r8.weight_bytes) // 131072)
    assert r8.step_s == pytest.approx((r8.weight_bytes + 8192 * 131072) / 3.35e12)
    with pytest.raises(ValueError):
        at_scale(weight_formats=("int3",))


def test_every_format_round_trips_a_real_matrix(tiny_lm):
    w = out_in(linear_layers(tiny_lm.model)["h.0.attn.c_attn"])
    errs = {f: relative_error(w, fake_quantize(w, f, "channel")) for f in FORMATS}
    assert errs["fp32"] == 0 and errs["bf16"] < errs["fp8_e4m3"] < errs["int4"]
    assert errs["int8"] < errs["fp8_e4m3"]


# ----------------------------------------------------------------------------- panel and figures

def test_quant_lab_redraws_and_reports_instead_of_raising(tiny_lm):
    from labsupport.widgets.quant import quant_lab
    ids = torch.randint(0, tiny_lm.model.config.vocab_size, (80,), generator=torch.Generator().manual_seed(9))
    panel = quant_lab(tiny_lm, ids, bandwidth=10e9, calibration_ids=ids, fmt="int8", granularity="channel")
    fmt_w, row, row2, readout, chart, error = panel.children
    assert "perplexity" in readout.value and error.value == ""
    first = readout.value
    fmt_w.value = "int4"
    assert readout.value != first and "int4" in chart.figure.layout.title.text
    gran_w, group_w = row.children
    gran_w.value = "channel"
    group_w.value = 32                                  # the group slider switches to per-group scales
    assert gran_w.value == "group" and "per group of 32" in chart.figure.layout.title.text
    method_w, *boxes = row2.children
    method_w.value = "awq"
    assert "awq" in chart.figure.layout.title.text
    for box in boxes:
        box.value = False                               # nothing left to quantise: a message, not an exception
    assert "tick at least one" in error.value
    boxes[0].value = True
    assert error.value == ""
    fmt_w.value = "fp32"                                # a cast: the scale controls do nothing, so they are off
    assert gran_w.disabled and group_w.disabled and method_w.disabled and "cast" in chart.figure.layout.title.text
    fmt_w.value = "int8"
    assert not gran_w.disabled
    with pytest.raises(ValueError, match="fmt"):
        quant_lab(tiny_lm, ids, bandwidth=1e9, fmt="int3")
    with pytest.raises(ValueError, match="bandwidth"):
        quant_lab(tiny_lm, ids, bandwidth=0)


def test_quant_figures():
    from labsupport.viz.quant import format_error_figure, kv_capacity_figure, matrix_error_figure, outlier_figure
    fig = format_error_figure({"per tensor": {"int8": 0.01, "int4": 0.2}, "per channel": {"int8": 0.005, "int4": 0.1}})
    assert [t.name for t in fig.data] == ["per tensor", "per channel"] and fig.layout.yaxis.type == "log"
    assert "4×" in outlier_figure(torch.tensor([4.0, 1.0, 1.0]), "x").layout.title.text
    fig = matrix_error_figure({"h.0.attn.c_attn": 0.1, "h.0.mlp.c_fc": 0.2, "lm_head": 0.05}, "t")
    assert [t.name for t in fig.data] == ["attn", "mlp", "lm_head"]
    assert list(kv_capacity_figure(["auto", "int8"], [10, 40], [0.0, 0.01]).data[0].y) == [10, 40]
    with pytest.raises(ValueError):
        format_error_figure({})


# ----------------------------------------------------------------------------- extreme values and bad inputs

def test_extreme_values_are_refused_or_kept_finite(tiny_lm):
    with pytest.raises(ValueError, match="within"):
        quantize_kv(torch.tensor([[1e7, 1.0]]), "int8")
    with pytest.raises(ValueError, match="within"):
        fake_quantize(torch.tensor([[1e7, 1.0]]), "int8")
    with pytest.raises(ValueError, match="fp16"):
        fake_quantize(torch.tensor([[1e5, 1.0]]), "fp16")
    with pytest.raises(ValueError, match="finite"):
        quantize(torch.tensor([[1e300, 1.0]], dtype=torch.float64), "int8")
    tiny = torch.full((2, 8), 1e-7)
    for d in ("int8", "fp8", "fp8_e5m2"):
        back = dequantize_kv(*quantize_kv(tiny, d), d)
        assert torch.isfinite(back).all() and (back - tiny).abs().max() < 3.1e-5
    eng = LLMEngine(tiny_lm, block_size=4, num_blocks=16, kv_cache_dtype="int8")
    ids = list(range(5, 12))
    cfg = tiny_lm.model.config
    with pytest.raises(ValueError, match="kv must hold values within"):
        eng.add_prefilled_request(ids, 3, torch.full((cfg.n_layer, 2, len(ids), cfg.n_head, cfg.n_embd // cfg.n_head), 1e7),
                                  SamplingParams(max_tokens=3))
    assert eng.block_manager.num_free_blocks == 16 and not eng.has_unfinished_requests()


def test_int8_matmuls_are_batch_invariant_and_speculation_stays_exact(tiny_lm):
    from labsupport.speculative import SpeculativeEngine
    prompts = [list(range(3, 20)), list(range(40, 45)), list(range(100, 130)), [7, 8, 9]]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = [LLMEngine(tiny_lm, quantization="int8").generate([p], greedy)[0].token_ids for p in prompts]
    batch = [o.token_ids for o in LLMEngine(tiny_lm, quantization="int8").generate(prompts, greedy)]
    spec = SpeculativeEngine(tiny_lm, {"method": "ngram", "num_speculative_tokens": 3}, quantization="int8")
    assert alone == batch == [o.token_ids for o in spec.generate(prompts, greedy)]


def test_8_bit_kv_and_int8_on_other_model_dtypes(tiny_lm):
    import copy
    half = copy.deepcopy(tiny_lm)
    half.model = half.model.to(torch.bfloat16)
    out = LLMEngine(half, block_size=4, num_blocks=16, kv_cache_dtype="int8").generate(
        [list(range(5, 15))], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
    with pytest.raises(ValueError, match="float32 model"):
        LLMEngine(half, quantization="int8")


def test_transfer_and_server_settings_are_checked(tiny_lm):
    from labsupport.serving.disagg import DisaggregatedServer
    with pytest.raises(TypeError, match="compress"):
        KVConnector(None, True)
    with pytest.raises(ValueError, match="compress"):
        KVConnector(None, "auto")
    with pytest.raises(ValueError, match="kv_transfer_compress"):
        DisaggregatedServer(tiny_lm, kv_transfer_compress="int4")
    with pytest.raises(ValueError, match="kv_transfer_compress='int8'"):
        DisaggregatedServer(tiny_lm, prefill_kwargs={"kv_cache_dtype": "int8"})


@pytest.mark.parametrize("call, kind", [
    (lambda lm: quantize_model(lm.model), TypeError),
    (lambda lm: quantize_model(lm, targets="attn"), TypeError),
    (lambda lm: quantize_model(lm, granularity="channel", group_size="x"), TypeError),
    (lambda lm: quantize_model(lm, calibration_ids=torch.arange(20)), ValueError),
    (lambda lm: quantize_model(lm, "int4", method="awq", calibration_ids=torch.ones(20, dtype=torch.bool)), ValueError),
    (lambda lm: score(lm.model, torch.arange(10)), TypeError),
    (lambda lm: layer_inputs(lm, torch.arange(10), ["nope"]), ValueError),
    (lambda lm: top1_agreement(1, 2), TypeError),
    (lambda lm: greedy_agreement([1], [1]), TypeError),
    (lambda lm: budget_run(lm, 10 ** 6, "int8", "hello", 4), TypeError),
    (lambda lm: at_scale(models="Llama 3 8B"), TypeError),
    (lambda lm: at_scale(acc="H100"), TypeError),
    (lambda lm: plant_outlier(torch.randn(8), 2), ValueError),
    (lambda lm: outlier_errors(torch.zeros(16, 8), torch.ones(4, 8)), ValueError),
    (lambda lm: outlier_errors(torch.ones(16, 8), torch.ones(4, 8), threshold=-1), ValueError),
    (lambda lm: quantize_kv(torch.zeros(4, 0), "int8"), ValueError),
    (lambda lm: dequantize_kv(torch.zeros(2, 4, dtype=torch.int8), torch.ones(2), "auto"), ValueError),
    (lambda lm: dequantize_kv(torch.zeros(2, 4, dtype=torch.int8), torch.ones(3), "int8"), ValueError),
    (lambda lm: kv_bytes_per_token(4, 4, 64, "auto", model_bytes=0), ValueError),
    (lambda lm: Int8Linear(torch.zeros(4, 0)), ValueError),
    (lambda lm: Int8Linear(torch.ones(4, 8), torch.full((4,), float("nan"))), ValueError),
    (lambda lm: Int8Linear(torch.ones(4, 8))(torch.ones(2, 5)), ValueError),
])
def test_bad_arguments_get_named_errors(tiny_lm, call, kind):
    with pytest.raises(kind):
        call(tiny_lm)
