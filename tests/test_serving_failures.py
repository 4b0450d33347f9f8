"""Disaggregated serving under bad input and dying workers: no request is lost, no error is bare.

The multi-process tests start real worker processes (spawn, pipes only, no network), each bounded by
the server's timeout; every server is closed by its ``with`` block and the tests check that no
worker outlives it.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import pytest
from helpers import make_tiny_lm

from labsupport.serving.disagg import DisaggregatedServer, ServeRequest, run_colocated

KW = {"block_size": 8, "num_blocks": 64, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def lm():
    return make_tiny_lm(seed=3, n_positions=128)


def _good(prefix: str = "") -> list[ServeRequest]:
    return [ServeRequest(f"{prefix}a", [1, 2, 3, 4, 5], 6), ServeRequest(f"{prefix}b", [9, 8, 7], 4, 0.01),
            ServeRequest(f"{prefix}c", list(range(20, 50)), 5, 0.02)]


def _tokens(results) -> dict[str, list[int]]:
    return {rid: r.token_ids for rid, r in results.items()}


def test_worker_settings_are_checked_before_any_process_starts(lm):
    with pytest.raises(ValueError, match=r"prefill_kwargs: block_size must be an integer >= 1, got 0"):
        DisaggregatedServer(lm, {"block_size": 0})
    with pytest.raises(ValueError, match=r"decode_kwargs: unknown decode_kwargs \['blocksize'\]"):
        DisaggregatedServer(lm, {}, {"blocksize": 8})
    with pytest.raises(TypeError, match="decode_kwargs: decode_kwargs must be a dict"):
        DisaggregatedServer(lm, {}, [("block_size", 8)])
    with pytest.raises(TypeError, match="prefill_kwargs: enable_prefix_caching must be"):
        DisaggregatedServer(lm, {"enable_prefix_caching": "yes"})


@pytest.mark.slow
def test_bad_requests_are_refused_before_sending_and_the_server_goes_on(lm):
    v = lm.model.config.vocab_size
    good = _good() + [ServeRequest("edge", list(range(127)), 9, 0.03)]      # the context window's last slot
    expected = _tokens(run_colocated(lm, good, **KW))
    bad = [(ServeRequest("x", [1, v + 5], 3), ValueError, r"prompt_ids of request 'x' must be token ids in \[0, "),
           (ServeRequest("x", [], 3), ValueError, "prompt_ids of request 'x' must contain at least one"),
           (ServeRequest("x", [1.5], 3), TypeError, "prompt_ids of request 'x' must hold integer"),
           (ServeRequest("x", [1], 0), ValueError, r"max_new_tokens of request 'x' must be an integer >= 1, got 0"),
           (ServeRequest("a", [1], 2), ValueError, "request_id 'a' is used twice in this call"),
           (ServeRequest("", [1], 2), ValueError, "request_id must be a non-empty str"),
           (ServeRequest(7, [1], 2), TypeError, "request_id must be a non-empty str"),
           (ServeRequest("x", [1], 2, -1.0), ValueError, "arrival of request 'x' must be"),
           ("x", TypeError, r"requests\[4\] must be a ServeRequest")]
    with DisaggregatedServer(lm, KW, KW, timeout=90) as server:
        for req, kind, message in bad:
            with pytest.raises(kind, match=message):
                server.serve(good + [req])
        first = server.serve(good)                                         # nothing of the refused calls was sent
        with pytest.raises(ValueError, match="request_id 'a' is used already, by an earlier call"):
            server.serve([replace(good[0], prompt_ids=[3])])
        again = server.serve([replace(r, request_id="2" + r.request_id) for r in good])
        procs = list(server._procs)
    assert _tokens(first) == expected
    assert _tokens(again) == {"2" + k: t for k, t in expected.items()}
    assert all(r.finish_reason == "length" and r.error is None for r in first.values())
    assert len(first["edge"].token_ids) == 1                                # cut to the window, vLLM's rule
    assert not any(p.is_alive() for p in procs)


@pytest.mark.slow
@pytest.mark.parametrize("layerwise", [False, True])
def test_a_request_a_worker_cannot_run_ends_alone_with_its_reason(lm, layerwise):
    """The context window (n_positions = 128) and a decode pool too small for one prompt: each such
    request ends with "error" and says why; the others equal a single engine's tokens."""
    good = _good()
    expected = _tokens(run_colocated(lm, good, **KW))
    decode = dict(KW, num_blocks=6)                                     # 48 slots: a 60-token prompt never fits
    odd = [ServeRequest("window", list(range(128)), 3), ServeRequest("pool", list(range(60)), 3, 0.005)]
    with DisaggregatedServer(lm, KW, decode, timeout=90) as server:
        got = server.serve(good + odd, layerwise=layerwise)
    assert {k: got[k].token_ids for k in expected} == expected
    window, pool = got["window"], got["pool"]
    assert window.finish_reason == "error" and window.token_ids == []
    assert "leaves no room in the context window (n_positions = 128)" in window.error
    assert pool.finish_reason == "error" and pool.token_ids == [] and "the pool has 6 blocks" in pool.error


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["prefill-worker", "decode-worker"])
def test_a_killed_worker_is_reported_at_once_with_its_signal(lm, victim):
    timeout = 90.0
    with DisaggregatedServer(lm, KW, KW, timeout=timeout) as server:
        assert _tokens(server.serve(_good("1")))                           # serving
        proc = next(p for p in server._procs if p.name == victim)
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match=rf"a worker died: {victim} \(killed by signal 9\)"):
            server.serve(_good("2"))
        waited = time.perf_counter() - t0
        with pytest.raises(RuntimeError, match="a worker died"):           # and it stays dead, said the same way
            server.serve(_good("3"))
        procs = list(server._procs)
    assert waited < timeout / 3, f"reported after {waited:.1f} s, the start/serve timeouts are {timeout} s"
    assert not any(p.is_alive() for p in procs)


@pytest.mark.slow
def test_a_worker_that_fails_to_start_says_why_at_once(lm):
    """Settings the parent cannot judge (a pool larger than memory) fail in the worker; its own
    message comes back as "a worker died", not as a start timeout or a bare EOFError."""
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"a worker died: decode-worker: ValueError: num_blocks=\d+ would take"), \
            DisaggregatedServer(lm, KW, dict(KW, num_blocks=10 ** 12), timeout=90):
        pass
    assert time.perf_counter() - t0 < 45, "the start timeout is 60 s"
