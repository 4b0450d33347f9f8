"""Sampling processors: exact small cases, properties, and agreement with transformers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from labsupport.sampling import (
    GREEDY,
    SamplingParams,
    apply_repetition_penalty,
    apply_temperature,
    candidates_for_mass,
    entropy_bits,
    min_p_filter,
    perplexity,
    probability_ratio,
    probs_from_logits,
    process_logits,
    sample,
    sequence_perplexity,
    top_k_filter,
    top_p_filter,
    trace_filters,
)


def kept(z: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(z.flatten())).flatten().tolist())


def log_probs(p: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(p, dtype=torch.float64)).float()


# ----------------------------------------------------------------------------- exact small cases

def test_top_p_smallest_set_reaching_p():
    z = log_probs([0.5, 0.25, 0.125, 0.125])
    assert kept(top_p_filter(z, 0.75)) == {0, 1}
    assert kept(top_p_filter(z, 0.76)) == {0, 1, 2}
    assert kept(top_p_filter(z, 1.0)) == {0, 1, 2, 3}


def test_tiny_top_p_keeps_only_argmax_and_zero_is_rejected():
    z = torch.tensor([1.0, 3.0, 2.0])
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\] \(finite\) \(use temperature=0 for greedy\), got 0"):
        top_p_filter(z, 0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    out = top_p_filter(z, 1e-8)
    assert kept(out) == {1}
    params = SamplingParams(temperature=1.0, top_p=1e-8)
    probs = probs_from_logits(z, params)
    assert torch.isfinite(probs).all() and probs[1].item() == 1.0
    gen = torch.Generator().manual_seed(0)
    draws = [int(sample(z, params, gen)) for _ in range(100)]
    assert set(draws) == {1}
    z16 = torch.tensor([1.0, 3.0, 2.0], dtype=torch.float16)
    p16 = probs_from_logits(z16, SamplingParams(top_p=1e-4))
    assert torch.isfinite(p16).all() and p16.dtype == torch.float32
    assert [int(sample(z16, SamplingParams(top_p=1e-4), gen)) for _ in range(100)] == [1] * 100


def test_temperature_is_applied_before_top_p():
    z = torch.tensor([2.0, 1.0, 0.0])
    base = torch.softmax(apply_temperature(z, 0.5), dim=-1)
    assert torch.allclose(base, torch.tensor([0.867, 0.117, 0.016]), atol=1e-3)
    out = process_logits(z, SamplingParams(temperature=0.5, top_p=0.8))
    assert kept(out) == {0}
    # the other order (top-p on the T=1 distribution, which is [0.665, 0.245, 0.090]) keeps {0, 1}
    assert kept(top_p_filter(z, 0.8)) == {0, 1}


def test_top_k_larger_than_vocab_and_zero_disable():
    z = torch.tensor([0.1, 0.9, 0.3, 0.7, 0.5])
    assert kept(top_k_filter(z, 10)) == {0, 1, 2, 3, 4}
    assert kept(top_k_filter(z, 0)) == {0, 1, 2, 3, 4}
    assert kept(top_k_filter(z, 2)) == {1, 3}
    with pytest.raises(ValueError, match=r"top_k must be an integer >= 0 \(0 disables it\), got -1"):
        top_k_filter(z, -1)


@pytest.mark.parametrize("min_p, expected", [(0.0, {0, 1, 2, 3}), (0.26, {1, 2, 3}),
                                             (0.76, {3}), (1.0, {3})])
def test_min_p_never_empty(min_p, expected):
    z = log_probs([0.1, 0.2, 0.3, 0.4])
    assert kept(min_p_filter(z, min_p)) == expected


def test_min_p_range():
    with pytest.raises(ValueError, match=r"min_p must be a number in \[0, 1\] \(finite\), got 1.5"):
        min_p_filter(torch.zeros(3), 1.5)


def test_temperature_zero_is_greedy_without_nan():
    z = torch.tensor([1.0, 3.0, 2.0])
    assert int(sample(z, SamplingParams(temperature=0.0))) == 1
    probs = probs_from_logits(z, SamplingParams(temperature=0.0))
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match=r"temperature must be a number > 0 \(finite\) here \(0 means greedy in sample\(\)\), got 0.0"):
        apply_temperature(z, 0.0)


def test_temperature_zero_generation_equals_argmax_loop(tiny_lm):
    from labsupport.generation import generate
    from labsupport.models import model_forward

    prompt = tiny_lm.encode("Return the number of")
    result = generate(tiny_lm, prompt, SamplingParams(temperature=0.0), max_new_tokens=32)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(32):
            logits, _ = model_forward(tiny_lm.model, torch.tensor([seq]), use_cache=False)
            assert torch.isfinite(logits).all()
            seq.append(int(logits[0, -1].argmax()))
    assert result.token_ids == seq[len(prompt):]
    assert all(math.isfinite(s.logprob) for s in result.steps)


def test_fp16_tiny_temperature_stays_finite():
    z = torch.tensor([11.06, 2.955, -2.447], dtype=torch.float16)
    params = SamplingParams(temperature=1e-5)
    probs = probs_from_logits(z, params)
    assert torch.isfinite(probs).all()
    assert probs.tolist() == [1.0, 0.0, 0.0]
    assert int(sample(z, params, torch.Generator().manual_seed(0))) == 0


def test_repetition_penalty_lowers_both_signs():
    z = torch.tensor([-2.0, 1.0, 0.5])
    out = apply_repetition_penalty(z, [0, 1], 2.0)
    assert out.tolist() == [-4.0, 0.5, 0.5]
    # seen twice counts once; unseen untouched; batch rows are independent
    out2 = apply_repetition_penalty(torch.stack([z, z]), [[0, 0, 1], [2]], 2.0)
    assert out2.tolist() == [[-4.0, 0.5, 0.5], [-2.0, 1.0, 0.25]]


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("field, value, pattern", [
    ("temperature", -0.1, r"temperature must be a number >= 0 \(finite\) \(0 = greedy\), got -0.1"),
    ("temperature", float("nan"), "temperature"),
    ("top_k", -1, r"top_k must be an integer >= 0 \(0 disables it\), got -1"),
    ("top_p", 1.5, r"top_p must be a number in \(0, 1\] .*, got 1.5"),
    ("min_p", -0.1, r"min_p must be a number in \[0, 1\]"),
    ("repetition_penalty", 0.0, r"repetition_penalty must be a number > 0 \(finite\), got 0.0"),
    ("max_tokens", 0, "max_tokens must be an integer >= 1"),
    ("n", 0, "n must be an integer >= 1"),
    ("stop", ("",), "stop must be non-empty strings"),
])
def test_sampling_params_rejects_bad_values(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        SamplingParams(**{field: value})


def test_sampling_params_stop_string_becomes_tuple():
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


def test_logits_shape_is_checked():
    with pytest.raises(ValueError, match="logits must have shape"):
        top_k_filter(torch.zeros(2, 3, 4), 1)
    with pytest.raises(ValueError, match="prev_ids must be token ids"):
        apply_repetition_penalty(torch.zeros(3), [5], 1.5)


# ----------------------------------------------------------------------------- properties

logit_rows = st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=1, max_size=40)
unit = st.floats(0.001, 1.0)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(logit_rows, unit, st.floats(0.0, 1.0), st.integers(0, 50), st.floats(0.05, 5.0))
def test_kept_set_never_empty_and_probs_sum_to_one(row, top_p, min_p, top_k, temperature):
    z = torch.tensor(row)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    probs = probs_from_logits(z, params)
    assert torch.isfinite(probs).all()
    assert (probs > 0).sum() >= 1
    assert abs(probs.sum().item() - 1.0) < 1e-5
    base = probs_from_logits(z, SamplingParams(temperature=temperature))   # before any cut
    assert base[probs > 0].max() == base.max()        # a most likely token always survives


@settings(max_examples=150, deadline=None)
@given(logit_rows, unit)
def test_top_p_is_the_minimal_set(row, top_p):
    z = torch.tensor(row, dtype=torch.float64)
    p = torch.softmax(z, dim=-1)
    keep = sorted(kept(top_p_filter(z.float(), top_p)), key=lambda i: -p[i].item())
    mass = p[keep].sum().item()
    assert mass >= top_p - 1e-5                         # reaches p ...
    smaller = mass - p[keep[-1]].item()
    assert smaller < top_p + 1e-5                       # ... and dropping its least likely member would not
    # every kept token is at least as likely as every dropped one
    dropped = set(range(len(row))) - set(keep)
    if dropped:
        assert min(p[keep]).item() >= max(p[list(dropped)]).item() - 1e-6


@settings(max_examples=100, deadline=None)
@given(logit_rows, st.floats(-50, 50), st.floats(0.1, 3.0), unit)
def test_adding_a_constant_changes_nothing(row, shift, temperature, top_p):
    z = torch.tensor(row)
    assume(len(set((z + shift).tolist())) == len(set(z.tolist())))   # fp32 rounding must not create a tie
    params = SamplingParams(temperature=temperature, top_p=top_p, min_p=0.05)
    a = probs_from_logits(z, params)
    b = probs_from_logits(z + shift, params)
    assert torch.allclose(a, b, atol=1e-4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=2, max_size=30, unique=True))
def test_temperature_to_zero_equals_greedy(row):
    z = torch.tensor(row)
    gap = (torch.sort(z, descending=True).values[0] - torch.sort(z, descending=True).values[1]).item()
    if gap < 1e-3:
        return
    probs = probs_from_logits(z, SamplingParams(temperature=gap / 200))   # exp(-200): no mass left
    assert int(probs.argmax()) == int(z.argmax()) and probs.max().item() == pytest.approx(1.0, abs=1e-6)
    assert int(sample(z, SamplingParams(temperature=gap / 200), torch.Generator().manual_seed(1))) == int(z.argmax())


# ----------------------------------------------------------------------------- agreement with transformers

def test_processors_agree_with_transformers():
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 100, generator=gen) * 3
    ids = torch.randint(0, 100, (64, 12), generator=gen)
    for t in (0.3, 1.0, 2.5):
        hf = TemperatureLogitsWarper(t)(ids, logits.clone())
        assert torch.allclose(torch.softmax(hf, -1), torch.softmax(apply_temperature(logits, t), -1), atol=1e-6)
    for k in (1, 5, 50, 100, 500):
        hf = TopKLogitsWarper(min(k, 100))(ids, logits.clone())
        assert torch.equal(torch.isfinite(hf), torch.isfinite(top_k_filter(logits, k)))
    for p in (0.1, 0.5, 0.9, 0.99):
        hf = TopPLogitsWarper(p)(ids, logits.clone())
        assert torch.equal(torch.isfinite(hf), torch.isfinite(top_p_filter(logits, p)))
    for m in (0.01, 0.1, 0.5):
        hf = MinPLogitsWarper(m)(ids, logits.clone())
        assert torch.equal(torch.isfinite(hf), torch.isfinite(min_p_filter(logits, m)))
    for theta in (1.3, 2.0, 0.8):
        hf = RepetitionPenaltyLogitsProcessor(theta)(ids, logits.clone())
        assert torch.allclose(hf, apply_repetition_penalty(logits, ids, theta))


def test_whole_pipeline_agrees_with_transformers_order():
    """Our pipeline equals transformers' processors chained in generate()'s order
    (repetition penalty → temperature → top-k → top-p → min-p; notes/transformers-5.md)."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(32, 80, generator=gen) * 2
    ids = torch.randint(0, 80, (32, 10), generator=gen)
    hf = logits.clone()
    for proc in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(20),
                 TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)):
        hf = proc(ids, hf)
    ours = process_logits(logits, SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05,
                                                 repetition_penalty=1.3), ids)
    assert torch.equal(torch.isfinite(hf), torch.isfinite(ours))
    assert torch.allclose(torch.softmax(hf, -1), torch.softmax(ours, -1), atol=1e-6)


# ----------------------------------------------------------------------------- measures

def test_entropy_and_perplexity():
    uniform = torch.full((8,), 1 / 8)
    assert entropy_bits(uniform).item() == pytest.approx(3.0)
    assert perplexity(uniform).item() == pytest.approx(8.0)
    one_hot = torch.tensor([0.0, 1.0, 0.0])
    assert entropy_bits(one_hot).item() == 0.0 and perplexity(one_hot).item() == 1.0
    assert sequence_perplexity([math.log(0.25)] * 4) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        sequence_perplexity([])


def test_candidates_for_mass():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert candidates_for_mass(p, 0.9) == 3
    assert candidates_for_mass(p, 0.5) == 1
    assert candidates_for_mass(p, 1.0) == 4


def test_temperature_probability_ratios():
    # logit gap 2 → ≈ 7.4 (T=1), ≈ 55 (T=0.5), ≈ 2.7 (T=2); logits 3, 1 at T=0.5 → e⁴
    assert round(probability_ratio(2, 1.0), 1) == 7.4
    assert round(probability_ratio(2, 0.5)) == 55
    assert round(probability_ratio(2, 2.0), 1) == 2.7
    assert probability_ratio(3 - 1, 0.5) == pytest.approx(math.e ** 4)
    p = torch.softmax(apply_temperature(torch.tensor([3.0, 1.0]), 0.5), -1)
    assert (p[0] / p[1]).item() == pytest.approx(math.e ** 4, rel=1e-5)


def test_trace_filters_reasons():
    z = log_probs([0.4, 0.3, 0.2, 0.06, 0.04])
    tr = trace_filters(z, SamplingParams(top_k=4, top_p=0.8, min_p=0.0))
    assert tr.reason == ["", "", "", "top-p", "top-k"]
    assert tr.num_kept == 3
    assert tr.final_probs.sum().item() == pytest.approx(1.0)
    assert torch.allclose(tr.final_probs[:3], torch.tensor([0.4, 0.3, 0.2]) / 0.9, atol=1e-5)
    tr2 = trace_filters(z, SamplingParams(min_p=0.6))
    assert tr2.reason == ["", "", "min-p", "min-p", "min-p"]
    tr3 = trace_filters(z, GREEDY)
    assert tr3.num_kept == 1 and tr3.reason[1] == "greedy"


def test_sample_uses_the_generator_reproducibly():
    z = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0)
    a = sample(z, params, torch.Generator().manual_seed(7))
    b = sample(z, params, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (4,)
    c = sample(z, params.replace(seed=11))
    d = sample(z, params.replace(seed=11))
    assert torch.equal(c, d)


def test_sampling_frequencies_match_the_distribution():
    z = torch.tensor([1.0, 0.5, 0.0, -1.0])
    params = SamplingParams(temperature=0.8, top_k=3)
    probs = probs_from_logits(z, params)
    gen = torch.Generator().manual_seed(0)
    draws = sample(z.expand(20000, 4), params, gen)
    freq = torch.bincount(draws, minlength=4).float() / 20000
    sigma = torch.sqrt(probs * (1 - probs) / 20000)
    assert freq[3].item() == 0.0
    assert ((freq - probs).abs() <= 4 * sigma + 1e-9).all()
