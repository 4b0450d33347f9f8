"""The generation loop: cache equals full forward, left padding, stop conditions, equality with transformers' generate."""

from __future__ import annotations

import pytest
import torch

from labsupport.generation import generate, generate_batch, left_pad, next_token_logits, token_forwards
from labsupport.models import model_forward
from labsupport.sampling import GREEDY, SamplingParams


def test_prefill_then_decode_matches_full_forward(tiny_lm):
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        full, _ = model_forward(tiny_lm.model, ids, use_cache=False)
        logits, cache = model_forward(tiny_lm.model, ids[:, :3])
        assert cache.get_seq_length() == 3
        step4, cache = model_forward(tiny_lm.model, ids[:, 3:4], cache, position_ids=torch.tensor([[3]]))
        assert cache.get_seq_length() == 4
        step5, cache = model_forward(tiny_lm.model, ids[:, 4:5], cache, position_ids=torch.tensor([[4]]))
    assert torch.allclose(logits[0, -1], full[0, 2], atol=1e-4)
    assert torch.allclose(step4[0, -1], full[0, 3], atol=1e-4)
    assert torch.allclose(step5[0, -1], full[0, 4], atol=1e-4)


def test_greedy_identical_with_and_without_cache(tiny_lm):
    a = generate(tiny_lm, [1, 2, 3, 4, 5], max_new_tokens=32, use_cache=True)
    b = generate(tiny_lm, [1, 2, 3, 4, 5], max_new_tokens=32, use_cache=False)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 32
    assert a.token_forwards == token_forwards(5, 32, True) == 36
    assert b.token_forwards == token_forwards(5, 32, False) == 32 * 5 + 32 * 31 // 2
    # positions recorded: the k-th new token is predicted at position P + k
    assert [s.position for s in a.steps[:2]] == [5, 6]


def test_greedy_equals_transformers_generate(tiny_lm):
    for prompt in ("Return the number of", "Hello", "If the value is not given, the default"):
        ours = generate(tiny_lm, prompt, max_new_tokens=24)
        ids = torch.tensor([ours.prompt_ids])
        hf = tiny_lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ours.token_ids == hf[0, ids.shape[1]:].tolist()


def test_left_padded_batch_equals_unbatched(tiny_lm):
    prompts = ["Hello, my dog is a little", "Hello"]
    batch = generate_batch(tiny_lm, prompts, GREEDY, max_new_tokens=16)
    for prompt, row in zip(prompts, batch):
        solo = generate(tiny_lm, prompt, GREEDY, max_new_tokens=16)
        assert row.token_ids == solo.token_ids
    ids, mask, pos = left_pad([[7, 8, 9], [5]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]      # real tokens start at position 0


def test_padding_does_not_change_logits(tiny_lm):
    short = tiny_lm.encode("Hello")
    long = tiny_lm.encode("Hello, my dog is a little")
    ids, mask, pos = left_pad([long, short], pad_id=tiny_lm.tokenizer.pad_token_id)
    with torch.no_grad():
        logits, _ = model_forward(tiny_lm.model, ids, attention_mask=mask, position_ids=pos, use_cache=False)
    assert torch.allclose(logits[1, -1], next_token_logits(tiny_lm, short), atol=1e-4)
    assert torch.allclose(logits[0, -1], next_token_logits(tiny_lm, long), atol=1e-4)


def test_stops_on_eos(tiny_lm):
    eos = tiny_lm.eos_token_id
    with torch.no_grad():  # make EOS the most likely token everywhere
        bias = tiny_lm.model.lm_head.weight.new_zeros(tiny_lm.model.config.vocab_size)
        bias[eos] = 1e4
        handle = tiny_lm.model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        out = generate(tiny_lm, "Hello", max_new_tokens=10)
        ignored = generate(tiny_lm, "Hello", SamplingParams(temperature=0, ignore_eos=True), max_new_tokens=3)
    finally:
        handle.remove()
    assert out.finish_reason == "stop" and out.token_ids == [eos] and out.text == ""
    assert ignored.finish_reason == "length" and ignored.token_ids == [eos] * 3


def test_stop_string_cuts_text(tiny_lm):
    free = generate(tiny_lm, "Hello", max_new_tokens=20)
    piece = next(free.text[i:i + 3] for i in range(3, len(free.text) - 2) if free.text[i:i + 3].strip())
    out = generate(tiny_lm, "Hello", SamplingParams(temperature=0, stop=(piece,)), max_new_tokens=20)
    assert out.finish_reason == "stop"
    assert piece not in out.text and free.text.startswith(out.text)
    assert len(out.token_ids) <= len(free.token_ids)


def test_length_limits_are_checked(tiny_lm):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        generate(tiny_lm, "Hello", max_new_tokens=0)
    with pytest.raises(ValueError, match=r"must be < 64 \(the model's n_positions\)"):
        generate(tiny_lm, [7] * 64, max_new_tokens=1)              # the prompt alone fills the window
    run = generate(tiny_lm, [7] * 10, SamplingParams(temperature=0.0, ignore_eos=True), max_new_tokens=200)
    assert run.finish_reason == "length" and len(run.token_ids) == 54    # ran until the window was full
    with pytest.raises(ValueError, match="prompt must contain at least one token id, got an empty prompt"):
        generate(tiny_lm, "", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt must be token ids in \[0, 4096\)"):
        generate(tiny_lm, [10 ** 6], max_new_tokens=2)


def test_sampled_generation_is_reproducible_and_recorded(tiny_lm):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=5)
    a = generate(tiny_lm, "Hello", params, max_new_tokens=12)
    b = generate(tiny_lm, "Hello", params, max_new_tokens=12)
    assert a.token_ids == b.token_ids
    for s in a.steps:
        assert 0 < s.prob <= 1 and s.num_kept >= 1 and len(s.top_ids) == 10
        assert s.top_probs == sorted(s.top_probs, reverse=True)


def test_token_forward_counts():
    assert token_forwards(12, 28, use_cache=True) == 39
    assert token_forwards(12, 28, use_cache=False) == 12 * 28 + 28 * 27 // 2
    with pytest.raises(ValueError):
        token_forwards(0, 3, True)
