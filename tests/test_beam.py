"""labsupport.beam: length normalisation, width 1 = greedy, the tree it records, and equality with Hugging Face beam search."""

import pytest
import torch

from labsupport.beam import beam_search, best_hypothesis, length_normalised_score, sequence_logprob
from labsupport.generation import generate
from labsupport.sampling import GREEDY

PROMPT = "Return the number of items in the list"


# ----------------------------------------------------------------------------- length normalisation

@pytest.mark.parametrize("alpha, winner, scores", [
    (0.0, 0, (-2.0, -3.0)),
    (1.0, 1, (-1.0, -0.75)),
    (2.0, 1, (-0.5, -0.1875)),
])
def test_length_penalty_picks_the_winner(alpha, winner, scores):
    a, b = (-2.0, 2), (-3.0, 4)           # (Σ log p, new tokens)
    assert length_normalised_score(*a, alpha) == pytest.approx(scores[0])
    assert length_normalised_score(*b, alpha) == pytest.approx(scores[1])
    assert best_hypothesis([a, b], alpha) == winner


def test_negative_alpha_favours_short():
    assert best_hypothesis([(-2.0, 2), (-3.0, 4)], -1.0) == 0


# ----------------------------------------------------------------------------- width 1 is greedy

def test_width_one_is_greedy(tiny_lm):
    greedy = generate(tiny_lm, PROMPT, GREEDY, max_new_tokens=24)
    for alpha in (0.0, 1.0):
        beam = beam_search(tiny_lm, PROMPT, 1, max_new_tokens=24, length_penalty=alpha)
        assert beam.best.token_ids == greedy.token_ids
        assert beam.best.logprob == pytest.approx(greedy.logprob, abs=1e-4)


def test_width_one_stops_at_eos_like_greedy(tiny_lm):
    """Make a token greedy produces early the EOS: both must stop right there."""
    first = generate(tiny_lm, PROMPT, GREEDY, max_new_tokens=24).token_ids
    eos = first[2]
    stop_at = first.index(eos) + 1
    beam = beam_search(tiny_lm, PROMPT, 1, max_new_tokens=24, length_penalty=0.0, eos_token_id=eos)
    assert beam.best.token_ids == first[:stop_at]
    assert beam.best.finish_reason == "stop"


# ----------------------------------------------------------------------------- equality with transformers

def _hf(lm, prompt_ids, B, alpha, early_stopping, n, eos):
    return lm.model.generate(torch.tensor([prompt_ids]), num_beams=B, num_return_sequences=B, do_sample=False,
                             length_penalty=alpha, early_stopping=early_stopping, max_new_tokens=n,
                             eos_token_id=eos, pad_token_id=lm.tokenizer.pad_token_id,
                             return_dict_in_generate=True, output_scores=True)


def _eos_choices(lm, prompt_ids):
    """The model's EOS plus tokens the searches really pick, used as EOS so that hypotheses finish early."""
    greedy = generate(lm, prompt_ids, GREEDY, max_new_tokens=8).token_ids
    wide = beam_search(lm, prompt_ids, 4, max_new_tokens=8, ignore_eos=True).best.token_ids
    return [lm.eos_token_id, greedy[1], wide[2]]


@pytest.mark.slow
@pytest.mark.parametrize("B", [1, 2, 4])
def test_equal_to_transformers_beam_search(tiny_lm, B):
    prompt_ids = tiny_lm.encode(PROMPT)
    P, n = len(prompt_ids), 8
    # HF runs plain greedy search for num_beams=1: α and early_stopping do not apply there.
    grid = [(1.0, False)] if B == 1 else [(a, e) for a in (0.0, 1.0, 2.0) for e in (False, True, "never")]
    finished_by_eos = 0
    for eos in _eos_choices(tiny_lm, prompt_ids):
        for alpha, early in grid:
            ours = beam_search(tiny_lm, prompt_ids, B, max_new_tokens=n, length_penalty=alpha,
                               early_stopping=early, eos_token_id=eos, num_return_sequences=B)
            hf = _hf(tiny_lm, prompt_ids, B, alpha, early, n, eos)
            fill = {tiny_lm.tokenizer.pad_token_id, eos}      # HF pads finished rows
            assert len(ours.hypotheses) == B
            for i, hyp in enumerate(ours.hypotheses):
                row = hf.sequences[i].tolist()
                assert row[:P] == prompt_ids
                assert row[P:P + hyp.length] == hyp.token_ids, (eos, alpha, early, i)
                assert set(row[P + hyp.length:]) <= fill
                if B > 1:   # HF reports no beam score for greedy search
                    assert hf.sequences_scores[i].item() == pytest.approx(hyp.score, abs=1e-4)
                finished_by_eos += hyp.finish_reason == "stop"
    assert finished_by_eos > 0       # the EOS paths were really exercised


# ----------------------------------------------------------------------------- the tree

def test_tree_is_consistent(tiny_lm):
    B, n = 3, 6
    res = beam_search(tiny_lm, PROMPT, B, max_new_tokens=n, length_penalty=1.0, ignore_eos=True,
                      num_return_sequences=3)
    nodes = res.nodes
    assert nodes[0].status == "root" and nodes[0].parent_id is None
    for node in nodes[1:]:
        parent = nodes[node.parent_id]
        assert node.depth == parent.depth + 1
        assert node.cum_logprob == pytest.approx(parent.cum_logprob + node.logprob, abs=1e-4)
        assert parent.status in ("root", "kept")          # only live beams are expanded
        assert node.status in ("kept", "pruned", "finished")
    for depth in range(1, n + 1):
        level = [x for x in nodes if x.depth == depth]
        parents = {x.parent_id for x in level}
        assert len(level) == len(parents) * 2 * B          # each live beam's 2B best tokens
        if depth < n:
            assert sum(x.status == "kept" for x in level) == B
    assert [h.score for h in res.hypotheses] == sorted((h.score for h in res.hypotheses), reverse=True)
    for hyp in res.hypotheses:
        path = res.path(hyp.node_id)
        assert [nodes[i].token_id for i in path[1:]] == hyp.token_ids
        assert nodes[hyp.node_id].status == "finished" and hyp.finish_reason == "length"
        assert hyp.length == n
        assert hyp.score == pytest.approx(hyp.logprob / n)
        assert sequence_logprob(tiny_lm, PROMPT, hyp.token_ids) == pytest.approx(hyp.logprob, abs=1e-4)
    kept_scores = sorted((x.cum_logprob for x in nodes if x.depth == 1 and x.status == "kept"), reverse=True)
    assert kept_scores == sorted((x.cum_logprob for x in nodes if x.depth == 1), reverse=True)[:B]
    assert res.model_calls == n


def test_finished_beam_stops_growing_and_keeps_competing(tiny_lm):
    prompt_ids = tiny_lm.encode(PROMPT)
    eos = _eos_choices(tiny_lm, prompt_ids)[2]          # the widest search's 3rd token: finishes early
    for alpha in (0.0, 1.0):
        res = beam_search(tiny_lm, prompt_ids, 4, max_new_tokens=10, length_penalty=alpha, early_stopping="never",
                          eos_token_id=eos, num_return_sequences=4)
        ended = [x for x in res.nodes if x.finish_reason is not None]
        assert any(x.finish_reason == "stop" for x in ended)
        ended_ids = {x.node_id for x in ended}
        assert not any(x.parent_id in ended_ids for x in res.nodes)            # never extended
        in_list = {h.node_id for h in res.hypotheses}
        for x in ended:                                  # finished = still in the list; pushed out = pruned
            assert x.status == ("finished" if x.node_id in in_list else "pruned")
        if alpha == 0.0:    # raw sums: a short EOS hypothesis beats the long ones
            assert res.best.finish_reason == "stop" and res.best.length < 10
        else:               # α = 1 lets the longer hypotheses win
            assert res.best.length == 10


def test_cost_is_width_times_greedy(tiny_lm):
    res = beam_search(tiny_lm, PROMPT, 4, max_new_tokens=5, ignore_eos=True)
    P = len(tiny_lm.encode(PROMPT))
    assert res.token_forwards == P + sum(4 * (P + t) for t in range(1, 5))


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs, word", [
    ({"beam_width": 0}, "beam_width"),
    ({"beam_width": 2, "num_return_sequences": 3}, "num_return_sequences"),
    ({"beam_width": 2, "early_stopping": "sometimes"}, "early_stopping"),
    ({"beam_width": 2, "length_penalty": float("nan")}, "length_penalty"),
    ({"beam_width": 2, "max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_arguments(tiny_lm, kwargs, word):
    with pytest.raises(ValueError, match=word):
        beam_search(tiny_lm, PROMPT, **kwargs)


def test_context_window_policy(tiny_lm):
    """A prompt that fills the window is an error; one that fits runs until the window is full."""
    with pytest.raises(ValueError, match="n_positions"):
        beam_search(tiny_lm, [7] * 64, 2, max_new_tokens=1)
    res = beam_search(tiny_lm, [7] * 60, 2, max_new_tokens=500, ignore_eos=True, num_return_sequences=2)
    assert all(h.length == 4 and h.finish_reason == "length" for h in res.hypotheses)
    with pytest.raises(ValueError, match="token_ids"):
        sequence_logprob(tiny_lm, [7, 8], [4096])


def test_bad_scores():
    with pytest.raises(ValueError, match="length"):
        length_normalised_score(-1.0, 0, 1.0)
    with pytest.raises(ValueError, match="candidates"):
        best_hypothesis([], 1.0)


# ---------------------------------------------------------------------------- beam search on the paged engine
@pytest.mark.parametrize("beam_width", [1, 2, 4])
def test_paged_beam_search_equals_plain_beam_search(tiny_lm, beam_width):
    from labsupport.engine.beam_search import paged_beam_search

    prompts = [[5, 9, 2, 7, 1], [3] * 11, [42, 17]]
    paged = paged_beam_search(tiny_lm, prompts, beam_width, max_new_tokens=10, block_size=4,
                              num_return_sequences=beam_width)
    for prompt, res in zip(prompts, paged.results):
        ref = beam_search(tiny_lm, prompt, beam_width, max_new_tokens=10, num_return_sequences=beam_width)
        assert [h.token_ids for h in res.hypotheses] == [h.token_ids for h in ref.hypotheses]
        for h, r in zip(res.hypotheses, ref.hypotheses):
            assert h.score == pytest.approx(r.score, abs=1e-4)
        assert res.steps == ref.steps


def test_paged_beams_share_the_prompt_blocks(tiny_lm):
    from labsupport.engine.beam_search import paged_beam_search

    prompt = list(range(1, 17))                                        # 16 tokens: 4 full blocks of 4
    out = paged_beam_search(tiny_lm, [prompt], 4, max_new_tokens=6, block_size=4, ignore_eos=True)
    first = out.sharing[0]                                             # 4 beams after one step
    assert len(first.block_tables) == 4
    prompt_blocks = [t[:4] for t in first.block_tables.values()]
    assert all(b == prompt_blocks[0] for b in prompt_blocks)            # one physical copy of the prompt
    assert first.private_blocks == 4 * 5 and first.used_blocks == 4 + 4   # 4 shared + one private tail each
    assert first.saved_fraction == pytest.approx(1 - 8 / 20)


def test_stop_token_ids_and_every_eos_id_end_a_hypothesis(tiny_lm):
    free = beam_search(tiny_lm, [5, 9, 2, 7, 1], 1, max_new_tokens=12, ignore_eos=True).best.token_ids
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    stopped = beam_search(tiny_lm, [5, 9, 2, 7, 1], 1, max_new_tokens=12, ignore_eos=True,
                          stop_token_ids=[free[k]]).best
    assert stopped.token_ids == free[:k + 1] and stopped.finish_reason == "stop"
    assert stopped.text == tiny_lm.decode(free[:k])
    tiny_lm.model.generation_config.eos_token_id = [tiny_lm.eos_token_id, free[k]]
    try:
        assert beam_search(tiny_lm, [5, 9, 2, 7, 1], 1, max_new_tokens=12).best.token_ids == free[:k + 1]
    finally:
        tiny_lm.model.generation_config.eos_token_id = tiny_lm.eos_token_id


def test_paged_beam_search_keeps_the_context_window_rule(tiny_lm):
    from labsupport.engine.beam_search import paged_beam_search

    res = paged_beam_search(tiny_lm, [[7] * 60], 2, max_new_tokens=500, ignore_eos=True, block_size=4)
    ref = beam_search(tiny_lm, [7] * 60, 2, max_new_tokens=500, ignore_eos=True)
    assert [h.token_ids for h in res.results[0].hypotheses] == [h.token_ids for h in ref.hypotheses]
    assert res.results[0].best.length == 4
    with pytest.raises(ValueError, match="n_positions"):
        paged_beam_search(tiny_lm, [[7] * 64], 2, max_new_tokens=1)
