"""The temperature panel: prompt edits keep the chart sorted, greedy entropy is +0, edit-logits mode."""

from __future__ import annotations

import pytest
import torch

from labsupport.generation import next_token_logits
from labsupport.sampling import SamplingParams, entropy_bits, probs_from_logits
from labsupport.widgets.sampling import temperature_panel

PROMPT = "If the value is"


def test_prompt_change_replaces_the_category_axis_and_keeps_bars_sorted(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT, top_n=8)
    before = list(panel.figure.layout.yaxis.ticktext)
    panel.controls["prompt"].value = "Raise ValueError if the argument is"
    after = list(panel.figure.layout.yaxis.ticktext)
    assert after == list(panel.figure.data[1].customdata), "axis labels are exactly the new bars' tokens"
    assert after != before and list(panel.figure.layout.yaxis.tickvals) == list(range(8))
    assert list(panel.figure.data[1].y) == list(range(8))
    probs = list(panel.figure.data[1].x)
    assert probs == sorted(probs, reverse=True), "most likely first"


def test_greedy_entropy_is_plus_zero():
    one_hot = torch.tensor([0.0, 1.0, 0.0])
    h = float(entropy_bits(one_hot))
    assert h == 0.0 and str(h) == "0.0"                  # not -0.0


def test_greedy_panel_does_not_show_negative_zero(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT)
    panel.controls["temperature"].value = 0.0
    assert "0.00 bits" in panel.stats.value and "-0.00" not in panel.stats.value


def test_edit_mode_two_equal_logits_give_50_50_and_one_bit(tiny_lm):
    panel = temperature_panel(tiny_lm, PROMPT, temperature=1.0, edit_n=2)
    panel.controls["mode"].value = "edit"
    z = next_token_logits(tiny_lm, PROMPT)
    top2 = torch.topk(z, 2)
    first, second = panel.controls["edit"]
    assert first.value == pytest.approx(round(float(top2.values[0]), 1))
    assert second.value == pytest.approx(round(float(top2.values[1]), 1))
    h_before = float(entropy_bits(probs_from_logits(torch.tensor([first.value, second.value]),
                                                    SamplingParams(temperature=1.0))))
    assert f"{h_before:.2f} bits" in panel.stats.value
    second.value = first.value
    assert list(panel.figure.data[1].x) == pytest.approx([0.5, 0.5])
    assert "1.00 bits" in panel.stats.value and "50.0 %" in panel.stats.value
    assert len(panel.figure.data[0].x) == 2 and panel.cache.forwards == 1
    panel.controls["mode"].value = "model"                 # back to the whole vocabulary
    assert len(panel.figure.data[1].x) == 20


def test_edit_mode_raises_for_bad_size_and_shows_errors_inline(tiny_lm):
    with pytest.raises(ValueError, match="edit_n"):
        temperature_panel(tiny_lm, PROMPT, edit_n=1)
    panel = temperature_panel(tiny_lm, PROMPT)
    panel.controls["prompt"].value = ""
    assert "⚠" in panel.stats.value
