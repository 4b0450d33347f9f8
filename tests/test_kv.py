"""labsupport.kv: the KV-cache size table, roofline and step-time numbers, pinned."""

import json

import pytest

from labsupport import kv
from labsupport.generation import token_forwards

KiB, MiB, GiB = 2 ** 10, 2 ** 20, 2 ** 30


# ----------------------------------------------------------------------------- KV bytes of common models

@pytest.mark.parametrize("name, per_token, at_8k", [
    ("GPT-2 small", 36 * KiB, 288 * MiB),
    ("Llama 2 7B", 512 * KiB, 4 * GiB),
    ("Llama 3 8B", 128 * KiB, 1 * GiB),
    ("Llama 3 70B", 320 * KiB, 2.5 * GiB),
])
def test_kv_bytes_table_fp16(name, per_token, at_8k):
    shape = kv.preset(name)
    assert kv.kv_bytes_per_token(shape, "fp16") == per_token
    assert kv.kv_bytes(shape, 8192) == at_8k


def test_llama3_8b_worked_example():
    shape = kv.preset("Llama 3 8B")
    assert kv.kv_bytes_per_token(shape) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv.kv_bytes(shape, 131_072) == 16 * GiB            # 128k context: 16 GiB
    assert kv.kv_bytes(shape.with_attention("MHA"), 131_072) == 64 * GiB
    assert kv.kv_bytes_per_token(shape.with_attention("MHA")) == 512 * KiB
    assert kv.kv_bytes_per_token(shape.with_attention("MQA")) == 16 * KiB
    assert shape.attention == "GQA" and shape.with_attention("GQA") == shape


def test_llama3_70b_worked_example():
    shape = kv.preset("Llama 3 70B")
    assert kv.kv_bytes_per_token(shape) == 327_680
    assert kv.kv_bytes(shape, 131_072) == 40 * GiB
    assert kv.kv_bytes_per_token(shape.with_attention("MHA")) == 2.5 * MiB
    assert round(kv.weight_bytes(shape) / 1e9) == 141          # "BF16 weights alone 141 GB"


def test_precisions_halve_and_quarter():
    shape = kv.preset("Llama 3 8B")
    fp16 = kv.kv_bytes(shape, 8192, 64, "fp16")
    assert kv.kv_bytes(shape, 8192, 64, "fp8") * 2 == fp16
    assert kv.kv_bytes(shape, 8192, 64, "int4") * 4 == fp16
    assert kv.kv_bytes(shape, 8192, 64, "bf16") == fp16 == 64 * GiB


def test_batch_and_length_are_linear():
    shape = kv.preset("GPT-2 small")
    assert kv.kv_bytes(shape, 100, 3) == 3 * kv.kv_bytes(shape, 100) == 300 * kv.kv_bytes_per_token(shape)


def test_gqa_of_an_mha_model_groups_four_query_heads():
    gpt2 = kv.preset("GPT-2 small")
    assert gpt2.attention == "MHA" and gpt2.gqa_kv_heads == 3
    assert gpt2.with_attention("GQA").n_kv_heads == 3
    assert kv.preset("Llama 2 7B").with_attention("GQA").n_kv_heads == 8


def test_memory_budget_against_80gb():
    shape = kv.preset("Llama 3 8B")
    one = kv.memory_budget(shape, 131_072, 1)
    assert one.kv == 16 * GiB and one.weights == 16_060_522_496 and one.fits
    mha = kv.memory_budget(shape.with_attention("MHA"), 131_072, 1)
    assert not mha.fits                                           # 16 GB + 68.7 GB > 80 GB
    busy = kv.memory_budget(shape, 8192, 64)
    assert busy.kv_over_weights == pytest.approx(64 * GiB / 16_060_522_496)
    assert busy.kv_over_weights > 4


def test_shipped_tiny_model_preset_reads_its_config(tmp_path):
    cfg = {"model_type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 4096,
           "n_positions": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = kv.shape_from_config(tmp_path, name="tiny")
    assert (shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim) == (4, 4, 4, 64)
    assert kv.kv_bytes_per_token(shape, "fp32") == 2 * 4 * 4 * 64 * 4 == 8 * KiB
    from transformers import GPT2Config, GPT2LMHeadModel
    small = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=16)
    assert kv.shape_from_config(small).n_params == sum(p.numel() for p in GPT2LMHeadModel(small).parameters())
    if (kv.MODELS_DIR / "tiny-gpt2" / "config.json").exists():
        assert kv.preset("tiny-gpt2").n_layers == json.loads(
            (kv.MODELS_DIR / "tiny-gpt2" / "config.json").read_text())["n_layer"]


def test_gpt2_small_param_count_matches_release():
    assert kv.gpt2_param_count(12, 768, 50257, 1024) == kv.preset("GPT-2 small").n_params


@pytest.mark.parametrize("n, text", [(36 * KiB, "36 KiB"), (288 * MiB, "288 MiB"), (2.5 * GiB, "2.5 GiB"),
                                     (16 * GiB, "16 GiB"), (512, "512 B")])
def test_format_bytes(n, text):
    assert kv.format_bytes(n) == text


# ----------------------------------------------------------------------------- roofline

def test_decode_bound_llama3_8b_on_h100():
    w = kv.weight_bytes(kv.preset("Llama 3 8B"))
    assert round(w / 1e9, 1) == 16.1
    t = kv.step_time(w, kv.H100_SXM.bandwidth)
    assert round(t * 1e3, 1) == 4.8
    assert round(kv.decode_throughput(w, kv.H100_SXM.bandwidth), -1) == 210
    assert round(kv.ridge_point()) == 295
    assert kv.flops_per_token(8_030_000_000) == pytest.approx(16.06e9)
    assert round(kv.prefill_time(2000, kv.preset("Llama 3 8B").n_params) * 1e3) == 32
    assert kv.decode_intensity(1) == 1.0 and kv.decode_intensity(64) == 64.0


# ----------------------------------------------------------------------------- step time t(B) = (W + B·K) / BW

def test_step_time_model():
    W, K, BW = 16e9, 0.25e9, 3.3e12
    assert round(kv.step_time(W, BW, 1, K) * 1e3, 1) == 4.9
    assert round(kv.step_time(W, BW, 64, K) * 1e3, 1) == 9.7
    assert round(kv.step_time(W, BW, 240, K) * 1e3) == 23
    gain = kv.decode_throughput(W, BW, 64, K) / kv.decode_throughput(W, BW, 1, K)
    assert round(gain) == 32
    assert kv.throughput_ceiling(K, BW) == pytest.approx(13_200)
    assert kv.decode_throughput(W, BW, 10 ** 6, K) < kv.throughput_ceiling(K, BW)


# ----------------------------------------------------------------------------- counting K,V positions

def test_positions_computed_worked_example():
    assert kv.kv_positions_computed(12, 28, True) == 40
    assert kv.kv_positions_computed(12, 28, False) == 754
    assert kv.kv_saving(12, 28) == pytest.approx(18.85)
    assert round(kv.kv_saving(12, 28)) == 19


def test_positions_computed_against_direct_sum_and_generation_count():
    for P in (1, 5, 12):
        for n in (0, 1, 7, 28):
            assert kv.kv_positions_computed(P, n, False) == sum(P + t for t in range(n + 1))
            assert kv.kv_positions_computed(P, n, True) == P + n
            if n >= 1:  # generate() never feeds back the last token: one step fewer
                assert kv.kv_positions_computed(P, n, True) == token_forwards(P, n, True) + 1
                assert kv.kv_positions_computed(P, n, False) == token_forwards(P, n, False) + P + n


def test_step_cells():
    assert kv.kv_step_cells(12, 0, True) == (12, 12)
    assert kv.kv_step_cells(12, 0, False) == (12, 12)
    assert kv.kv_step_cells(12, 5, True) == (17, 1)
    assert kv.kv_step_cells(12, 5, False) == (17, 17)
    assert sum(kv.kv_step_cells(12, s, False)[1] for s in range(29)) == kv.kv_positions_computed(12, 28, False)
    assert sum(kv.kv_step_cells(12, s, True)[1] for s in range(29)) == kv.kv_positions_computed(12, 28, True)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call", [
    lambda: kv.kv_bytes(kv.preset("GPT-2 small"), 0),
    lambda: kv.kv_bytes(kv.preset("GPT-2 small"), 10, batch=0),
    lambda: kv.kv_bytes_per_token(kv.preset("GPT-2 small"), "fp12"),
    lambda: kv.preset("GPT-5"),
    lambda: kv.preset("Llama 3 8B").with_attention("MLA"),
    lambda: kv.ModelShape("x", 2, 4, 3, 64, 10),
    lambda: kv.ModelShape("x", 0, 4, 4, 64, 10),
    lambda: kv.step_time(0, 1e12),
    lambda: kv.step_time(1e9, 1e12, batch=0),
    lambda: kv.step_time(1e9, 1e12, kv_bytes_per_request=-1),
    lambda: kv.throughput_ceiling(0, 1e12),
    lambda: kv.kv_positions_computed(0, 5, True),
    lambda: kv.kv_positions_computed(3, -1, True),
    lambda: kv.format_bytes(float("nan")),
    lambda: kv.memory_budget(kv.preset("GPT-2 small"), 10, capacity=0),
    lambda: kv.shape_from_config({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2,
                                  "hidden_size": 8}),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


# ----------------------------------------------------------------------------- the benchmark's helpers

def test_bench_helpers_on_tiny_model(tiny_lm):
    from labsupport.bench.kv_cache import (
        prompt_of_length,
        request_token_times,
        time_cached_vs_uncached,
        time_prefill_decode,
    )
    prompt = prompt_of_length(tiny_lm, 10)
    assert len(prompt) == 10
    (row,) = time_cached_vs_uncached(tiny_lm, prompt, [6])
    assert row.identical
    assert (row.forwards_cached, row.forwards_uncached) == (token_forwards(10, 6, True), token_forwards(10, 6, False))
    times = request_token_times(tiny_lm, prompt, 5)
    assert len(times) == 5 and times == sorted(times)
    pd = time_prefill_decode(tiny_lm, prompt_len=20, decode_steps=3, repeats=1)
    assert pd.prompt_len == 20 and pd.prefill_s > 0 and pd.decode_s > 0
    with pytest.raises(ValueError, match="repeats"):
        time_cached_vs_uncached(tiny_lm, prompt, [2], repeats=0)
    with pytest.raises(ValueError, match="n_tokens"):
        prompt_of_length(tiny_lm, 0)


@pytest.mark.parametrize("call", [
    lambda: kv.kv_bytes(kv.preset("GPT-2 small"), 10.0),
    lambda: kv.kv_bytes(kv.preset("GPT-2 small"), 10, batch=True),
    lambda: kv.ModelShape("x", "2", 4, 4, 64, 10),
    lambda: kv.step_time("1e9", 1e12),
    lambda: kv.format_bytes("1 KiB"),
    lambda: kv.kv_positions_computed(3.0, 5, True),
])
def test_wrong_type_raises_type_error(call):
    with pytest.raises(TypeError):
        call()


def test_kv_module_imports_without_torch():
    """The module docstring promises plain arithmetic: importing it must not load torch."""
    import subprocess
    import sys
    code = "import sys, labsupport.kv, labsupport.serving_math; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                         cwd=str(kv.MODELS_DIR.parent.parent))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
