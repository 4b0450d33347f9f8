"""Edges of the core helpers: values that pass a finiteness check yet overflow, ids outside the
vocabulary, wrong types, empty inputs, and a simulator that must not walk idle steps one by one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from labsupport.beam import beam_search, length_normalised_score
from labsupport.models import load_model
from labsupport.sampling import SamplingParams, process_logits, sample
from labsupport.sampling.measures import entropy_bits, probability_ratio, sequence_perplexity
from labsupport.sim.batching import simulate_batching
from labsupport.sim.serving import latency_stats
from labsupport.sampling import sample_from
from labsupport.speculative.rejection import verify, verify_logits


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-gpt2", device="cpu")


# --- measures -------------------------------------------------------------------------------

def test_sequence_perplexity_of_a_very_unlikely_text_is_inf_not_overflow():
    assert sequence_perplexity([-1000.0]) == math.inf
    assert sequence_perplexity([-1.0, -1.0]) == pytest.approx(math.e)


def test_sequence_perplexity_rejects_positive_or_nan_logprobs():
    with pytest.raises(ValueError, match="token_logprobs"):
        sequence_perplexity([0.5])
    with pytest.raises(ValueError, match="token_logprobs"):
        sequence_perplexity([float("nan")])


def test_probability_ratio_rejects_nan_gap():
    with pytest.raises(ValueError, match="logit_gap"):
        probability_ratio(float("nan"), 1.0)
    assert probability_ratio(2.0, 1.0) == pytest.approx(math.exp(2))


def test_entropy_bits_rejects_what_is_not_a_distribution():
    with pytest.raises(ValueError, match="probs"):
        entropy_bits(torch.tensor([-0.5, 1.5]))
    with pytest.raises(ValueError, match="probs"):
        entropy_bits(torch.tensor([0.2, 0.2]))
    assert float(entropy_bits(torch.tensor([0.5, 0.5]))) == pytest.approx(1.0)


def test_entropy_bits_of_none_is_a_type_error_naming_probs():
    with pytest.raises(TypeError, match="probs"):
        entropy_bits(None)


# --- sampling -------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [sample, process_logits])
def test_sampling_entry_points_name_params_when_it_is_none(fn):
    with pytest.raises(TypeError, match="params"):
        fn(torch.randn(8), None)


# --- beam -----------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [-300.0, 300.0])
def test_beam_search_with_an_extreme_length_penalty_finishes(lm, alpha):
    result = beam_search(lm, "Hello", 2, max_new_tokens=30, length_penalty=alpha)
    assert len(result.best.token_ids) >= 1 and not math.isnan(result.best.score)


def test_length_normalised_score_does_not_divide_by_an_underflowed_zero():
    assert length_normalised_score(-2.0, 20, -300.0) == -math.inf
    assert length_normalised_score(-2.0, 20, 300.0) == pytest.approx(0.0)


def test_beam_search_accepts_numpy_integer_beam_width(lm):
    a = beam_search(lm, "Hello", np.int64(2), max_new_tokens=3)
    b = beam_search(lm, "Hello", 2, max_new_tokens=3)
    assert a.best.token_ids == b.best.token_ids


# --- speculative ----------------------------------------------------------------------------

@pytest.mark.parametrize("row", [torch.zeros(5), torch.full((5,), float("nan"))])
def test_sample_from_refuses_rows_with_nothing_to_draw(row):
    with pytest.raises(ValueError, match="probs"):
        sample_from(row)


def test_verify_rejects_a_draft_id_outside_the_vocabulary():
    p = torch.softmax(torch.randn(1, 3, 10), -1)
    q = torch.softmax(torch.randn(1, 2, 10), -1)
    with pytest.raises(ValueError, match="draft_tokens"):
        verify(p, q, torch.tensor([[3, 99]]), torch.Generator().manual_seed(0))


def test_verify_logits_rejects_two_vocabularies():
    with pytest.raises(ValueError, match="draft_logits"):
        verify_logits(torch.randn(1, 3, 10), torch.randn(1, 2, 12), torch.tensor([[1, 2]]),
                      SamplingParams(temperature=1.0))


def test_two_token_tree_rejects_an_empty_prefix(lm):
    from labsupport.speculative.exactness import two_token_tree
    with pytest.raises(ValueError, match="prefix"):
        two_token_tree(lm, lm, [], SamplingParams(temperature=1.0, top_k=4))


def test_measure_costs_rejects_an_empty_context(lm):
    from labsupport.bench.speculative import measure_costs
    with pytest.raises(ValueError, match="context"):
        measure_costs(lm, None, [], gammas=[1], repeats=1)


# --- models ---------------------------------------------------------------------------------

def test_load_model_of_a_folder_that_is_not_a_model_names_the_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="name_or_path") as err:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(err.value)


# --- simulators -----------------------------------------------------------------------------

def test_latency_stats_of_nothing_served_is_a_value_error():
    with pytest.raises(ValueError, match="served"):
        latency_stats([])


def test_simulate_batching_jumps_idle_steps_to_the_next_arrival():
    run = simulate_batching([3, 2], 2, arrival_steps=[0, 500_000])
    assert run.num_steps == 500_002
    assert run.first_token_step() == [1, 1]
    assert sum(run.active_per_step) == 5


def test_simulate_batching_refuses_an_arrival_beyond_what_it_records():
    with pytest.raises(ValueError, match="arrival_steps"):
        simulate_batching([3], 2, arrival_steps=[10**9])


# --- numpy integers pass every integer check ----------------------------------------------

def test_numpy_integers_are_accepted_by_kv_bytes_fork_and_gamma(lm):
    from labsupport.engine import LLMEngine
    from labsupport.kv import kv_bytes, preset
    from labsupport.speculative import NgramProposer

    shape = preset("Llama 3 8B")
    assert kv_bytes(shape, np.int64(128), np.int32(2)) == kv_bytes(shape, 128, 2)
    engine = LLMEngine(lm, block_size=4, num_blocks=32)
    rid = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, ignore_eos=True), max_tokens=4)
    engine.step()
    assert len(engine.fork(rid, np.int64(2))) == 2
    assert NgramProposer(np.int64(2)).num_speculative_tokens == 2
