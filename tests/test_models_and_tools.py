"""Model loading, the environment check and the training script's smoke run."""

from __future__ import annotations

import json

import pytest
import torch

from labsupport.models import SHIPPED, load_model, pick_device, resolve_path

SHIPPED_PRESENT = all((p / "model.safetensors").exists() for p in SHIPPED.values())


def test_pick_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            pick_device("cuda")


def test_unknown_model_offline_names_the_shipped_models(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="tiny-gpt2"):
        load_model(str(tmp_path / "no-such-model"))


@pytest.mark.skipif(not SHIPPED_PRESENT, reason="shipped models not built yet")
def test_shipped_models_load_offline_and_share_a_tokenizer(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = load_model("tiny-gpt2", device="cpu")
    draft = load_model("tiny-gpt2-draft", device="cpu")
    assert target.model.config.vocab_size == draft.model.config.vocab_size == len(target.tokenizer)
    assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    assert target.device.type == "cpu" and target.dtype == torch.float32
    model, _tokenizer, dev = target   # unpacks like a tuple
    assert model is target.model and dev == target.device
    n_target = sum(p.numel() for p in target.model.parameters())
    n_draft = sum(p.numel() for p in draft.model.parameters())
    assert n_draft < n_target
    size = sum(f.stat().st_size for p in SHIPPED.values() for f in p.iterdir())
    assert size <= 40 * 2 ** 20
    text = "Return the number of items"
    assert target.decode(target.encode(text)) == text
    stats = json.loads((SHIPPED["tiny-gpt2"].parent / "train_stats.json").read_text())
    assert stats["greedy_agreement"] >= 0.5


def test_resolve_path_passes_hub_ids_through():
    assert resolve_path("gpt2") == "gpt2"
    assert resolve_path("tiny-gpt2").endswith("tiny-gpt2")


@pytest.mark.slow
def test_training_smoke_run(tmp_path):
    """CI runs only a few training steps (the full run takes about half an hour)."""
    from labsupport import train

    assert train.main(["--smoke", "--out", str(tmp_path), "--threads", "1"]) == 0
    stats = json.loads((tmp_path / "train_stats.json").read_text())
    assert set(stats["models"]) == {"tiny-gpt2", "tiny-gpt2-draft"}
    lm = load_model(str(tmp_path / "tiny-gpt2"), device="cpu")
    assert lm.model.config.n_layer == 4 and (tmp_path / "tiny-gpt2" / "model.safetensors").exists()


def test_corpus_cleaning_reflows_and_drops_symbol_runs():
    from labsupport.corpus import _clean, _comment_blocks

    assert _clean("  First line of\n    a paragraph here.\n\n  =========\n") == "First line of a paragraph here."
    assert _clean("----------------") is None
    assert _comment_blocks("x = 1\n# one\n# two\ny = 2\n# lone\n") == ["one\ntwo"]


@pytest.mark.slow
def test_check_command_runs():
    from labsupport import check

    assert check.main(["--no-model"]) in (0, 1)


@pytest.mark.parametrize("device", ["foo", "gpu0", 3.5])
def test_pick_device_bad_name_is_a_value_error(device):
    with pytest.raises(ValueError, match="device"):
        pick_device(device)


def test_show_source_shows_the_running_code_or_a_named_part_of_it():
    """Chapters show real code; ``start``/``stop`` cut out the lines a chapter talks about (chapter 07 shows the
    layer loop whose ``self.layers[:num_layers]`` slice is the self-speculative early exit)."""
    import inspect

    from labsupport.engine import ModelRunner
    from labsupport.lab import show_source

    whole = show_source(ModelRunner._blocks).data
    assert whole == inspect.getsource(ModelRunner._blocks)
    part = show_source(ModelRunner._blocks, start="for i, layer in enumerate(self.layers[:num_layers])",
                       stop="return x").data
    assert part.startswith("for i, layer in enumerate(self.layers[:num_layers]):") and part.rstrip().endswith("return x")
    assert part in whole.replace("\n        ", "\n") and "def _blocks" not in part     # dedented, the def left out
    with pytest.raises(ValueError, match="start='no such line'"):
        show_source(ModelRunner._blocks, start="no such line")
    with pytest.raises(ValueError, match="stop="):
        show_source(ModelRunner._blocks, start="return x", stop="for i, layer")        # stop must come after start
