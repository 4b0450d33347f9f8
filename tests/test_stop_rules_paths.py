"""Stop rules that peer engines got wrong, on every decoding path (plain ``generate`` and
``generate_batch``, ``LLMEngine``, ``SpeculativeEngine`` with a draft model and with n-gram lookup,
``speculative_generate``):

* a stop string complete before ``min_tokens`` neither ends the request at ``min_tokens`` nor cuts
  its text later; a later occurrence still stops it (vLLM checks only the text added once
  ``min_tokens`` are out);
* a stop token id outside the vocabulary is refused when the request is added, and a request
  already running in the engine is not harmed.
"""

from __future__ import annotations

import pytest
from test_speculative import target_and_draft

from labsupport.engine import LLMEngine
from labsupport.generation import generate, generate_batch
from labsupport.sampling import GREEDY, SamplingParams
from labsupport.speculative import DraftModelProposer, NgramProposer, SpeculativeEngine, speculative_generate

N = 16


@pytest.fixture(scope="module")
def pair():
    return target_and_draft(1)


@pytest.fixture(scope="module")
def free(pair):
    target, _ = pair
    prompt = target.encode("The cat sat on")
    return prompt, generate(target, prompt, GREEDY, max_new_tokens=N).token_ids


def _paths(pair, prompt, params):
    """``{path: (token_ids, finish_reason, text)}`` of one greedy request on every path."""
    target, draft = pair
    out = {}
    r = generate(target, prompt, params)
    out["generate"] = (r.token_ids, r.finish_reason, r.text)
    r = generate_batch(target, [prompt, prompt[:2]], params)[0]
    out["generate_batch"] = (r.token_ids, r.finish_reason, r.text)
    for name, engine in (("engine", LLMEngine(target, block_size=4, num_blocks=64)),
                         ("spec-draft", SpeculativeEngine(target, DraftModelProposer(draft, target, 3),
                                                          block_size=4, num_blocks=64)),
                         ("spec-ngram", SpeculativeEngine(target, NgramProposer(4), block_size=4, num_blocks=64))):
        o = engine.generate([prompt, prompt[1:]], params)[0]
        out[name] = (o.token_ids, o.finish_reason, o.text)
    r = speculative_generate(target, DraftModelProposer(draft, target, 3), prompt, params)
    out["speculative_generate"] = (r.token_ids, r.finish_reason, r.text)
    return out


def _expected(decode, free: list[int], stop: str, min_tokens: int):
    """By counting occurrences (not the package's rule): the first token count k ≥ min_tokens whose
    text holds more occurrences of ``stop`` than the text before token ``min_tokens``; the text is
    cut where that new occurrence starts."""
    before = decode(free[:min_tokens - 1]).count(stop)
    for k in range(min_tokens, len(free) + 1):
        text = decode(free[:k])
        if text.count(stop) > before:
            at = -1
            for _ in range(before + 1):
                at = text.index(stop, at + 1)
            return free[:k], "stop", text[:at]
    return free, "length", decode(free)


def test_the_chosen_stop_strings_do_occur_before_min_tokens(pair, free):
    decode = pair[0].decode
    _, ids = free
    assert "oct" in decode(ids[:4]) and decode(ids).count("oct") == 1         # early only
    assert "es" in decode(ids[:4]) and decode(ids[4:]).count("es") >= 1        # early and again later


@pytest.mark.parametrize("stop,min_tokens", [("oct", 5), ("es", 5), ("es", 1), ("oct", 1)])
def test_a_stop_string_before_min_tokens_neither_stops_nor_cuts(pair, free, stop, min_tokens):
    prompt, ids = free
    want = _expected(pair[0].decode, ids, stop, min_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=N, stop=[stop], min_tokens=min_tokens)
    got = _paths(pair, prompt, params)
    for path, result in got.items():
        assert result == want, path
    if min_tokens == 5:                                                  # the early occurrence is ignored
        assert len(want[0]) > 5 and stop in pair[0].decode(ids[:4]) and want[2].startswith(pair[0].decode(ids[:4]))


@pytest.mark.parametrize("path", ["generate", "generate_batch", "engine", "spec-engine", "speculative_generate"])
def test_a_stop_token_id_outside_the_vocabulary_is_refused_when_added(pair, free, path):
    target, draft = pair
    prompt, ids = free
    v = target.model.config.vocab_size
    bad = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[5, v], min_tokens=2)
    match = rf"stop_token_ids must be token ids in \[0, {v}\), got \[{v}\]"
    if path in ("generate", "generate_batch", "speculative_generate"):
        call = {"generate": lambda: generate(target, prompt, bad),
                "generate_batch": lambda: generate_batch(target, [prompt, prompt], bad),
                "speculative_generate": lambda: speculative_generate(target, NgramProposer(3), prompt, bad)}[path]
        with pytest.raises(ValueError, match=match):
            call()
        return
    engine = LLMEngine(target, block_size=4, num_blocks=64) if path == "engine" else \
        SpeculativeEngine(target, DraftModelProposer(draft, target, 3), block_size=4, num_blocks=64)
    good = engine.add_request(prompt, GREEDY, N)
    engine.step()                                                        # running when the bad one comes
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, bad)
    assert list(engine.requests) == [good]
    done = engine.run()
    assert [o.request_id for o in done] == [good] and done[0].token_ids == ids
    engine.block_manager.audit()
