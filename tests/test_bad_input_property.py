"""Property: every public function and panel constructor of the package, given an invalid value
of a parameter's declared scalar type (wrong type, NaN/±inf for a float, a bool for an int), raises
``TypeError`` or ``ValueError`` whose message names that parameter — never another exception,
never a silent result.

Functions are found by introspection (signatures and type hints); the other required arguments
come from a small table of valid values by parameter name, and a function needing one that is
not in the table is left out (the test asserts how many it covers).
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODULES = ["labsupport.sampling", "labsupport.generation", "labsupport.beam", "labsupport.kv",
           "labsupport.serving_math"]
for _pkg in ("sim", "viz", "widgets", "speculative"):
    _m = importlib.import_module(f"labsupport.{_pkg}")
    MODULES += [f"labsupport.{_pkg}.{i.name}" for i in pkgutil.iter_modules(_m.__path__)]
ENGINE_CLASSES = [("labsupport.engine", "LLMEngine"), ("labsupport.engine", "EngineConfig"),
                  ("labsupport.speculative.engine", "SpeculativeEngine"), ("labsupport.sampling", "SamplingParams")]


def _valid_values():
    from labsupport.kv import preset
    from labsupport.models import load_model
    lm = load_model("tiny-gpt2", device="cpu")
    return {"lm": lm, "target": lm, "draft": lm, "prompt": "Hello", "shape": preset("Llama 3 8B"),
            "logits": torch.zeros(lm.model.config.vocab_size), "probs": torch.full((4,), 0.25),
            # data of the figure builders
            "batches": [1, 2], "step_ms": [1.0, 2.0], "tokens_per_s": [1.0, 1.0], "temperatures": [0.5, 1.0],
            "entropy_bits": [1.0, 2.0], "rows": {"a": {"TTFT p50": 1.0}}, "title": "t",
            "states": {"a": ["waiting", "decode"]}, "block_tables": {"a": [0]}, "num_blocks": 4,
            "labels": ["a"], "throughput": [1.0], "goodput": [1.0], "prompt_len": 4, "new_tokens": 3,
            "gammas": [1, 2], "tokens_per_round": [1.5, 1.8], "speedup": [1.2, 1.3], "mc": [1.2, 1.3]}


# a valid value where one parameter name means different data in different builders
OVERRIDES = {("labsupport.viz.serving.latency_bars_figure", "rows"):
             {"a": {"ttft_p50": 1.0, "ttft_p95": 2.0, "itl_p50": 1.0, "itl_p95": 2.0}},
             ("labsupport.viz.serving.tradeoff_table_figure", "rows"): [("a", "b", "c", "d", "e")]}


# builders whose required data have a name the table uses for other data (rows of variant results)
NO_VALID_DATA = {"labsupport.viz.speculative_variants.measured_vs_predicted_figure"}


def _scalar_kind(annotation) -> str | None:
    """'int' / 'float' / 'bool' / 'str' for a parameter declared as exactly that (or with None)."""
    text = str(annotation).replace("typing.", "")
    parts = {p.strip() for p in text.split("|")}
    optional = "None" in parts
    parts.discard("None")
    if len(parts) == 1 and (kind := next(iter(parts))) in {"int", "float", "bool", "str"}:
        return kind + ("?" if optional else "")
    return None


def _bad_values(kind: str) -> list:
    base, optional = kind.rstrip("?"), kind.endswith("?")
    none = [] if optional else [None]
    return {
        "int": none + ["3", 2.5, [1], True],
        "float": none + ["0.5", [0.5], math.nan, math.inf, -math.inf],
        "bool": none + ["False", 0, 1.0],
        "str": none + [3, 1.5, ["x"]],
    }[base]


def _cases():
    valid = _valid_values()
    cases, skipped = [], []
    targets = []
    for name in MODULES:
        module = importlib.import_module(name)
        for fname, obj in vars(module).items():
            if fname.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                targets.append((f"{name}.{fname}", obj))
    for mod, cls in ENGINE_CLASSES:
        targets.append((f"{mod}.{cls}", getattr(importlib.import_module(mod), cls)))
    for qual, fn in targets:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        required = {p.name for p in params if p.default is inspect.Parameter.empty}
        if not required <= set(valid) or qual in NO_VALID_DATA:
            skipped.append(qual)
            continue
        base = {n: OVERRIDES.get((qual, n), valid[n]) for n in required}
        for p in params:
            kind = _scalar_kind(p.annotation)
            if kind is None or p.name in required and p.name not in ("prompt",):
                continue
            for bad in _bad_values(kind):
                cases.append((qual, fn, base, p.name, bad))
    return cases, skipped


CASES, SKIPPED = _cases()
# panel helpers whose job is to receive any value and report it, not to validate their own arguments
EXEMPT = {"labsupport.widgets.common.error_html"}
def test_the_sweep_covers_the_package():
    covered = {c[0] for c in CASES}
    assert len(covered) >= 20, sorted(covered)
    assert any(q.startswith("labsupport.widgets.") for q in covered)
    assert any(q.startswith("labsupport.viz.") for q in covered)


def _call(case):
    qual, fn, base, name, bad = case
    kwargs = dict(base)
    kwargs[name] = bad
    try:
        fn(**kwargs)
    except (TypeError, ValueError) as err:
        assert name in str(err), f"{qual}({name}={bad!r}) raised {type(err).__name__} not naming {name}: {err}"
        return
    except Exception as err:                      # noqa: BLE001 - the property: nothing else escapes
        pytest.fail(f"{qual}({name}={bad!r}) raised {type(err).__name__}: {err}")
    pytest.fail(f"{qual}({name}={bad!r}) accepted an invalid value")


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from([c for c in CASES if c[0] not in EXEMPT]))
def test_invalid_scalar_values_raise_errors_naming_the_parameter(case):
    _call(case)
