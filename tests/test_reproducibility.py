"""Chapter 12's measurements (labsupport.reproducibility), its figures and its panel."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest
import torch
from helpers import prompts_for

from labsupport import reproducibility as rp
from labsupport.engine import ModelRunner
from labsupport.viz import reproducibility as vr
from labsupport.widgets import batch_lab


def test_ordered_sum_adds_in_the_order_it_names():
    x = torch.tensor([[1e8, 1.0, -1e8, 1.0]], dtype=torch.float32)
    assert float(rp.ordered_sum(x, "sequential")[0]) == 1.0          # ((1e8 + 1) − 1e8) + 1: the first 1 is lost
    assert float(rp.ordered_sum(x, "pairwise")[0]) == 0.0            # (1e8 + 1) + (−1e8 + 1): both are lost
    y = torch.randn(5, 37, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for order in rp.ORDERS:                                            # in float64 both are the sum
        assert torch.allclose(rp.ordered_sum(y, order), y.sum(1), atol=1e-12)
    odd = torch.arange(7, dtype=torch.float32).reshape(1, 7)
    assert float(rp.ordered_sum(odd, "pairwise")[0]) == 21.0


def test_fixed_order_row_sums_ignore_the_batch_and_the_shape_dependent_ones_do_not():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 100, generator=g).to(torch.bfloat16)
    for chunk in (1, 7, 100, 500):
        sums = rp.fixed_order_row_sums(x, chunk)
        assert torch.allclose(sums.double(), x.double().sum(1), atol=0.5)
        assert all(torch.equal(rp.fixed_order_row_sums(x[i:i + 1], chunk)[0], sums[i]) for i in range(9))
    assert torch.equal(rp.fixed_order_row_sums(x, 1), rp.ordered_sum(x, "sequential"))
    alone = torch.stack([rp.shape_dependent_row_sums(x[i:i + 1])[0] for i in range(9)])
    assert not torch.equal(rp.shape_dependent_row_sums(x), alone)
    with pytest.raises(ValueError, match="chunk"):
        rp.fixed_order_row_sums(x, 0)


def test_summation_errors_stay_under_their_bounds_and_grow_with_fewer_bits():
    rows = rp.summation_errors(lengths=(16, 256), rows=32)
    assert len(rows) == 2 * len(rp.DTYPES)
    for r in rows:
        assert 0 <= r.sequential <= r.bound_sequential and 0 <= r.pairwise <= r.bound_pairwise, r
        assert r.bound_sequential == pytest.approx((r.length - 1) * rp.unit_roundoff(rp.DTYPES[r.dtype]))
        assert r.bound_pairwise == pytest.approx(math.ceil(math.log2(r.length)) * rp.unit_roundoff(rp.DTYPES[r.dtype]))
    by = {(r.dtype, r.length): r for r in rows}
    assert by[("bfloat16", 256)].sequential > by[("float16", 256)].sequential > by[("float32", 256)].sequential
    assert by[("bfloat16", 256)].order_gap > 0                       # two orders, two answers


@pytest.fixture(scope="module")
def prompt(tiny_lm):
    return prompts_for(tiny_lm, [20])[0]


def test_batch_variance_is_zero_in_the_batch_invariant_mode(tiny_lm, prompt):
    rows = rp.batch_variance(ModelRunner(tiny_lm, 16, 160, batch_invariant=True), prompt, (1, 2, 5, 9))
    assert [r.batch_size for r in rows] == [1, 2, 5, 9]
    assert all(r.identical and r.same_argmax and r.prefill_diff == r.decode_diff == 0 for r in rows)
    plain = rp.batch_variance(ModelRunner(tiny_lm, 16, 160), prompt, (1, 4))
    assert plain[0].identical and plain[0].prefill_diff == 0          # alone again: the same numbers
    assert all(r.prefill_diff < 1e-3 for r in plain)                   # rounding, not a different model


def test_completions_over_mixes_counts_every_mix(tiny_lm, prompt):
    res = rp.completions_over_mixes(tiny_lm, prompt, num_mixes=4, max_tokens=6, max_others=3, batch_invariant=True)
    assert len(res.completions) == 4 and sum(c for _, c in res.counts) == 4
    assert res.distinct == 1 and res.first_divergence is None and res.gap is None
    assert all(len(c) == 6 for c in res.completions) and res.tokens_per_second > 0


def test_first_divergence_and_its_gap_are_read_from_the_completions(tiny_lm, prompt):
    res = rp.summarize(tiny_lm, prompt, [(1, 2, 3, 4), (1, 2, 9, 4), (1, 2, 3, 4)], 10.0)
    assert res.distinct == 2 and res.counts[0] == ((1, 2, 3, 4), 2) and res.first_divergence == 2
    with torch.inference_mode():
        logits = tiny_lm.model(torch.tensor([list(prompt) + [1, 2]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    assert res.gap == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert res.min_gap <= res.gap and 0 <= res.min_gap_at < 4
    assert rp.summarize(tiny_lm, prompt, [(5, 6), (5, 6, 7)], 1.0).first_divergence == 2     # one is a prefix
    with pytest.raises(ValueError, match="completions"):
        rp.summarize(tiny_lm, prompt, [], 1.0)


def test_in_dtype_copies_the_model(tiny_lm):
    b16 = rp.in_dtype(tiny_lm, "bfloat16")
    assert next(b16.model.parameters()).dtype == torch.bfloat16 and b16.name == tiny_lm.name
    assert next(tiny_lm.model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        rp.in_dtype(tiny_lm, "float8")


def test_bad_arguments_are_refused(tiny_lm, prompt):
    with pytest.raises(ValueError, match="order"):
        rp.ordered_sum(torch.ones(1, 3), "backwards")
    with pytest.raises(ValueError, match="2-D"):
        rp.ordered_sum(torch.ones(3), "pairwise")
    with pytest.raises(ValueError, match="lengths"):
        rp.summation_errors(lengths=(1,))
    with pytest.raises(ValueError, match="dtypes"):
        rp.summation_errors(dtypes=("float8",))
    with pytest.raises(ValueError, match="num_mixes"):
        rp.completions_over_mixes(tiny_lm, prompt, num_mixes=0)
    with pytest.raises(ValueError, match="batch_sizes"):
        rp.batch_variance(ModelRunner(tiny_lm, 16, 8), prompt, (0,))
    with pytest.raises(ValueError, match="shorter than n_positions"):
        rp.batch_variance(ModelRunner(tiny_lm, 16, 8), [1] * 64)


def test_figures_draw_the_measurements(tiny_lm, prompt):
    fig = vr.summation_figure(rp.summation_errors(lengths=(16, 64), rows=4))
    assert isinstance(fig, go.Figure) and len(fig.data) == 4 * len(rp.DTYPES)
    rows = rp.batch_variance(ModelRunner(tiny_lm, 16, 40, batch_invariant=True), prompt, (1, 2))
    bars = vr.batch_variance_figure({"invariant": rows})
    assert list(bars.data[0].text) == ["0", "0"] and bars.data[0].y[0] == vr.FLOOR
    res = rp.completions_over_mixes(tiny_lm, prompt, num_mixes=2, max_tokens=3, max_others=1)
    assert sum(vr.completions_figure({"a": res}).data[0].y) == res.counts[0][1]
    for builder in (vr.summation_figure, vr.batch_variance_figure, vr.completions_figure):
        with pytest.raises(ValueError):
            builder({} if builder is not vr.summation_figure else [])


def test_batch_lab_switches_settings_without_errors(tiny_lm, prompt):
    panel = batch_lab(tiny_lm, prompt, batch_size=4, trials=1)
    dtype_w, (mode_w, size_w) = panel.children[0].children[0], panel.children[1].children
    readout = panel.children[2]
    assert "batch of 4" in readout.value and panel.error.value == ""
    mode_w.value = "batch-invariant"
    assert "<b>1 of 1</b>" in readout.value and panel.error.value == ""
    dtype_w.value = "bfloat16"
    size_w.value = 8
    assert "bfloat16" in readout.value and "<b>1 of 1</b>" in readout.value and panel.error.value == ""
    with pytest.raises(ValueError, match="batch_size"):
        batch_lab(tiny_lm, prompt, batch_size=5)
    with pytest.raises(ValueError, match="mode"):
        batch_lab(tiny_lm, prompt, mode="fast")
    with pytest.raises(ValueError, match="prompt"):
        batch_lab(tiny_lm, [])


def test_batch_mixes_hold_the_target_once_and_are_the_same_for_both_engines(prompt):
    mixes = rp.batch_mixes(prompt, vocab=100, n_positions=80, num_mixes=6, max_tokens=10, max_others=5, seed=3)
    assert mixes == rp.batch_mixes(prompt, vocab=100, n_positions=80, num_mixes=6, max_tokens=10, max_others=5, seed=3)
    assert mixes[0] == ([{"prompt_token_ids": list(prompt), "max_tokens": 10}], 0)          # the first: alone
    for requests, where in mixes:
        assert requests[where] == {"prompt_token_ids": list(prompt), "max_tokens": 10} and len(requests) <= 6
        others = [r for i, r in enumerate(requests) if i != where]
        assert all(1 <= len(r["prompt_token_ids"]) <= 48 and 1 <= r["max_tokens"] <= 10 for r in others)
        assert all(0 <= t < 100 for r in others for t in r["prompt_token_ids"])
    assert len({len(r) for r, _ in mixes}) > 1


def test_the_vllm_side_says_how_to_set_it_up_when_it_is_missing(tiny_lm, prompt, monkeypatch):
    from labsupport import vllm_bridge

    monkeypatch.setattr(vllm_bridge, "vllm_python", lambda: None)
    with pytest.raises(vllm_bridge.VLLMError, match="make vllm"):
        rp.vllm_completions_over_mixes(tiny_lm, prompt, num_mixes=2)
    assert "VLLM_BATCH_INVARIANT" not in __import__("os").environ
