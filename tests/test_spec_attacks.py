"""What a session attacking the speculative API found, each a test: tree drafts near the context
window, one draft-model proposer serving two engines at once, the Linear helper's inputs, Medusa's
tree choices and dtypes, speculative_config's Medusa defaults, argument types, the git filter's
bad input — and EAGLE, the head drafting the target's next feature."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import make_tiny_lm
from test_speculative_variants import random_heads

from labsupport.generation import generate
from labsupport.sampling import SamplingParams
from labsupport.speculative import (
    DraftModelProposer,
    EagleHead,
    EagleProposer,
    LookaheadProposer,
    MedusaHeads,
    MedusaProposer,
    NgramProposer,
    SpeculativeEngine,
    speculative_generate,
)

GREEDY12 = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)


@pytest.mark.parametrize("make", [lambda lm: MedusaProposer(random_heads(lm.model.config.n_embd), widths=(3, 2)),
                                  lambda lm: LookaheadProposer(window=4, ngram=3, max_candidates=3),
                                  lambda lm: MedusaProposer(random_heads(lm.model.config.n_embd), widths=(40,))],
                         ids=["medusa tree", "lookahead", "a very wide tree"])
def test_tree_drafts_shrink_near_the_end_of_the_context_window(tiny_lm, make):
    """Every tree node takes a KV slot while it is verified: near n_positions the tree must shrink
    (it crashed with 'positions must be < n_positions' and left the engine wedged)."""
    limit = tiny_lm.model.config.n_positions
    for prompt_len in (limit - 14, limit - 6, limit - 2):
        prompt = [(7 * i) % 50 + 10 for i in range(prompt_len)]
        want = generate(tiny_lm, prompt, GREEDY12, record=False)
        engine = SpeculativeEngine(tiny_lm, make(tiny_lm), block_size=4, num_blocks=256)
        out = engine.generate([prompt], GREEDY12)[0]
        assert (out.token_ids, out.finish_reason) == (want.token_ids, want.finish_reason)
        assert engine.block_manager.num_used_blocks == 0


def test_one_draft_proposer_serves_two_engines_at_once(tiny_lm):
    draft = make_tiny_lm(seed=1)
    prop = DraftModelProposer(draft, tiny_lm, 3)
    a, b = SpeculativeEngine(tiny_lm, prop, block_size=4), SpeculativeEngine(tiny_lm, prop, block_size=4)
    a.add_request([5, 6], GREEDY12)
    b.add_request([9, 8, 7, 6, 5, 4, 3, 2], GREEDY12)
    a.step(); b.step(); a.step()                                        # interleaved: one cache each
    (oa,), (ob,) = a.run(), b.run()
    assert oa.token_ids == generate(tiny_lm, [5, 6], GREEDY12, record=False).token_ids
    assert ob.token_ids == generate(tiny_lm, [9, 8, 7, 6, 5, 4, 3, 2], GREEDY12, record=False).token_ids
    assert [c[1].num_used_blocks for c in prop._caches.values()] == [0, 0]


def test_linear_takes_a_strided_bias_and_refuses_bad_shapes():
    from labsupport.engine.linear import Linear

    w, x = torch.randn(16, 8), torch.randn(6, 16)
    bias = torch.randn(16)[::2]                                           # not contiguous
    torch.testing.assert_close(Linear(w, bias)(x), x @ w + bias, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        Linear(w, torch.randn(1))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        Linear(torch.randn(8))
    with pytest.raises(TypeError, match="weight must be a tensor, got list"):
        Linear([[1.0]])


def test_medusa_choices_widths_and_dtype_are_checked(tiny_lm):
    heads = random_heads(tiny_lm.model.config.n_embd)
    for bad in ([(-1,)], [(0.0,)], ["ab"], [0, 1]):
        with pytest.raises(TypeError, match="choices"):
            MedusaProposer(heads, choices=bad)
    with pytest.raises(TypeError, match="widths"):
        MedusaProposer(heads, widths=3)
    assert MedusaProposer(heads, widths=torch.tensor([2, 1]).numpy()).num_speculative_tokens == 2
    with pytest.raises(ValueError, match="vocabulary"):
        SpeculativeEngine(tiny_lm, MedusaProposer(heads, widths=(5000,)), block_size=4, num_blocks=2000).generate(
            [[1, 2, 3]], GREEDY12)
    double = MedusaHeads(tiny_lm.model.config.n_embd, 3).double()
    with pytest.raises(ValueError, match="dtype and device"):
        SpeculativeEngine(tiny_lm, MedusaProposer(double, widths=(1,))).generate([[1, 2, 3]], GREEDY12)


def test_speculative_config_medusa_defaults_and_types(tiny_lm):
    heads = random_heads(tiny_lm.model.config.n_embd)
    with pytest.raises(ValueError, match="num_speculative_tokens=4 exceeds the 3 Medusa heads"):
        SpeculativeEngine(tiny_lm, {"method": "medusa", "heads": heads})
    assert SpeculativeEngine(tiny_lm, {"method": "medusa", "heads": heads, "num_speculative_tokens": 3}).proposer
    with pytest.raises(TypeError, match="tree_widths"):
        SpeculativeEngine(tiny_lm, {"method": "medusa", "heads": heads, "num_speculative_tokens": 1, "tree_widths": 3})


def test_targets_of_the_wrong_type_are_type_errors(tiny_lm):
    with pytest.raises(TypeError, match="target must be"):
        DraftModelProposer(tiny_lm, "tiny-gpt2", 2)
    with pytest.raises(TypeError, match="target must be"):
        speculative_generate("tiny-gpt2", NgramProposer(3), "hi")


@pytest.mark.parametrize("stdin", [b"", b"[1, 2, 3]", b"{not json", b"\xff\xfe"])
def test_the_git_filter_says_no_notebook_in_one_line(stdin):
    done = subprocess.run([sys.executable, "-m", "labsupport.nbfilter"], input=stdin, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().count("\n") == 1 and "no valid notebook on stdin" in done.stderr.decode()


# ---------------------------------------------------------------------------- EAGLE
def random_eagle(lm, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(lm.model.config.n_embd, lm.model.config.n_head).eval()


def test_eagle_greedy_is_exact_and_reads_the_prompt_features(tiny_lm):
    prompts = [[5, 17, 99, 3, 42, 8], [4], [7, 8, 9, 7, 8, 7, 8]]
    engine = SpeculativeEngine(tiny_lm, EagleProposer(random_eagle(tiny_lm), 3), block_size=4)
    outs = engine.generate(prompts, GREEDY12)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == generate(tiny_lm, prompt, GREEDY12, record=False).token_ids
    assert sum(o.spec_stats.proposed for o in outs) > 0 and engine.block_manager.num_used_blocks == 0
    assert engine.spec["0"].state["eagle_kv"][0].shape[0] >= len(prompts[0]) - 1   # the head's cache of pairs
    with pytest.raises(ValueError, match="n_embd"):
        SpeculativeEngine(tiny_lm, EagleProposer(EagleHead(32, 2), 2)).generate([[1, 2, 3]], GREEDY12)
    with pytest.raises(TypeError, match="EagleHead"):
        EagleProposer(random_heads(64))


def test_eagle_head_save_load_and_accuracy(tiny_lm, tmp_path):
    from labsupport.speculative.eagle import eagle_accuracy, load_eagle

    head = random_eagle(tiny_lm)
    head.save(tmp_path / "e", {"steps": 0})
    back = load_eagle(tmp_path / "e")
    assert back.stats == {"steps": 0} and back.num_parameters == head.num_parameters
    ids = torch.arange(300) % 90 + 5
    acc = eagle_accuracy(tiny_lm, back, ids, seq_len=32, max_windows=4)
    assert 0.0 <= acc <= 1.0
    with pytest.raises(FileNotFoundError, match="train eagle"):
        load_eagle(tmp_path / "missing")


@pytest.mark.slow
def test_eagle_training_smoke_run(tmp_path):
    from labsupport import train
    from labsupport.speculative.eagle import load_eagle

    assert train.main(["eagle", "--smoke", "--out", str(tmp_path / "eagle"), "--threads", "1"]) == 0
    head = load_eagle(tmp_path / "eagle")
    assert head.stats["steps"] == 3 and 0 <= head.stats["val_target_agreement"] <= 1


def test_eagle_incremental_extend_equals_the_training_forward(tiny_lm):
    head = random_eagle(tiny_lm)
    gen = torch.Generator().manual_seed(0)
    e = tiny_lm.model.config.n_embd
    feats, embs = torch.randn(9, e, generator=gen), torch.randn(9, e, generator=gen)
    with torch.no_grad():
        whole = head(feats[None], embs[None])[0]
        a, past = head.extend(feats[:5], embs[:5])
        b, past = head.extend(feats[5:8], embs[5:8], past)
        c, past = head.extend(feats[8:], embs[8:], past)
    torch.testing.assert_close(torch.cat([a, b, c]), whole, atol=1e-5, rtol=1e-5)
    assert past[0].shape == (9, tiny_lm.model.config.n_head, e // tiny_lm.model.config.n_head)
