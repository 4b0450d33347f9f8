"""Routing requests over engine replicas (data parallelism): round-robin vs prefix affinity.

Each replica has its own KV pool and prefix cache. A router that ignores the cache
(**round-robin**) sends requests sharing a system prompt to every replica, so each replica
computes and stores that prefix: more prefill, and the pools fill with copies. A
**prefix-affinity** router sends a request to the replica that already holds the longest
prefix of it (ties: the least loaded); a request no replica has a prefix of goes where the
hash of its first block points, so different system prompts spread over the replicas — as the cache-aware routers of
SGLang and vLLM's production stack do with an approximate prefix tree; here the router asks
each replica's block manager exactly (``num_prefix_hit_tokens``).

Replicas are :class:`~labsupport.engine.LLMEngine` objects in this process, stepped in turn.
Each has its own :class:`ReplicaClock` that runs only while that replica steps, so a replica's
TTFT counts its own work and queueing, not the other replica's steps (on a real cluster they
run on separate GPUs at the same time).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..sampling import GREEDY
from ..validation import check_int, is_int

__all__ = ["POLICIES", "ReplicaClock", "RouteStats", "Router", "bounded_affinity", "prefix_affinity",
           "system_prompt_workload"]

POLICIES = ("round_robin", "prefix_affinity", "bounded_affinity")
MAX_LOAD_GAP = 2
"""``bounded_affinity``: the favourite replica may hold at most this many more requests than the least loaded."""


def _check_choice_inputs(prompt_ids, hits, loads, block_size: int) -> None:
    if isinstance(prompt_ids, (str, bytes)) or not all(is_int(t) for t in prompt_ids):
        raise TypeError(f"prompt_ids must be token ids (integers), got {prompt_ids!r:.60}")
    if len(hits) == 0 or len(hits) != len(loads):
        raise ValueError(f"hits and loads must hold one entry per replica (at least one), got {len(hits)} and {len(loads)}")
    for name, values in (("hits", hits), ("loads", loads)):
        for v in values:
            check_int(name, v, 0)
    check_int("block_size", block_size, 1)


def _spread(prompt_ids: Sequence[int], num_replicas: int, block_size: int) -> int:
    """Where a prompt no replica has a prefix of goes: the hash of its first block."""
    return hash(tuple(int(t) for t in prompt_ids[:block_size])) % num_replicas


def prefix_affinity(prompt_ids: Sequence[int], hits: Sequence[int], loads: Sequence[int], block_size: int = 16) -> int:
    """The replica holding the longest prefix of the prompt (``hits``: its cached tokens on each
    replica; ties: the least loaded, then the lowest index); with no hit anywhere, the hash of the
    first block.

    Raises:
        TypeError / ValueError: prompt ids that are not integers, ``hits`` and ``loads`` of different
            lengths (or empty), a negative entry, ``block_size`` < 1.
    """
    _check_choice_inputs(prompt_ids, hits, loads, block_size)
    if max(hits) == 0:
        return _spread(prompt_ids, len(hits), block_size)
    return min(range(len(hits)), key=lambda i: (-hits[i], loads[i], i))


def bounded_affinity(prompt_ids: Sequence[int], hits: Sequence[int], loads: Sequence[int], block_size: int = 16,
                     max_load_gap: int = MAX_LOAD_GAP) -> int:
    """:func:`prefix_affinity`, unless its choice holds more than ``max_load_gap`` requests (waiting +
    running) above the least loaded replica: then the least loaded (lowest index on ties). A popular
    prefix no longer pins all its traffic to one replica.

    Raises:
        TypeError / ValueError: as :func:`prefix_affinity`; ``max_load_gap`` not an integer >= 0.
    """
    check_int("max_load_gap", max_load_gap, 0)
    favourite = prefix_affinity(prompt_ids, hits, loads, block_size)
    if loads[favourite] - min(loads) > max_load_gap:
        return min(range(len(loads)), key=lambda i: (loads[i], i))
    return favourite


class ReplicaClock:
    """A clock that advances in real time only inside :meth:`running`, and can jump forward to
    an arrival when its replica is idle. Pass it as the engine's ``clock``."""

    def __init__(self) -> None:
        self.now = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        return self.now + (time.perf_counter() - self._since if self._since is not None else 0.0)

    def start(self) -> None:
        self._since = time.perf_counter()

    def stop(self) -> None:
        self.now = self()
        self._since = None

    def advance_to(self, t: float) -> None:
        """Idle until ``t`` (no-op if the clock is already past it)."""
        self.now = max(self.now, t)


@dataclass
class RouteStats:
    """One routed run: per-request replica, prefix-hit tokens, TTFT; and totals.

    Attributes:
        replica / hit_tokens / prompt_tokens / ttft: per request, by request id.
        hit_rate: prefix-hit tokens over prompt tokens, all requests.
        tokens_computed: prompt tokens run through the models (prompt − hits).
    """

    policy: str
    replica: dict[str, int]
    hit_tokens: dict[str, int]
    prompt_tokens: dict[str, int]
    ttft: dict[str, float]

    @property
    def hit_rate(self) -> float:
        return sum(self.hit_tokens.values()) / max(1, sum(self.prompt_tokens.values()))

    @property
    def tokens_computed(self) -> int:
        return sum(self.prompt_tokens.values()) - sum(self.hit_tokens.values())


class Router:
    """Routes requests to replicas by a policy and runs them to the end.

    Args:
        replicas: engines with prefix caching on, each built with its own :class:`ReplicaClock`
            as ``clock`` (see :meth:`make_replicas`).
        policy: ``"round_robin"``, ``"prefix_affinity"``, ``"bounded_affinity"``, or a function
            ``policy(prompt_ids, hits, loads) -> replica index`` (``hits``: the prompt's cached
            prefix tokens on each replica; ``loads``: each replica's waiting + running requests).

    Raises:
        ValueError: no replicas, an unknown policy, a replica without prefix caching or without
            a :class:`ReplicaClock`; a policy function that returns no replica index (at ``run``).
    """

    def __init__(self, replicas: Sequence, policy: str = "prefix_affinity"):
        if not replicas:
            raise ValueError("replicas must hold at least one engine")
        if not callable(policy) and policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES} or a function (prompt_ids, hits, loads) -> replica "
                             f"index, got {policy!r}")
        self.policy = policy
        for i, e in enumerate(replicas):
            if not e.config.enable_prefix_caching or not isinstance(e.config.clock, ReplicaClock):
                raise ValueError(f"replica {i} needs enable_prefix_caching=True and a ReplicaClock as clock")
        self.replicas = list(replicas)
        self._rr = itertools.cycle(range(len(self.replicas)))

    @staticmethod
    def make_replicas(lm, num_replicas: int = 2, **engine_kwargs) -> list:
        """``num_replicas`` engines with prefix caching, each on its own :class:`ReplicaClock`."""
        from ..engine import LLMEngine

        num_replicas = check_int("num_replicas", num_replicas, 1)
        return [LLMEngine(lm, enable_prefix_caching=True, clock=ReplicaClock(), **engine_kwargs)
                for _ in range(num_replicas)]

    def choose(self, prompt_ids: Sequence[int]) -> int:
        """The replica for a prompt under the policy."""
        if self.policy == "round_robin":
            return next(self._rr)
        hits = [e.block_manager.num_prefix_hit_tokens(prompt_ids) for e in self.replicas]
        loads = [len(e.scheduler.waiting) + len(e.scheduler.running) for e in self.replicas]
        if callable(self.policy):
            return check_int("the policy's replica index", self.policy(list(prompt_ids), hits, loads),
                             0, len(self.replicas) - 1)
        rule = prefix_affinity if self.policy == "prefix_affinity" else bounded_affinity
        return rule(prompt_ids, hits, loads, self.replicas[0].block_manager.block_size)

    def _step_until(self, engine, t: float | None) -> None:
        """Step a replica until its clock reaches ``t`` (or it has no work; ``None`` = to the end)."""
        clock = engine.config.clock
        while engine.has_unfinished_requests() and (t is None or clock() < t):
            clock.start()
            try:
                engine.step()
            finally:
                clock.stop()
        if t is not None:
            clock.advance_to(t)

    def run(self, requests: Sequence[tuple[float, Sequence[int], int]]) -> RouteStats:
        """Route ``(arrival_time, prompt_ids, max_new_tokens)`` requests (times in seconds, in
        order) and run every replica to the end.

        Before a request is routed, every replica catches up to its arrival time, so the
        router sees each replica's cache as it would be then.
        """
        stats = RouteStats(getattr(self.policy, "__name__", "custom") if callable(self.policy) else self.policy, {}, {}, {}, {})
        ids = []
        taken = {rid for e in self.replicas for rid in e.requests}
        try:
            for k, (arrival, prompt, new) in enumerate(requests):
                for e in self.replicas:
                    self._step_until(e, arrival)
                i = self.choose(prompt)
                rid = next(r for r in itertools.chain([f"r{k}"], (f"r{k}.{n}" for n in itertools.count(1)))
                           if r not in taken)
                self.replicas[i].add_request(list(prompt), GREEDY, new, rid, arrival_time=arrival)
                taken.add(rid)
                stats.replica[rid], stats.prompt_tokens[rid] = i, len(prompt)
                ids.append(rid)
        except BaseException:                      # a bad request or policy: no request of this run is left behind
            for rid in ids:
                self.replicas[stats.replica[rid]].abort_request(rid)
            raise
        for e in self.replicas:
            self._step_until(e, None)
        for rid in ids:
            req = self.replicas[stats.replica[rid]].requests[rid]
            stats.hit_tokens[rid] = req.num_prefix_hit_tokens
            stats.ttft[rid] = req.metrics.ttft
        return stats


def system_prompt_workload(system_prompts: Sequence[Sequence[int]], questions: Sequence[Sequence[int]],
                           num_requests: int, gap: float = 0.01, new_tokens: int = 4,
                           seed: int = 0) -> list[tuple[float, list[int], int]]:
    """Requests each made of one of several system prompts and a question, drawn with a seeded
    generator, ``gap`` seconds apart: ``(arrival, prompt_ids, max_new_tokens)``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for k in range(check_int("num_requests", num_requests, 1)):
        s = system_prompts[int(rng.integers(len(system_prompts)))]
        q = questions[int(rng.integers(len(questions)))]
        out.append((k * gap, list(s) + list(q), new_tokens))
    return out
