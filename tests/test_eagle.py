"""EAGLE, the head that drafts the target's next feature: greedy speculation with it is exact and reads
the prompt's features, its files save and load, a training smoke run, and its incremental forward equals the
training forward."""

from __future__ import annotations

import pytest
import torch
from test_speculative_variants import random_heads

from labsupport.generation import generate
from labsupport.sampling import SamplingParams
from labsupport.speculative import EagleHead, EagleProposer, SpeculativeEngine

GREEDY12 = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)


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
