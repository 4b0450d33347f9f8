"""The request API every vLLM / OpenAI user meets: frequency and presence penalties, stop token
ids, min_tokens, the nucleus boundary and its tie rule, one vocabulary for draft and target."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labsupport import speculative as spec
from labsupport.engine import LLMEngine
from labsupport.generation import generate, generate_batch
from labsupport.sampling import (
    SamplingParams,
    apply_frequency_presence_penalty,
    process_logits,
    top_k_filter,
    top_p_filter,
)

NO_EOS = SamplingParams(temperature=0.0, ignore_eos=True)


# ---------------------------------------------------------------------------- penalties
def test_three_penalties_by_hand():
    # logits [1.0, -0.5, 2.0, 0.0]; prompt {0}; output [2, 2, 1]; rep 1.5, freq 0.4, pres 0.3
    # repetition (prompt ∪ output = {0, 1, 2}): 1.0/1.5 = 0.6667, -0.5*1.5 = -0.75, 2.0/1.5 = 1.3333, 0.0
    # frequency over the output (counts 0:0, 1:1, 2:2): -0.4*[0, 1, 2, 0] = [0, -0.4, -0.8, 0]
    # presence over the output (1 and 2 occur): -0.3*[0, 1, 1, 0] = [0, -0.3, -0.3, 0]
    # → [0.6667, -1.45, 0.2333, 0.0]
    params = SamplingParams(temperature=1.0, repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3)
    out = process_logits(torch.tensor([1.0, -0.5, 2.0, 0.0]), params, [0, 2, 2, 1], prompt_lens=1)
    torch.testing.assert_close(out - out.max(), torch.tensor([2 / 3, -1.45, 4 / 3 - 1.1, 0.0]) - 2 / 3,
                               atol=1e-6, rtol=0)


def test_frequency_and_presence_look_at_the_output_only():
    z = torch.zeros(5)
    out = apply_frequency_presence_penalty(z, [[3, 3, 3, 1]], 0.5, 0.25)
    assert out.tolist() == [0.0, -0.75, 0.0, -1.75, 0.0]
    with pytest.raises(ValueError, match="prompt_lens"):
        process_logits(z, SamplingParams(frequency_penalty=0.5), [1, 2])        # which part is output?
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=2.5)
    with pytest.raises(TypeError, match="presence_penalty"):
        SamplingParams(presence_penalty="0.1")


def test_frequency_penalty_breaks_greedy_loops_on_the_real_path(tiny_lm):
    prompt = [5, 9, 2, 7, 1, 5, 9, 2]
    plain = generate(tiny_lm, prompt, NO_EOS, max_new_tokens=24, record=False).token_ids
    penalised = generate(tiny_lm, prompt, SamplingParams(temperature=0.0, ignore_eos=True, frequency_penalty=2.0),
                         max_new_tokens=24, record=False).token_ids
    assert max(penalised.count(t) for t in set(penalised)) <= max(plain.count(t) for t in set(plain))
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    same = engine.generate([prompt], SamplingParams(temperature=0.0, ignore_eos=True, frequency_penalty=2.0),
                           max_tokens=24)[0]
    assert same.token_ids == penalised                                      # engine = generate
    batch = generate_batch(tiny_lm, [prompt, [3, 4]], SamplingParams(temperature=0.0, ignore_eos=True,
                                                                     frequency_penalty=2.0), max_new_tokens=24)
    assert batch[0].token_ids == penalised


def test_penalties_equal_transformers_processors():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 50, generator=g)
    history = torch.randint(0, 50, (2, 12), generator=g)
    ours = process_logits(logits, SamplingParams(repetition_penalty=1.7), history)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(history, logits.clone())
    torch.testing.assert_close(ours - ours.max(-1, keepdim=True).values,
                               theirs - theirs.max(-1, keepdim=True).values, atol=1e-5, rtol=0)


def test_speculative_paths_apply_penalties_like_plain_decoding(tiny_lm):
    params = SamplingParams(temperature=0.0, ignore_eos=True, frequency_penalty=1.0, presence_penalty=0.5,
                            repetition_penalty=1.2)
    prompt = [1, 1, 1, 2, 1, 1, 1]
    ref = generate(tiny_lm, prompt, params, max_new_tokens=20, record=False).token_ids
    for proposer in (spec.NgramProposer(4), spec.DraftModelProposer(tiny_lm, tiny_lm, 4)):
        res = spec.speculative_generate(tiny_lm, proposer, prompt, params, max_new_tokens=20)
        assert res.token_ids == ref
    eng = spec.SpeculativeEngine(tiny_lm, spec.DraftModelProposer(tiny_lm, tiny_lm, 3), block_size=4, num_blocks=64)
    assert eng.generate([prompt], params, 20)[0].token_ids == ref


# ---------------------------------------------------------------------------- stop token ids and min_tokens
def _free_run(lm, prompt, n=16):
    return generate(lm, prompt, NO_EOS, max_new_tokens=n, record=False).token_ids


def test_stop_token_ids_end_every_path(tiny_lm):
    prompt = [5, 9, 2, 7, 1]
    run = _free_run(tiny_lm, prompt)
    k = next(i for i in range(1, len(run)) if run[i] not in run[:i])       # first time this token appears
    params = SamplingParams(temperature=0.0, ignore_eos=True, stop_token_ids=[run[k]], max_tokens=16)
    want = run[:k + 1]
    out = generate(tiny_lm, prompt, params, record=False)
    assert out.token_ids == want and out.finish_reason == "stop" and out.text == tiny_lm.decode(run[:k])
    assert generate_batch(tiny_lm, [prompt], params)[0].token_ids == want
    assert LLMEngine(tiny_lm, block_size=4, num_blocks=32).generate([prompt], params)[0].token_ids == want
    for proposer in (spec.NgramProposer(6), spec.DraftModelProposer(tiny_lm, tiny_lm, 6)):
        assert spec.speculative_generate(tiny_lm, proposer, prompt, params).token_ids == want
    assert spec.SpeculativeEngine(tiny_lm, spec.DraftModelProposer(tiny_lm, tiny_lm, 6), block_size=4,
                                  num_blocks=64).generate([prompt], params)[0].token_ids == want


def test_min_tokens_holds_back_the_end_ids(tiny_lm):
    prompt = [5, 9, 2, 7, 1]
    run = _free_run(tiny_lm, prompt)
    stop_id = run[0]                                                      # would stop at once
    params = SamplingParams(temperature=0.0, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=4, max_tokens=16)
    out = generate(tiny_lm, prompt, params, record=False)
    assert len(out.token_ids) >= 4 and stop_id not in out.token_ids[:3]
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32).generate([prompt], params)[0]
    assert engine.token_ids == out.token_ids
    spec_out = spec.speculative_generate(tiny_lm, spec.DraftModelProposer(tiny_lm, tiny_lm, 4), prompt, params)
    assert spec_out.token_ids == out.token_ids
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=20, max_tokens=16)


# ---------------------------------------------------------------------------- the nucleus boundary and ties
@pytest.mark.parametrize("probs, p, kept", [
    ([0.1, 0.85, 0.05], 0.95, {0, 1}),                # 0.85 + 0.10 reach 0.95: the third is not needed
    ([0.05, 0.1, 0.85], 0.85, {2}),                   # 0.85 alone reaches 0.85
    ([0.5, 0.25, 0.125, 0.125], 0.75, {0, 1}),
    ([0.5, 0.25, 0.125, 0.125], 0.76, {0, 1, 2}),     # the tie at the cut: the lower id first
])
def test_top_p_boundary_is_exact(probs, p, kept):
    out = top_p_filter(torch.log(torch.tensor(probs)), p)
    assert set(torch.isfinite(out).nonzero().flatten().tolist()) == kept


def test_top_p_boundary_on_a_grid():
    grid = [i / 20 for i in range(1, 20)]
    wrong = 0
    for a in grid:
        for b in grid:
            c = round(1 - a - b, 10)
            if c <= 0:
                continue
            probs = [a, b, c]
            for p in grid:
                order = sorted(range(3), key=lambda i: (-probs[i], i))
                need, mass = [], 0.0
                for i in order:                                        # exact decimal arithmetic by hand
                    if round(mass, 9) >= p:
                        break
                    need.append(i)
                    mass += probs[i]
                out = top_p_filter(torch.log(torch.tensor(probs)), p)
                wrong += set(torch.isfinite(out).nonzero().flatten().tolist()) != set(need)
    assert wrong == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=3, max_size=12), st.floats(0.05, 0.99), st.integers(1, 6),
       st.randoms(use_true_random=False))
def test_kept_probabilities_do_not_depend_on_token_ids(levels, p, k, rnd):
    logits = torch.tensor([float(v) for v in levels])                  # many exact ties
    perm = list(range(len(levels)))
    rnd.shuffle(perm)
    permuted = logits[perm]
    for filt, arg in ((top_p_filter, p), (top_k_filter, k)):
        a = torch.softmax(filt(logits, arg), -1)
        b = torch.softmax(filt(permuted, arg), -1)
        assert sorted(a[a > 0].tolist()) == pytest.approx(sorted(b[b > 0].tolist()), abs=1e-6)
        wide = torch.cat([logits, torch.full((7,), -30.0)])            # a larger vocabulary, same top
        c = torch.softmax(filt(wide, arg), -1)[:len(levels)]
        assert (c > 0).tolist() == (a > 0).tolist()
    both = top_p_filter(torch.stack([logits, logits]), p)              # batch position does not matter
    assert torch.equal(both[0], both[1])


def test_top_k_keeps_every_tie_of_the_kth_value_like_hf():
    from transformers import TopKLogitsWarper

    z = torch.tensor([0.5, 1.5, 1.5, 1.5, 2.5, -1.0])
    assert torch.isfinite(top_k_filter(z, 2)).nonzero().flatten().tolist() == [1, 2, 3, 4]
    out = top_k_filter(torch.tensor([1.0, 2.0, 2.0, 2.0, 0.5]), 2)
    assert torch.isfinite(out).tolist() == [False, True, True, True, False]
    gen = torch.Generator().manual_seed(1)
    levels = torch.randint(0, 4, (32, 20), generator=gen).float()           # many exact ties
    for k in (1, 2, 3, 5, 19):
        hf = TopKLogitsWarper(k)(torch.zeros(32, 1, dtype=torch.long), levels.clone())
        assert torch.equal(torch.isfinite(hf), torch.isfinite(top_k_filter(levels, k))), k


# ---------------------------------------------------------------------------- one vocabulary
def test_draft_with_another_vocabulary_is_refused_on_every_path(tiny_lm):
    from helpers import make_tiny_lm

    other = make_tiny_lm(seed=1, vocab_size=tiny_lm.model.config.vocab_size - 96)
    with pytest.raises(ValueError, match="vocab"):
        spec.speculative_generate(tiny_lm, spec.DraftModelProposer(other, num_speculative_tokens=2), [1, 2, 3],
                                  NO_EOS, max_new_tokens=4)
    with pytest.raises(ValueError, match="vocab"):
        spec.DraftModelProposer(other, tiny_lm)
    with pytest.raises(ValueError, match="vocab"):
        spec.SpeculativeEngine(tiny_lm, {"method": "draft_model", "draft_model": other})


def test_logits_helpers_stay_finite():
    out = process_logits(torch.tensor([0.0, 0.0, -math.inf]), SamplingParams(frequency_penalty=-2.0),
                         [0, 0, 1], prompt_lens=0)
    assert torch.isfinite(out[:2]).all() and out[2] == -math.inf
