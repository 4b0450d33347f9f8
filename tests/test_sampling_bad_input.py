"""Bad inputs and edge cases of labsupport.sampling: NaN / inf logits, tiny temperatures and
top-p in low precision, parameter types, extreme repetition penalties, the measures.

Rules checked: bad input raises an error naming the parameter; no NaN, no IndexError.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from labsupport.sampling import (
    GREEDY,
    SamplingParams,
    apply_repetition_penalty,
    apply_temperature,
    candidates_for_mass,
    entropy_bits,
    min_p_filter,
    probability_ratio,
    probs_from_logits,
    process_logits,
    sample,
    top_k_filter,
    top_p_filter,
    trace_filters,
)

INF = float("inf")


def kept(z: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(z.flatten())).flatten().tolist())


# ============================================================================ sampling: logits values
BAD_ROWS = {
    "nan": ([float("nan"), 1.0, 0.0], "NaN"),
    "plus_inf": ([INF, 1.0, 0.0], r"\+inf"),
    "all_neg_inf": ([-INF, -INF, -INF], "all -inf"),
}


@pytest.mark.parametrize("name", BAD_ROWS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_and_inf_logits_are_a_clear_error(name, temperature):
    """NaN / +inf / a row with nothing left would make every probability NaN (or, greedy,
    silently pick index 0): a ValueError instead, from every entry point."""
    row, pattern = BAD_ROWS[name]
    z = torch.tensor(row)
    params = SamplingParams(temperature=temperature, top_p=0.9)
    for call in (lambda: sample(z, params, torch.Generator().manual_seed(0)),
                 lambda: probs_from_logits(z, params),
                 lambda: process_logits(torch.stack([torch.zeros(3), z]), params),
                 lambda: trace_filters(z, params),
                 lambda: top_p_filter(z, 0.5), lambda: top_k_filter(z, 1), lambda: min_p_filter(z, 0.1)):
        with pytest.raises(ValueError, match=pattern):
            call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.7, top_k=2, top_p=0.5, min_p=0.3),
                                    SamplingParams(temperature=1e-6, repetition_penalty=3.0)])
def test_all_neg_inf_but_one_always_gives_that_one(dtype, params):
    z = torch.tensor([-INF, -INF, 2.0, -INF], dtype=dtype)
    probs = probs_from_logits(z, params, [0, 2])
    assert probs.tolist() == [0.0, 0.0, 1.0, 0.0]
    gen = torch.Generator().manual_seed(1)
    assert [int(sample(z, params, gen, [0, 2])) for _ in range(20)] == [2] * 20


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=2.0, top_k=5, top_p=0.01, min_p=1.0,
                                                           repetition_penalty=1e30)])
def test_one_token_vocabulary(params):
    z = torch.tensor([-0.3])
    assert probs_from_logits(z, params, [0]).tolist() == [1.0]
    assert int(sample(z, params, torch.Generator().manual_seed(0), [0])) == 0
    assert trace_filters(z, params, [0]).num_kept == 1


@pytest.mark.parametrize("temperature", [1e-5, 1e-30, 1e-45, 1e-320])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tiny_temperature_is_the_argmax_never_nan(temperature, dtype):
    """T below float32's range (1e-320 underflows to 0 in fp32) used to give 0/0 = NaN."""
    z = torch.tensor([11.06, 2.955, -2.447, 11.0], dtype=dtype)
    params = SamplingParams(temperature=temperature)
    probs = probs_from_logits(z, params)
    assert torch.isfinite(probs).all()
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert int(sample(z, params, torch.Generator().manual_seed(0))) == 0
    scaled = apply_temperature(z, temperature)
    assert scaled[0].item() == 0.0 and not torch.isnan(scaled).any()


def test_huge_temperature_is_uniform_and_ties_stay_tied_at_tiny_temperature():
    z = torch.tensor([1.0, 5.0, -3.0])
    probs = probs_from_logits(z, SamplingParams(temperature=1e300))
    assert torch.allclose(probs, torch.full((3,), 1 / 3))
    tied = probs_from_logits(torch.tensor([2.0, 2.0, 1.0]), SamplingParams(temperature=1e-320))
    assert tied.tolist() == [0.5, 0.5, 0.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("top_p", [1e-8, 1e-4, 0.3])
def test_tiny_top_p_in_low_precision(dtype, top_p):
    z = torch.tensor([1.0, 3.0, 2.0], dtype=dtype)
    params = SamplingParams(temperature=1.0, top_p=top_p)
    probs = probs_from_logits(z, params)
    assert probs.dtype == torch.float32 and probs.tolist() == [0.0, 1.0, 0.0]
    gen = torch.Generator().manual_seed(0)
    assert [int(sample(z, params, gen)) for _ in range(100)] == [1] * 100


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_top_p_boundary_in_low_precision(dtype):
    """[0.5, 0.25, 0.125, 0.125] are exact in fp16/bf16: the top-p boundary must not move."""
    z = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125])).to(dtype)
    assert kept(top_p_filter(z, 0.75)) == {0, 1}
    assert kept(top_p_filter(z, 0.76)) == {0, 1, 2}


# ============================================================================ sampling: parameter types
@pytest.mark.parametrize("field, value", [
    ("top_k", True), ("top_k", 2.0), ("top_k", "5"), ("top_k", None),
    ("temperature", "0.5"), ("temperature", True), ("temperature", None),
    ("top_p", "0.9"), ("top_p", True), ("min_p", "0.1"), ("min_p", True),
    ("repetition_penalty", "1.2"), ("max_tokens", 5.0), ("max_tokens", "5"), ("max_tokens", True),
    ("n", 2.0), ("stop", 5), ("stop", ["a", 3]),
    ("ignore_eos", "no"), ("ignore_eos", 1), ("seed", "1"), ("seed", 1.0),
])
def test_sampling_params_wrong_types_are_type_errors(field, value):
    with pytest.raises(TypeError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("top_k", -1), ("temperature", INF), ("top_p", float("nan")), ("top_p", 0.0), ("min_p", float("nan")),
    ("repetition_penalty", 0.0), ("repetition_penalty", INF), ("n", 0), ("stop", [""]),
    ("seed", -1), ("seed", 2 ** 70),
])
def test_sampling_params_values_out_of_range_are_value_errors(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_accept_numpy_scalars_and_store_python_numbers():
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.9),
                       min_p=np.float16(0.25), repetition_penalty=np.int32(2), max_tokens=np.int16(7),
                       n=np.uint8(2), seed=np.int64(11), stop=["x"])
    assert p == SamplingParams(temperature=0.5, top_k=3, top_p=0.9, min_p=0.25, repetition_penalty=2.0,
                               max_tokens=7, n=2, seed=11, stop=("x",))
    assert type(p.top_k) is int and type(p.temperature) is float and type(p.seed) is int
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop="ab").stop == ("ab",)
    hash(p)                                                        # frozen and hashable (stop is a tuple)


def test_processors_reject_bools_and_accept_numpy():
    z = torch.tensor([1.0, 2.0, 0.5])
    for call in (lambda: apply_temperature(z, True), lambda: top_p_filter(z, True),
                 lambda: min_p_filter(z, True), lambda: top_k_filter(z, True),
                 lambda: apply_repetition_penalty(z, [0], True), lambda: candidates_for_mass(z, True)):
        with pytest.raises(TypeError):
            call()
    assert torch.equal(top_k_filter(z, np.int64(1)), top_k_filter(z, 1))
    assert torch.equal(apply_temperature(z, np.float32(0.5)), apply_temperature(z, 0.5))


# ============================================================================ repetition penalty
def test_repetition_penalty_with_empty_history_changes_nothing():
    z = torch.tensor([1.0, -1.0, 0.5])
    assert torch.equal(apply_repetition_penalty(z, [], 2.0), z)
    assert torch.equal(apply_repetition_penalty(z, torch.tensor([], dtype=torch.long), 2.0), z)
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    assert torch.equal(probs_from_logits(z, params, []), torch.softmax(z, -1))
    assert int(sample(z, GREEDY.replace(repetition_penalty=2.0), prev_ids=[])) == 0


def test_repetition_penalty_rows_given_as_numpy_arrays():
    z = torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    out = apply_repetition_penalty(z, np.array([[0], [1]]), 2.0)
    assert out.tolist() == [[0.5, -1.0], [1.0, -2.0]]               # row 0 saw id 0, row 1 saw id 1
    assert apply_repetition_penalty(z[0], np.array([0, 1]), 2.0).tolist() == [0.5, -2.0]


@pytest.mark.parametrize("ids", [[3], [-1], [0, 99]])
def test_repetition_penalty_ids_outside_vocab(ids):
    with pytest.raises(ValueError, match=r"prev_ids must be token ids in \[0, 3\)"):
        apply_repetition_penalty(torch.zeros(3), ids, 1.5)


@pytest.mark.parametrize("penalty", [1e-300, 1e300])
def test_extreme_repetition_penalty_saturates_instead_of_inf(penalty):
    """A positive logit / 1e-300 or a negative one × 1e300 overflowed to ±inf (then NaN or an
    all -inf row); it now saturates at the largest float32, as documented."""
    z = torch.tensor([2.0, -1.0, 0.5, -INF])
    out = apply_repetition_penalty(z, [0, 1, 3], penalty)
    assert torch.isfinite(out[:3]).all() and out[3].item() == -INF
    params = SamplingParams(temperature=1.0, repetition_penalty=penalty)
    probs = probs_from_logits(z, params, [0, 1, 3])
    assert torch.isfinite(probs).all() and abs(probs.sum().item() - 1) < 1e-6
    lone = torch.tensor([-1.0])                                   # all candidates seen and negative
    assert probs_from_logits(lone, params, [0]).tolist() == [1.0]


# ============================================================================ measures
def test_measures_never_return_garbage():
    assert probability_ratio(100.0, 0.01) == math.inf             # was OverflowError
    assert probability_ratio(2.0, 1.0) == pytest.approx(math.exp(2))
    with pytest.raises(ValueError, match="probs"):
        entropy_bits(torch.tensor([float("nan"), 1.0]))           # was -0.0
    with pytest.raises(ValueError, match="mass"):
        candidates_for_mass(torch.tensor([0.5, 0.5]), float("nan"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_in_low_precision_and_batches(dtype):
    z = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])).to(dtype)
    out = min_p_filter(z, 0.76)
    assert kept(out[0]) == {3} and kept(out[1]) == {0}              # never empty, row by row
    pen = apply_repetition_penalty(torch.tensor([[-2.0, 1.0, 0.5]] * 2, dtype=dtype), [[0, 1], []], 2.0)
    assert pen.dtype == torch.float32 and pen.tolist() == [[-4.0, 0.5, 0.5], [-2.0, 1.0, 0.5]]
