"""Bad inputs and edge cases of labsupport.generation (and the engine agreeing with it): prompt
types, empty prompts, lengths up to n_positions, stop strings across tokens, EOS first.

Rules checked: bad input raises an error naming the parameter; no NaN, no IndexError; every
request added to the engine ends with a finish reason and the block pool is whole at the end.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import pool_is_whole, prompts_for

from labsupport.engine import LLMEngine
from labsupport.generation import generate, generate_batch, next_token_logits, token_forwards
from labsupport.sampling import GREEDY, SamplingParams

NO_EOS = GREEDY.replace(ignore_eos=True)


# ============================================================================ generation
@pytest.mark.parametrize("prompt", [[1.7, 2], ["a"], [[1, 2]], None, 5, [True, 3], torch.tensor([[1, 2]])])
def test_prompt_of_wrong_type_is_a_type_error(tiny_lm, prompt):
    with pytest.raises(TypeError, match="prompt"):
        generate(tiny_lm, prompt, NO_EOS, max_new_tokens=2)


def test_prompt_ids_as_tensor_or_numpy_and_numpy_max_new(tiny_lm):
    ref = generate(tiny_lm, [5, 6, 7], NO_EOS, max_new_tokens=3).token_ids
    assert generate(tiny_lm, torch.tensor([5, 6, 7]), NO_EOS, max_new_tokens=np.int64(3)).token_ids == ref
    assert generate(tiny_lm, np.array([5, 6, 7]), NO_EOS, max_new_tokens=3).token_ids == ref
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8)
    (out,) = engine.generate(list(np.array([5, 6, 7])), NO_EOS, max_tokens=np.int32(3))
    assert out.token_ids == ref


def test_empty_prompt_everywhere(tiny_lm):
    for call in (lambda: generate(tiny_lm, [], NO_EOS, max_new_tokens=1),
                 lambda: generate(tiny_lm, "", NO_EOS, max_new_tokens=1),
                 lambda: generate_batch(tiny_lm, ["Hello", ""], NO_EOS, max_new_tokens=1),
                 lambda: next_token_logits(tiny_lm, []),
                 lambda: LLMEngine(tiny_lm, block_size=4, num_blocks=8).add_request([], NO_EOS)):
        with pytest.raises(ValueError, match="empty prompt"):
            call()
    for prompts in ([], "Hello"):                                  # a bare string is not a list of prompts
        with pytest.raises(ValueError, match="prompts"):
            generate_batch(tiny_lm, prompts, NO_EOS, max_new_tokens=1)


def test_lengths_up_to_exactly_n_positions(tiny_lm):
    """prompt + max_new_tokens may reach n_positions (64) exactly, never more; no IndexError."""
    for use_cache in (True, False):
        out = generate(tiny_lm, [7] * 60, NO_EOS, max_new_tokens=4, use_cache=use_cache, record=False)
        assert len(out.token_ids) == 4
    assert len(generate(tiny_lm, [7], NO_EOS, max_new_tokens=63, record=False).token_ids) == 63
    with pytest.raises(ValueError, match="n_positions"):
        generate(tiny_lm, [7] * 64, NO_EOS, max_new_tokens=1)
    assert next_token_logits(tiny_lm, [7] * 64).shape == (tiny_lm.model.config.vocab_size,)
    with pytest.raises(ValueError, match="n_positions"):
        next_token_logits(tiny_lm, [7] * 65)                       # was an IndexError
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=40)
    fits = engine.add_request([7] * 60, NO_EOS, max_tokens=4)
    past = engine.add_request([7] * 60, NO_EOS, max_tokens=5)     # runs until the window is full
    engine.run()
    assert engine.output(fits).token_ids == generate(tiny_lm, [7] * 60, NO_EOS, max_new_tokens=4).token_ids
    assert engine.output(past).finish_reason == "length" and engine.output(past).token_ids == engine.output(fits).token_ids
    pool_is_whole(engine)


def test_generate_rejects_bad_params_and_top_n(tiny_lm):
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        generate(tiny_lm, [1], {"temperature": 0}, max_new_tokens=1)
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        generate_batch(tiny_lm, [[1]], None, max_new_tokens=1)
    with pytest.raises(ValueError, match="top_n"):
        generate(tiny_lm, [1], NO_EOS, max_new_tokens=1, top_n=-1)  # was a RuntimeError from topk
    with pytest.raises(TypeError, match="prompt_len"):
        token_forwards(2.5, 3, True)
    with pytest.raises(ValueError, match="prompt_len"):
        token_forwards(0, 3, True)


def test_tiny_temperature_generation_equals_greedy(tiny_lm):
    greedy = generate(tiny_lm, [1, 2, 3], NO_EOS, max_new_tokens=8).token_ids
    for t in (1e-30, 1e-320):
        params = SamplingParams(temperature=t, seed=0, ignore_eos=True)
        assert generate(tiny_lm, [1, 2, 3], params, max_new_tokens=8).token_ids == greedy


def _spanning_stop(lm, token_ids):
    """A 2-character stop string made of the last character of token i and the first of token
    i + 1, whose first occurrence in the text is exactly there; returns (stop, i, cut)."""
    text = lm.decode(token_ids)
    for i in range(len(token_ids) - 1):
        head = lm.decode(token_ids[:i + 1])
        piece = lm.decode(token_ids[i + 1:i + 2])
        if not head or not piece or not text.startswith(head) or not (head[-1] + piece[0]).isprintable():
            continue
        stop = head[-1] + piece[0]
        if text.startswith(head + piece) and text.find(stop) == len(head) - 1:
            return stop, i, len(head) - 1
    return None


def test_stop_string_spanning_two_tokens(tiny_lm):
    params = SamplingParams(temperature=1.0, seed=3, ignore_eos=True)
    full = generate(tiny_lm, "Hello", params, max_new_tokens=24)
    found = _spanning_stop(tiny_lm, full.token_ids)
    assert found is not None, "the seeded sample has no usable token boundary"
    stop, i, cut = found
    out = generate(tiny_lm, "Hello", params.replace(stop=(stop,)), max_new_tokens=24)
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:i + 2]
    assert out.text == full.text[:cut] and stop not in out.text
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    (eng,) = engine.generate(["Hello"], params.replace(stop=[stop]), max_tokens=24)
    assert (eng.token_ids, eng.text, eng.finish_reason) == (out.token_ids, out.text, "stop")


def test_eos_as_the_very_first_token():
    """Greedy first token is EOS (final layer norm zeroed, so the logits are the same at every
    position, and the EOS row of the LM head points along its bias): stop at once, empty text."""
    from helpers import make_tiny_lm

    lm = make_tiny_lm(seed=4)
    eos = lm.eos_token_id
    with torch.no_grad():
        ln_f = lm.model.transformer.ln_f
        ln_f.weight.zero_()
        ln_f.bias.copy_(torch.linspace(-1, 1, ln_f.bias.numel()))
        lm.model.lm_head.weight[eos] = 50 * ln_f.bias
    for use_cache in (True, False):
        out = generate(lm, "Hello", GREEDY, max_new_tokens=5, use_cache=use_cache)
        assert (out.token_ids, out.text, out.finish_reason) == ([eos], "", "stop")
    batch = generate_batch(lm, ["Hello", "a b c"], GREEDY, max_new_tokens=5)
    assert [(r.token_ids, r.text, r.finish_reason) for r in batch] == [([eos], "", "stop")] * 2
    engine = LLMEngine(lm, block_size=4, num_blocks=16)
    outs = engine.generate(["Hello", "a b c"], GREEDY.replace(n=2), max_tokens=5)
    assert [(o.token_ids, o.text, o.finish_reason) for o in outs] == [([eos], "", "stop")] * 4
    ignored = generate(lm, "Hello", NO_EOS, max_new_tokens=3)
    assert ignored.token_ids == [eos] * 3 and ignored.finish_reason == "length"
    pool_is_whole(engine)


def test_batch_of_very_different_lengths(tiny_lm):
    prompts = prompts_for(tiny_lm, [1, 4, 11], seed=71)
    batch = generate_batch(tiny_lm, prompts, NO_EOS, max_new_tokens=6)
    for p, row in zip(prompts, batch):
        assert row.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=6).token_ids
