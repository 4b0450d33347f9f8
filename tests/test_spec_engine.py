"""Speculative decoding in the paged engine: greedy identical to the engine's plain greedy,
rejected slots freed, the pool whole at the end, sampling exact and seeded."""

from __future__ import annotations

import pytest
from test_speculative import target_and_draft

from labsupport.engine import LLMEngine
from labsupport.generation import generate
from labsupport.sampling import GREEDY, SamplingParams
from labsupport.speculative import DraftModelProposer, NgramProposer, SpeculativeEngine

PROMPTS = [[5, 17, 99, 3, 42, 8], [1, 1, 1], [7, 8, 9, 7, 8], [200, 13], [4] * 10, [33, 34, 35, 36, 37, 38, 39]]


@pytest.fixture(scope="module")
def pair():
    return target_and_draft(0)


@pytest.fixture(scope="module")
def plain(pair):
    target, _ = pair
    engine = LLMEngine(target, block_size=4, num_blocks=256, max_num_seqs=8)
    return [o.token_ids for o in engine.generate(PROMPTS, GREEDY, max_tokens=24)]


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_greedy_equals_engine_plain_greedy(pair, plain, gamma, proposer):
    target, draft = pair
    prop = DraftModelProposer(draft, target, gamma) if proposer == "draft" else NgramProposer(gamma)
    eng = SpeculativeEngine(target, prop, block_size=4, num_blocks=256, max_num_seqs=4)
    outs = eng.generate(PROMPTS, GREEDY, max_tokens=24)
    assert [o.token_ids for o in outs] == plain
    assert all(o.finish_reason == "length" and len(o.token_ids) == 24 for o in outs)
    # every slot of a rejected token was given back: the pools are whole at the end
    assert eng.block_manager.num_free_blocks == 256 and eng.block_manager.block_tables() == {}
    if proposer == "draft":
        assert eng.proposer.block_manager.num_free_blocks == 256
        assert any(r.num_accepted < len(r.draft_tokens) for o in outs for r in o.rounds)   # rejections happened
    assert eng.num_rounds < 6 * 24                                 # fewer target forwards than tokens


def test_plain_engine_equals_hf_greedy(pair, plain):
    target, _ = pair
    assert plain[0] == generate(target, PROMPTS[0], GREEDY, max_new_tokens=24, record=False).token_ids


def test_rejected_slots_are_freed_each_round(pair):
    """After each round the target cache holds exactly the committed tokens but the last."""
    target, draft = pair
    eng = SpeculativeEngine(target, DraftModelProposer(draft, target, 6), block_size=2, num_blocks=64, max_num_seqs=1)
    seen = []
    original = eng._round

    def checked(seqs):
        finished = original(seqs)
        for s in seqs:
            if not s.finish_reason:
                n = eng.block_manager.num_slots(s.request_id)
                seen.append((n, len(s.token_ids)))
                assert n == len(s.token_ids) - 1
                assert len(eng.block_manager.block_table(s.request_id)) == eng.block_manager.blocks_needed(n)
        return finished

    eng._round = checked
    out = eng.generate([PROMPTS[0]], GREEDY, max_tokens=30)[0]
    assert len(out.token_ids) == 30 and seen
    assert eng.block_manager.num_free_blocks == 64


def test_sampling_is_seeded_and_batch_independent(pair):
    target, draft = pair
    params = SamplingParams(temperature=0.9, seed=11)
    a = SpeculativeEngine(target, DraftModelProposer(draft, target, 3), block_size=4, num_blocks=128).generate(
        PROMPTS[:3], params, 16)
    b = SpeculativeEngine(target, DraftModelProposer(draft, target, 3), block_size=4, num_blocks=128,
                          max_num_seqs=1).generate(PROMPTS[:3], params, 16)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(len(o.token_ids) == 16 for o in a)


def test_admission_waits_for_blocks_and_rejects_what_never_fits(pair):
    target, draft = pair
    eng = SpeculativeEngine(target, DraftModelProposer(draft, target, 4), block_size=4, num_blocks=12, max_num_seqs=8)
    outs = eng.generate([PROMPTS[0], PROMPTS[1], [3] * 60], GREEDY, max_tokens=20)
    assert [o.finish_reason for o in outs] == ["length", "length", "error"]
    assert "blocks" in outs[2].error
    assert eng.peak_blocks <= 12 and eng.block_manager.num_free_blocks == 12


def test_no_proposer_is_plain_decoding(pair, plain):
    target, _ = pair
    eng = SpeculativeEngine(target, None, block_size=4, num_blocks=256)
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY, 24)] == plain
    assert eng.num_rounds == 24


def test_bad_arguments(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        DraftModelProposer(draft, target, -1)
    with pytest.raises(ValueError, match="max_num_seqs"):
        SpeculativeEngine(target, None, max_num_seqs=0)
    with pytest.raises(ValueError, match="prompt"):
        SpeculativeEngine(target, NgramProposer()).generate([[]], GREEDY, 4)
    with pytest.raises(TypeError, match="proposer"):
        SpeculativeEngine(target, "ngram")
    with pytest.raises(ValueError, match="unknown speculative_config keys"):
        SpeculativeEngine(target, {"method": "ngram", "gamma": 4})
    with pytest.raises(ValueError, match="method"):
        SpeculativeEngine(target, {"method": "eagle3"})
    for flag in ("enable_prefix_caching", "enable_chunked_prefill"):
        with pytest.raises(ValueError, match=flag):
            SpeculativeEngine(target, None, **{flag: True})


def test_compare_with_engine_reports_identical_output(pair):
    from labsupport.bench.speculative import compare_with_engine

    target, draft = pair
    row = compare_with_engine(target, draft, PROMPTS[0], 2, gamma=3, max_new_tokens=10, block_size=4, repeats=1)
    assert row.identical and row.pool_whole and row.batch == 2
    assert row.plain_tokens_per_s > 0 and row.spec_tokens_per_s > 0 and row.tokens_per_round >= 1


def test_prefill_seconds_count_the_prompts_prefill_and_nothing_else(pair, monkeypatch):
    """A clock that only the prompt's ``extend`` (1 s per prefill call, 0.001 s per round's forward) and
    the proposer's start (0.25 s) advance: ``prefill_seconds`` is the prefills and the starts,
    ``target_seconds`` the rounds."""
    import types

    import labsupport.speculative.engine as spec_engine

    target, _ = pair
    clock = {"t": 0.0}
    real_extend = spec_engine.extend

    def ticking_extend(runner, bm, feeds, **kw):
        clock["t"] += 1.0 if "tree_parents" not in kw else 0.001   # the prefill has no tree argument
        return real_extend(runner, bm, feeds, **kw)

    monkeypatch.setattr(spec_engine, "extend", ticking_extend)
    monkeypatch.setattr(spec_engine, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))   # this module's only
    proposer = NgramProposer(3)
    real_start = proposer.start

    def slow_start(engine, seqs):                              # a proposer's own prompt work (0.25 s)
        clock["t"] += 0.25
        return real_start(engine, seqs)

    proposer.start = slow_start
    eng = SpeculativeEngine(target, proposer, block_size=4, num_blocks=256, max_num_seqs=2)
    eng.generate(PROMPTS[:4], GREEDY, max_tokens=8)         # two at a time: two admissions of two prompts
    assert eng.prefill_seconds == pytest.approx(2 * (1.0 + 0.25))
    assert eng.target_seconds == pytest.approx(0.001 * eng.num_rounds)
    assert eng.draft_seconds == 0.0
