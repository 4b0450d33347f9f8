"""Panels with bad starting values raise a ValueError naming the panel's range; an error inside
a callback shows up in the panel (a red line) and the panel keeps working afterwards."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labsupport.models import load_model
from labsupport.sim.fragmentation import Workload
from labsupport.widgets.batching import batching_lab
from labsupport.widgets.beam import beam_explorer
from labsupport.widgets.common import error_html, guarded
from labsupport.widgets.kv import kv_cache_animation, kv_memory_calculator
from labsupport.widgets.paged import block_table_stepper, fragmentation_lab
from labsupport.widgets.sampling import sampling_lab
from labsupport.widgets.speculative import round_panel, theory_panel


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-gpt2", device="cpu")


def test_guard_reports_the_error_then_clears_it():
    shown = []

    @guarded(shown.append)
    def callback(x):
        return 1 / x

    assert callback(0) is None and "division by zero" in shown[-1] and "#b00020" in shown[-1]
    assert callback(2) == 0.5 and shown[-1] == ""
    assert "&lt;b&gt;" in error_html(ValueError("<b>"))


# --- sampling lab: valid SamplingParams are shown as given, not clamped ----------------------

def test_sampling_lab_shows_valid_values_as_given(lm):
    box = sampling_lab(lm, top_k=100, top_p=0.01, temperature=3.0, repetition_penalty=0.5)
    got = {k: box.controls[k].value for k in ("top_k", "top_p", "temperature", "repetition_penalty")}
    assert got == {"top_k": 100, "top_p": 0.01, "temperature": 3.0, "repetition_penalty": 0.5}


def test_sampling_lab_refuses_values_beyond_its_sliders(lm):
    with pytest.raises(ValueError, match="temperature.*panel's slider range"):
        sampling_lab(lm, temperature=50.0)


# --- beam explorer ---------------------------------------------------------------------------

@pytest.mark.parametrize("kw, name", [({"beam_width": 10}, "beam_width"), ({"beam_width": 0}, "beam_width"),
                                      ({"depth": 20}, "depth"), ({"length_penalty": 9.0}, "length_penalty")])
def test_beam_explorer_refuses_values_outside_its_sliders(lm, kw, name):
    with pytest.raises(ValueError, match=f"{name}.*panel's slider range"):
        beam_explorer(lm, **kw)


def test_beam_explorer_shows_an_error_then_recovers(lm):
    box = beam_explorer(lm, beam_width=np.int64(2), depth=2)
    prompt, summary, out = box.children[0].children[0], box.children[2], box.children[3]
    before = summary.value
    prompt.value = ""                                   # an empty prompt is refused by beam_search
    assert "⚠" in str(out.outputs) and summary.value == before
    prompt.value = "Hello there"
    assert out.outputs == () and summary.value != before


# --- KV panels -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"prompt_len": 100}, {"prompt_len": 0}, {"new_tokens": 65}, {"step": 99}])
def test_kv_cache_animation_refuses_values_outside_its_sliders(kw):
    with pytest.raises(ValueError, match=f"{next(iter(kw))}.*panel's slider range"):
        kv_cache_animation(**kw)


def test_kv_cache_animation_accepts_numpy_integers():
    box = kv_cache_animation(prompt_len=np.int64(20), new_tokens=np.int32(10), step=np.int64(3))
    assert box.children[0].children[0].value == 20


def test_kv_memory_calculator_offers_every_kv_dtype():
    box = kv_memory_calculator(kv_dtype="bf16")
    assert box.children[1].value == "bf16" and "int8" in box.children[1].options
    with pytest.raises(ValueError, match="kv_dtype"):
        kv_memory_calculator(kv_dtype="fp12")


# --- paged panels ----------------------------------------------------------------------------

def test_fragmentation_lab_refuses_a_block_size_off_its_slider():
    with pytest.raises(ValueError, match="block_size"):
        fragmentation_lab(block_size=3)


def test_fragmentation_lab_shows_a_block_size_the_workload_cannot_hold_then_recovers():
    box = fragmentation_lab(Workload(memory_tokens=1088, reservation=1050), block_size=4)
    bsize = box.children[0].children[0].children[1]
    error = box.error
    table = box.children[0].children[1].children[1]
    bsize.value = 128                                   # 8 blocks of 128 = 1024 < 1050 tokens
    assert "block_size" in error.value and "#b00020" in error.value
    before = table.value
    bsize.value = 8
    assert error.value == "" and table.value != before


def test_block_table_stepper_refuses_a_start_that_is_not_a_frame():
    frames = [{"block_tables": {0: [0]}, "ref_counts": [1, 0], "label": "step 0"}]
    with pytest.raises(ValueError, match="start"):
        block_table_stepper(frames, num_blocks=2, block_size=4, start=99)


# --- batching --------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"num_requests": 0}, {"batch_size": 64}, {"spread": 0.99}])
def test_batching_lab_refuses_values_outside_its_sliders(kw):
    with pytest.raises(ValueError, match=f"{next(iter(kw))}.*panel's slider range"):
        batching_lab(**kw)


# --- speculative panels ----------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"alpha": 1.0}, {"c": -1.0}, {"gamma": 13}])
def test_theory_panel_refuses_values_outside_its_sliders(kw):
    with pytest.raises(ValueError, match=f"{next(iter(kw))}.*panel's slider range"):
        theory_panel(**kw)


def test_round_panel_refuses_a_gamma_beyond_its_slider(lm):
    with pytest.raises(ValueError, match="gamma.*panel's slider range"):
        round_panel(lm, lm, "Hello", gamma=10)


def test_round_panel_shows_a_dash_when_nothing_was_proposed(lm):
    box = round_panel(lm, lm, "Hello", max_new_tokens=1)
    box.controls["proposer"].value = "n-gram"
    assert math.isnan(box.state["result"].stats.alpha)
    assert "nan" not in box.stats.value and "–" in box.stats.value
