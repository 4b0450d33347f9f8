"""labsupport.vllm_bridge without vLLM: the driving loop equals the engine's own run, divergences
are found with their logit gap, the worker's JSON-lines protocol answers errors and exits, and a
missing vLLM venv gives the message that says how to create it. (With ``.venv-vllm`` present,
``python -m labsupport.bench vllm`` runs the real comparison.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import prompts_for

from labsupport import vllm_bridge
from labsupport.engine import LLMEngine
from labsupport.sampling import GREEDY


@pytest.mark.parametrize("window", [1, 2, 5])
def test_drive_equals_engine_generate_for_any_window(tiny_lm, window):
    prompts = prompts_for(tiny_lm, [3, 7, 12, 5, 9], seed=1)
    lengths = [6, 2, 9, 4, 7]
    reqs = vllm_bridge.requests_for(prompts, lengths)
    run = vllm_bridge.drive(LLMEngine(tiny_lm, block_size=4, num_blocks=64), reqs, window)
    fixed = GREEDY.replace(ignore_eos=True)
    for p, n, out in zip(prompts, lengths, run["outputs"]):
        ref = LLMEngine(tiny_lm, block_size=4, num_blocks=64).generate([p], fixed, max_tokens=n)[0]
        assert out["token_ids"] == ref.token_ids and out["finish_reason"] == "length"
        assert len(out["token_times"]) == n and out["token_times"] == sorted(out["token_times"])
    assert run["steps"] >= max(lengths)
    if window == 1:                                          # one at a time: every token is its own step
        assert run["steps"] == sum(lengths)
    lat = vllm_bridge.latency(run["outputs"])
    assert 0 < lat["ttft"] and 0 <= lat["tpot"]


def test_first_divergence_reports_position_and_gap(tiny_lm):
    (p,) = prompts_for(tiny_lm, [6], seed=2)
    req = vllm_bridge.requests_for([p], 5)
    ours = vllm_bridge.drive(LLMEngine(tiny_lm, block_size=4, num_blocks=16), req)["outputs"]
    assert vllm_bridge.first_divergence(tiny_lm, req, ours, ours) == []
    theirs = [dict(ours[0], token_ids=list(ours[0]["token_ids"]))]
    runner_up_at = 3
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([p + ours[0]["token_ids"][:runner_up_at]])).logits[0, -1]
    second = int(logits.topk(2).indices[1])
    theirs[0]["token_ids"][runner_up_at] = second
    (d,) = vllm_bridge.first_divergence(tiny_lm, req, ours, theirs)
    assert d["position"] == runner_up_at and d["ours"] == ours[0]["token_ids"][runner_up_at] and d["theirs"] == second
    assert d["gap"] == pytest.approx(float(logits[d["ours"]] - logits[second]), abs=1e-5) and d["gap"] >= 0
    shorter = [dict(ours[0], token_ids=ours[0]["token_ids"][:2])]
    (e,) = vllm_bridge.first_divergence(tiny_lm, req, ours, shorter)
    assert e["position"] == 2 and e["gap"] is None


def test_missing_venv_says_how_to_create_it(monkeypatch):
    monkeypatch.setenv("LABSUPPORT_VLLM_PYTHON", "/nonexistent/python")
    assert vllm_bridge.vllm_python() is None
    with pytest.raises(vllm_bridge.VLLMError, match="make vllm"):
        vllm_bridge.VLLMWorker("assets/models/tiny-gpt2")
    from labsupport.bench import vs_vllm

    assert "make vllm" in vs_vllm.unavailable()
    assert vs_vllm.main([]) == 2


def test_worker_protocol_answers_errors_and_exits():
    """The worker speaks JSON lines even where vLLM is absent: errors are answers, not crashes."""
    commands = [{"op": "run", "requests": []}, {"op": "dance"}, {"op": "exit"}]
    proc = subprocess.run([sys.executable, str(vllm_bridge.WORKER)], input="".join(json.dumps(c) + "\n"
                          for c in commands), capture_output=True, text=True, timeout=60, check=False)
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0
    assert answers[0] == {"ok": False, "error": "RuntimeError: send 'start' first"}
    assert not answers[1]["ok"] and "op must be" in answers[1]["error"]
    assert answers[2] == {"ok": True}


def test_worker_without_vllm_fails_to_start_and_is_cleaned_up(monkeypatch):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is importable in this venv")
    except ImportError:
        pass
    monkeypatch.setenv("LABSUPPORT_VLLM_PYTHON", sys.executable)
    with pytest.raises(vllm_bridge.VLLMError, match="No module named 'vllm'"):
        vllm_bridge.VLLMWorker("assets/models/tiny-gpt2", timeout=60)
