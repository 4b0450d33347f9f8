"""Chapter 01 figures and panels, exercised without a browser.

Figure builders are called with small hand-made inputs; the panels are built on the random
tiny GPT-2 (``tiny_lm`` fixture) and driven by setting slider values / clicking buttons,
which runs their callbacks synchronously. Expected values are recomputed independently
with ``labsupport.sampling`` / ``labsupport.generation``.
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go
import pytest
import torch

from labsupport.generation import find_loop, generate, generate_batch, next_token_logits
from labsupport.sampling import (
    GREEDY,
    SamplingParams,
    candidates_for_mass,
    entropy_bits,
    probability_ratio,
    probs_from_logits,
    trace_filters,
)
from labsupport.viz.sampling import (
    chosen_prob_figure,
    distribution_figure,
    entropy_curve_figure,
    filter_figure,
    unique_labels,
)
from labsupport.widgets.sampling import sampling_lab, temperature_panel

PROMPT = "Return the number of items"


# ----------------------------------------------------------------------------- figures

def test_unique_labels_keeps_distinct_and_numbers_repeats():
    assert unique_labels(["a", "b"]) == ["a", "b"]
    assert unique_labels(["�", "x", "�"]) == ["� #1", "x", "� #3"]


def test_distribution_figure_data_and_axes():
    fig = distribution_figure(["␣the", "1", "␣a"], [3.0, 2.0, 1.0], [0.6, 0.3, 0.1], temperature=0.5)
    assert isinstance(fig, go.Figure) and len(fig.data) == 2
    assert list(fig.data[0].x) == [3.0, 2.0, 1.0]
    assert list(fig.data[1].x) == [0.6, 0.3, 0.1]
    assert list(fig.data[1].y) == [0, 1, 2] and list(fig.data[1].customdata) == ["␣the", "1", "␣a"]
    assert list(fig.layout.yaxis.ticktext) == ["␣the", "1", "␣a"]     # the token "1" stays a label
    assert list(fig.layout.yaxis.tickvals) == [0, 1, 2]
    assert fig.layout.yaxis.autorange == "reversed"     # most likely on top
    assert "T = 0.5" in fig.layout.xaxis2.title.text
    assert fig.layout.font.size >= 14


def test_figures_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        distribution_figure(["a", "b"], [1.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="same length"):
        filter_figure(["a"], [1.0], [1.0], ["", "top-k"])
    with pytest.raises(ValueError, match="same length"):
        entropy_curve_figure([0.5, 1.0], [1.0])
    with pytest.raises(ValueError, match="loop_start"):
        chosen_prob_figure(["a", "b"], [0.5, 0.5], loop_start=3)


def test_filter_figure_splits_kept_and_cut():
    fig = filter_figure(["a", "b", "c"], [0.5, 0.3, 0.2], [0.625, 0.375, 0.0], ["", "", "top-p"])
    kept, cut, base = fig.data
    assert list(kept.x) == [0.625, 0.375, 0.0]
    assert list(cut.x) == [0.0, 0.0, 0.2]
    assert list(cut.text) == ["", "", "cut by top-p"]
    assert list(base.x) == [0.5, 0.3, 0.2]


def test_entropy_curve_and_chosen_prob_figures():
    fig = entropy_curve_figure([0.5, 1.0, 2.0], [1.0, 2.0, 3.0], marker_temperature=1.0, marker_entropy=2.0)
    assert list(fig.data[0].y) == [1.0, 2.0, 3.0] and list(fig.data[1].x) == [1.0]
    fig = chosen_prob_figure(["x", "y", "z"], [0.2, 0.9, 0.95], loop_start=1)
    colors = list(fig.data[0].marker.color)
    assert colors[0] != colors[1] and colors[1] == colors[2]
    assert list(fig.layout.xaxis.ticktext) == ["x", "y", "z"] and list(fig.data[0].y) == [0.2, 0.9, 0.95]


# ----------------------------------------------------------------------------- worked numbers

def test_temperature_probability_ratios_in_figures():
    """Chapter 01 worked numbers: gap 2 → ≈ 7.4 / 55 / 2.7 at T = 1 / 0.5 / 2; logits 3, 1 at T = 0.5 → e⁴."""
    assert round(probability_ratio(2.0, 1.0), 1) == 7.4
    assert round(probability_ratio(2.0, 0.5)) == 55
    assert round(probability_ratio(2.0, 2.0), 1) == 2.7
    assert probability_ratio(3.0 - 1.0, 0.5) == pytest.approx(math.e ** 4, rel=1e-12)


# ----------------------------------------------------------------------------- find_loop

@pytest.mark.parametrize("ids, expected", [
    ([9, 1, 2, 3, 1, 2, 3, 1, 2, 3], (1, 3)),
    ([4, 4, 4], (0, 1)),
    ([1, 2, 3, 4, 5], None),
    ([], None),
    ([5, 1, 2, 1, 2], None),                  # only two copies: not a loop at min_repeats 3
])
def test_find_loop_cases(ids, expected):
    assert find_loop(ids) == expected


def test_find_loop_two_repeats_and_bad_argument():
    assert find_loop([5, 1, 2, 1, 2], min_repeats=2) == (1, 2)
    with pytest.raises(ValueError, match="min_repeats"):
        find_loop([1, 1, 1], min_repeats=1)


def test_find_loop_on_random_blocks():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        block = torch.randint(0, 50, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
        prefix = [100 + i for i in range(int(torch.randint(0, 5, (1,), generator=gen)))]
        found = find_loop(prefix + block * 4)
        assert found is not None
        start, period = found
        assert len(block) % period == 0                 # the shortest period divides the block
        assert start <= len(prefix)


# ----------------------------------------------------------------------------- temperature panel

def test_temperature_panel_matches_core(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT, temperature=1.0, top_n=10)
    logits = next_token_logits(tiny_lm, PROMPT)
    p = probs_from_logits(logits, SamplingParams(temperature=1.0))
    top = torch.topk(logits, 10).indices
    assert list(panel.figure.data[1].x) == pytest.approx(p[top].tolist(), abs=1e-7)
    assert list(panel.figure.data[0].x) == pytest.approx(logits[top].tolist(), abs=1e-6)
    assert f"{float(entropy_bits(p)):.2f} bits" in panel.stats.value
    assert f"{candidates_for_mass(p, 0.9):,} of" in panel.stats.value


def test_temperature_slider_sharpens_without_new_forward(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT, temperature=1.0)
    before = list(panel.figure.data[1].x)
    panel.controls["temperature"].value = 0.3
    after = list(panel.figure.data[1].x)
    assert after[0] > before[0]                         # the favourite gains at lower T
    logits = next_token_logits(tiny_lm, PROMPT)
    expected = probs_from_logits(logits, SamplingParams(temperature=0.3))
    assert after[0] == pytest.approx(float(expected.max()), abs=1e-6)
    assert "T = 0.3" in panel.figure.layout.xaxis2.title.text
    panel.controls["temperature"].value = 0.0           # greedy: all mass on the arg-max
    assert panel.figure.data[1].x[0] == pytest.approx(1.0)
    assert sum(panel.figure.data[1].x[1:]) == 0.0
    assert panel.cache.forwards == 1                    # sliders reuse the cached logits


def test_temperature_panel_shift_invariance(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT, temperature=0.7, shift=10.0)
    z0, p0 = list(panel.figure.data[0].x), list(panel.figure.data[1].x)
    panel.controls["shift"].click()
    panel.controls["shift"].click()
    z1, p1 = list(panel.figure.data[0].x), list(panel.figure.data[1].x)
    assert [b - a for a, b in zip(z0, z1)] == pytest.approx([20.0] * len(z0), abs=1e-4)
    assert p1 == pytest.approx(p0, abs=1e-6)
    assert "shifted by +20" in panel.stats.value
    panel.controls["reset"].click()
    assert list(panel.figure.data[0].x) == pytest.approx(z0, abs=1e-6)
    assert "shifted" not in panel.stats.value


def test_temperature_panel_prompt_change_and_empty_prompt(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT)
    labels_before = list(panel.figure.layout.yaxis.ticktext)
    panel.controls["prompt"].value = "Raise ValueError if the argument is"
    assert panel.cache.forwards == 2
    logits = next_token_logits(tiny_lm, "Raise ValueError if the argument is")
    top = torch.topk(logits, len(labels_before)).indices.tolist()
    assert list(panel.figure.layout.yaxis.ticktext) == unique_labels([tiny_lm.token_str(i) for i in top])
    assert list(panel.figure.data[1].customdata) == list(panel.figure.layout.yaxis.ticktext)
    panel.controls["prompt"].value = ""                 # no crash: a message instead
    assert "empty prompt" in panel.stats.value
    with pytest.raises(ValueError, match="top_n"):
        temperature_panel(tiny_lm, PROMPT, top_n=0)


# ----------------------------------------------------------------------------- sampling lab

def _kept_count(panel) -> int:
    return sum(1 for v in panel.figure.data[0].x if v > 0)


def test_sampling_lab_filters_and_reasons(tiny_lm):
    lab = sampling_lab(tiny_lm, PROMPT, max_new_tokens=8, top_n=20)
    assert _kept_count(lab) == 20                       # nothing cut at the defaults
    lab.controls["top_k"].value = 3
    assert _kept_count(lab) == 3
    assert sum(lab.figure.data[0].x) == pytest.approx(1.0, abs=1e-5)    # renormalised over the kept 3
    assert [t for t in lab.figure.data[1].text if t] == ["cut by top-k"] * 17
    assert "cut by top-k" in " ".join(lab.figure.data[1].text)
    lab.controls["top_k"].value = 0
    lab.controls["min_p"].value = 1.0                   # only the arg-max survives min-p = 1
    assert _kept_count(lab) == 1
    assert "cut by min-p" in lab.figure.data[1].text
    assert "1 of" in lab.stats.value


def test_sampling_lab_top_p_keeps_smallest_set(tiny_lm):
    # the random model is nearly flat: T = 0.05 first sharpens it (temperature comes before top-p)
    lab = sampling_lab(tiny_lm, PROMPT, max_new_tokens=4, temperature=0.05, top_p=0.9, top_n=20)
    logits = next_token_logits(tiny_lm, PROMPT)
    trace = trace_filters(logits, SamplingParams(temperature=0.05, top_p=0.9), prev_ids=tiny_lm.encode(PROMPT))
    top = torch.topk(trace.base_probs, 20).indices.tolist()
    shown_kept = [v > 0 for v in lab.figure.data[0].x]
    assert shown_kept == [bool(trace.kept[i]) for i in top]
    kept = sum(shown_kept)
    assert 1 <= kept < 20 and shown_kept == [True] * kept + [False] * (20 - kept)
    base = list(lab.figure.data[2].x)
    assert sum(base[:kept - 1]) < 0.9 <= sum(base[:kept]) + 1e-6     # the smallest prefix with mass >= p
    assert [t for t in lab.figure.data[1].text if t] == ["cut by top-p"] * (20 - kept)


def test_sampling_lab_repetition_penalty_lowers_prompt_tokens(tiny_lm):
    lab = sampling_lab(tiny_lm, PROMPT, max_new_tokens=4, top_n=30)
    prompt_ids = set(tiny_lm.encode(PROMPT))
    logits = next_token_logits(tiny_lm, PROMPT)
    p1 = probs_from_logits(logits, SamplingParams())
    lab.controls["repetition_penalty"].value = 2.0
    p2 = probs_from_logits(logits, SamplingParams(repetition_penalty=2.0), [list(prompt_ids)])
    top = torch.topk(p2, 30).indices
    assert list(lab.figure.data[2].x) == pytest.approx(p2[top].tolist(), abs=1e-6)
    seen = torch.tensor(sorted(prompt_ids))
    assert float(p2[seen].sum()) < float(p1[seen].sum())


def test_sampling_lab_continuation_is_seeded(tiny_lm):
    lab = sampling_lab(tiny_lm, PROMPT, temperature=0.0, max_new_tokens=6)
    greedy = generate(tiny_lm, PROMPT, GREEDY, max_new_tokens=6)
    assert html.escape(greedy.text) in lab.continuation.value
    lab.controls["temperature"].value = 1.0
    lab.controls["seed"].value = 7
    first = lab.continuation.value
    expected = generate(tiny_lm, PROMPT, SamplingParams(temperature=1.0, seed=7, max_tokens=6))
    assert html.escape(expected.text) in first and f"{len(expected.token_ids)} tokens" in first
    lab.update()
    assert lab.continuation.value == first              # same sliders, same text


def test_sampling_lab_samples_and_diversity(tiny_lm):
    lab = sampling_lab(tiny_lm, PROMPT, temperature=0.0, max_new_tokens=5, n_samples=20)
    lab.controls["samples"].click()
    shown = lab.output.outputs[0]["data"]["text/html"]
    assert "<b>1 distinct</b>" in shown and "20×" in shown        # greedy: one continuation 20 times
    lab.controls["temperature"].value = 1.5
    lab.controls["seed"].value = 3
    lab.samples()
    shown = lab.output.outputs[-1]["data"]["text/html"]
    assert len(lab.output.outputs) == 1                 # replaced, not appended
    gen = torch.Generator().manual_seed(3)
    texts = [r.text for r in generate_batch(tiny_lm, [tiny_lm.encode(PROMPT)] * 20,
                                            SamplingParams(temperature=1.5, max_tokens=5), generator=gen)]
    assert f"<b>{len(set(texts))} distinct</b>" in shown
    assert len(set(texts)) > 1


def test_sampling_lab_rejects_bad_start_values(tiny_lm):
    with pytest.raises(ValueError, match="top_p"):
        sampling_lab(tiny_lm, PROMPT, top_p=1.5)
    with pytest.raises(ValueError, match="seed"):
        sampling_lab(tiny_lm, PROMPT, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        sampling_lab(tiny_lm, PROMPT, seed="1")
