"""An engine never goes on with a request half-updated: a proposer that cannot draft for the target
is refused when the engine is built, and an exception inside ``step()`` ends the requests that step
touched with ``finish_reason="error"`` (blocks freed) while later requests run as usual."""

from __future__ import annotations

import pytest
from helpers import make_tiny_lm, pool_is_whole
from test_speculative import target_and_draft

from labsupport.engine import LLMEngine
from labsupport.sampling import GREEDY
from labsupport.speculative import (
    DraftModelProposer,
    EagleHead,
    EagleProposer,
    MedusaHeads,
    MedusaProposer,
    NgramProposer,
    SpeculativeEngine,
    speculative_generate,
)

PROMPT = [5, 9, 2, 7, 1, 5, 9]


@pytest.fixture(scope="module")
def pair():
    return target_and_draft(1)


def test_a_draft_with_another_vocabulary_is_refused_when_the_engine_is_built(pair):
    target, _ = pair
    v = target.model.config.vocab_size
    other = make_tiny_lm(seed=2, vocab_size=v + 7)
    proposer = DraftModelProposer(other, None, 3)                     # no target given: not checked yet
    match = rf"draft and target must share a vocabulary: target vocab_size {v}, draft {v + 7}"
    with pytest.raises(ValueError, match=match):
        SpeculativeEngine(target, proposer, block_size=4, num_blocks=64)
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, proposer, PROMPT, GREEDY)
    with pytest.raises(ValueError, match=match):
        DraftModelProposer(other, target, 3)


def test_heads_for_another_width_are_refused_when_the_engine_is_built(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="the EAGLE head has n_embd 32, the target 64"):
        SpeculativeEngine(target, EagleProposer(EagleHead(32, 2), 2))
    with pytest.raises(ValueError, match="heads have n_embd 32, the target 64"):
        SpeculativeEngine(target, MedusaProposer(MedusaHeads(32, 3)))


class _FailsOnce(NgramProposer):
    """n-gram lookup whose first proposal raises (a bug in a proposer, a draft that went wrong)."""

    def __init__(self):
        super().__init__(3)
        self.calls = 0

    def propose(self, engine, seqs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("draft failed")
        return super().propose(engine, seqs)


def test_a_failing_speculative_step_ends_its_requests_and_the_engine_goes_on(pair):
    target, _ = pair
    expected = LLMEngine(target, block_size=4, num_blocks=64).generate([PROMPT], GREEDY, 8)[0].token_ids
    eng = SpeculativeEngine(target, _FailsOnce(), block_size=4, num_blocks=64)
    first = eng.add_request(PROMPT, GREEDY, 8)
    with pytest.raises(RuntimeError, match="draft failed"):
        eng.step()
    out = eng.output(first)
    assert out.finish_reason == "error" and "the engine step failed: RuntimeError: draft failed" in out.error
    assert eng.block_manager.num_used_blocks == 0 and not eng._reserved
    later = eng.add_request(PROMPT, GREEDY, 8)
    done = eng.run()
    assert [o.request_id for o in done] == [first, later]             # the failed one is reported once, first
    assert done[1].token_ids == expected and done[1].finish_reason == "length"
    pool_is_whole(eng)


def test_a_failing_engine_step_ends_the_scheduled_requests_and_the_engine_goes_on(pair):
    target, _ = pair
    expected = LLMEngine(target, block_size=4, num_blocks=64).generate([PROMPT, PROMPT[:3]], GREEDY, 6)
    eng = LLMEngine(target, block_size=4, num_blocks=64, max_num_seqs=1)
    a = eng.add_request(PROMPT, GREEDY, 6)
    b = eng.add_request(PROMPT[:3], GREEDY, 6)                        # waits: max_num_seqs=1
    eng.step()
    real = eng.runner.forward

    def broken(*args, **kwargs):
        eng.runner.forward = real
        raise RuntimeError("kernel failed")

    eng.runner.forward = broken
    with pytest.raises(RuntimeError, match="kernel failed"):
        eng.step()
    assert eng.output(a).finish_reason == "error" and "kernel failed" in eng.output(a).error
    assert eng.output(a).token_ids == expected[0].token_ids[:1]       # what it had before the failure
    done = eng.run()
    assert [o.request_id for o in done] == [a, b]
    assert done[1].token_ids == expected[1].token_ids
    pool_is_whole(eng)
