"""Benchmark of structured output on this machine: validity, mask cost, compile time.

    python -m labsupport.bench structured [--runs 100] [--repeats 5] [--threads 1] [--model tiny-gpt2]

For several specs (JSON Schemas, a regex, a choice, an EBNF grammar, a recursive schema) it samples ``--runs`` outputs at T = 1
with and without the grammar and prints the share that parse and validate (``jsonschema``
for schemas, ``re.fullmatch`` for regexes). Then it times one decode step of the model
(batch 1, KV cache), our mask step (look-up of the cached mask + ``-inf`` fill + advance)
and XGrammar's (``fill_next_token_bitmask`` + ``apply_token_bitmask_inplace`` +
``accept_token``) over the states of real outputs, the compile time of both, and on how many of
those states the two allowed-token sets are identical. Times are
medians of ``--repeats`` runs with their spread; they are printed, never asserted.

The measuring helpers are also used by the structured-output chapter.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..generation import generate_batch
from ..models import LoadedModel, model_forward
from ..sampling import SamplingParams
from ..structured import apply_structured_mask, for_model, normalize_spec
from ..structured.grammar import _CACHE
from ..timing import median_range
from ..validation import check_int

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "student": {"type": "boolean"}},
          "required": ["name", "age", "student"]}
ORDER = {"type": "object",
         "properties": {"item": {"enum": ["book", "pen", "lamp"]},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                        "gift": {"type": "boolean"},
                        "colors": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3}},
         "required": ["item", "quantity"]}
ARITHMETIC = r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= "0" | [1-9] [0-9]* | "(" expr ")"
'''
"""Arithmetic expressions: brackets nest to any depth, so no finite automaton holds them."""
TREE = {"$defs": {"node": {"type": "object",
                           "properties": {"name": {"type": "string"},
                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                           "required": ["name", "children"]}},
        "$ref": "#/$defs/node"}
"""A tree of named nodes: a recursive ``$ref``, the pushdown path."""
SPECS = {
    "person (JSON)": ({"json": PERSON}, 'Return a JSON object with "name", "age" and "student": '),
    "order (JSON)": ({"json": ORDER}, 'Answer in JSON with "item", "quantity", "gift", "colors": '),
    "ISO date (regex)": ({"regex": r"\d{4}-\d{2}-\d{2}"}, "The date in ISO format (YYYY-MM-DD) is "),
    "yes/no (choice)": ({"choice": ["yes", "no"]}, "Is the value an integer? Answer yes or no: "),
    "arithmetic (EBNF)": ({"grammar": ARITHMETIC}, "The value of (12+7)*3-4 equals the value of "),
    "tree (recursive)": ({"json": TREE, "any_order": False}, 'A JSON tree of nodes with "name" and "children": '),
}


def arithmetic_ok(text: str) -> bool:
    """Is ``text`` an expression of :data:`ARITHMETIC`? Checked with Python's own parser (no spaces,
    integers, the four operators and brackets only), independently of our matcher."""
    if not text or any(c not in "0123456789+-*/()" for c in text):
        return False
    if re.search(r"(?<![0-9])0[0-9]", text):          # a leading zero ("00" is Python, not the grammar)
        return False
    text = re.sub(r"[0-9]+", "1", text)                # each integer as 1: no limit on digits (Python's 4300)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError):   # very deep brackets exhaust the parser's stack
        return False
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
    return all(isinstance(n, allowed) and (not isinstance(n, ast.Constant) or type(n.value) is int)
               for n in ast.walk(tree))


GRAMMAR_CHECKS = {ARITHMETIC: arithmetic_ok}


def load_jsonschema():
    """``import jsonschema`` without its optional IRI format checker.

    ``jsonschema`` imports ``rfc3987_syntax`` when it is installed (JupyterLab's dependencies
    install it), which builds a Lark grammar at import time — seconds on a laptop. Our
    schemas use no ``format``, so that optional import is skipped when jsonschema is not
    loaded yet (it is an optional import inside jsonschema: it simply leaves ``iri`` unchecked).
    """
    import sys
    if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None          # makes `from rfc3987_syntax import ...` an ImportError
        try:
            import jsonschema
        finally:
            del sys.modules["rfc3987_syntax"]
        return jsonschema
    import jsonschema
    return jsonschema


def is_valid(text: str, spec: dict) -> bool:
    """Does ``text`` satisfy ``spec`` by an independent check (jsonschema / re / membership)?"""
    jsonschema = load_jsonschema()
    kind, payload, _ = normalize_spec(spec)
    if kind == "regex":
        return re.fullmatch(payload, text) is not None
    if kind == "choice":
        return text in payload
    if kind == "grammar":
        if payload not in GRAMMAR_CHECKS:
            raise ValueError("is_valid has no independent check for this grammar (known: the ARITHMETIC grammar)")
        return GRAMMAR_CHECKS[payload](text)
    try:
        jsonschema.validate(strict_json(text), payload)
    except (ValueError, RecursionError, jsonschema.ValidationError):
        return False
    return True


def strict_json(text: str):
    """``json.loads`` as RFC 8259 reads JSON: ``NaN``/``Infinity`` (Python's extension) and an object
    with a key twice (whose meaning JSON leaves open) are refused with ``ValueError``."""
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")

    def unique_keys(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("an object has a key twice")
        return dict(pairs)
    return json.loads(text, parse_constant=no_constant, object_pairs_hook=unique_keys)


@dataclass
class Validity:
    """Share of sampled outputs that validate, with and without the grammar."""
    name: str
    runs: int
    constrained_valid: int
    unconstrained_valid: int
    constrained_stopped: int          # ended with EOS (the rest were cut by max_tokens)
    constrained_texts: list
    unconstrained_texts: list


def validity(lm: LoadedModel, spec: dict, prompt: str, *, runs: int = 100, seed: int = 0,
             max_tokens: int = 64, unconstrained_max_tokens: int | None = None, batch: int = 50,
             name: str = "") -> Validity:
    """Sample ``runs`` outputs at T = 1 with and without ``spec`` and count the valid ones.

    ``unconstrained_max_tokens`` (default ``max_tokens``) bounds the prompt-only runs.
    """
    out = {}
    for constrained in (True, False):
        limit = max_tokens if constrained or unconstrained_max_tokens is None else unconstrained_max_tokens
        params = SamplingParams(temperature=1.0, max_tokens=limit,
                                structured_output=spec if constrained else None)
        gen = torch.Generator().manual_seed(seed)
        results = []
        for lo in range(0, runs, batch):
            results += generate_batch(lm, [prompt] * min(batch, runs - lo), params, generator=gen)
        out[constrained] = results
    c, u = out[True], out[False]
    return Validity(name, runs, sum(is_valid(r.text, spec) for r in c), sum(is_valid(r.text, spec) for r in u),
                    sum(r.finish_reason == "stop" for r in c), [r.text for r in c], [r.text for r in u])


def decode_step_seconds(lm: LoadedModel, repeats: int = 5, steps: int = 32, batch: int = 1) -> list[float]:
    """Seconds per decode step (``batch`` sequences, KV cache, 64-token context), one value per repeat."""
    out = []
    ids = torch.tensor([lm.encode("Return a JSON object with the name and the age of the person. " * 2)[:64]] * batch)
    with torch.no_grad():
        for _ in range(repeats + 1):
            logits, cache = model_forward(lm.model, ids, None)
            tok = logits[:, -1:].argmax(-1)
            start = time.perf_counter()
            for _ in range(steps):
                logits, cache = model_forward(lm.model, tok, cache)
                tok = logits[:, -1:].argmax(-1)
            out.append((time.perf_counter() - start) / steps)
    return out[1:]


def mask_step_seconds(lm: LoadedModel, spec: dict, token_runs: Sequence[Sequence[int]], repeats: int = 5) -> list[float]:
    """Seconds per step of our grammar step (mask look-up + -inf fill + advance) along real outputs."""
    g = for_model(spec, lm)
    logits = torch.randn(1, g.vocab_size)
    out = []
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        for ids in token_runs:
            state = g.initial_state()
            for t in ids:
                apply_structured_mask(logits, g.allowed_token_mask(state))
                state = g.advance(state, t)
                n += 1
        out.append((time.perf_counter() - start) / max(n, 1))
    return out


def _xgrammar_compile(compiler, spec: dict):
    """``spec`` compiled by XGrammar with the settings closest to ours (compact JSON, same any-order flag)."""
    from ..structured.peer import captured_native_stderr

    kind, payload, options = normalize_spec(spec)
    with captured_native_stderr():                   # its fall-back warnings, not a red box in the notebook
        if kind == "json":
            ws = options["whitespace"]
            extra = {"any_whitespace": False, "separators": (",", ":")} if ws == 0 else \
                {"any_whitespace": True, "max_whitespace_cnt": ws}
            return compiler.compile_json_schema(payload, any_order=options["any_order"], **extra)
        if kind == "regex":
            return compiler.compile_regex(payload)
        if kind == "grammar":
            return compiler.compile_grammar(payload)
        return compiler.compile_regex("|".join(re.escape(c) for c in payload))


def batch_mask_step_seconds(lm: LoadedModel, spec: dict, token_runs: Sequence[Sequence[int]], batch: int = 8,
                            repeats: int = 5) -> list[float]:
    """Seconds per engine step of the grammar for ``batch`` requests at once: ``batch`` mask look-ups,
    one masked fill of the ``(batch, vocab)`` logits (as ``LLMEngine`` does) and ``batch`` advances,
    the requests replaying ``token_runs`` side by side (cycled to ``batch`` of them)."""
    batch = check_int("batch", batch, 1)
    repeats = check_int("repeats", repeats, 1)
    if not token_runs or not any(len(r) for r in token_runs):
        raise ValueError("token_runs must hold at least one non-empty run of token ids")
    g = for_model(spec, lm)
    runs = [list(token_runs[i % len(token_runs)]) for i in range(batch)]
    logits = torch.randn(batch, g.vocab_size)
    out = []
    for _ in range(repeats):
        states, n, start = [g.initial_state()] * batch, 0, time.perf_counter()
        for step in range(max(len(r) for r in runs)):
            live = [b for b in range(batch) if step < len(runs[b])]
            apply_structured_mask(logits[live], torch.stack([g.allowed_token_mask(states[b]) for b in live]))
            for b in live:
                states[b] = g.advance(states[b], runs[b][step])
            n += 1
        out.append((time.perf_counter() - start) / max(n, 1))
    return out


def xgrammar_step_seconds(lm: LoadedModel, spec: dict, token_runs: Sequence[Sequence[int]],
                          repeats: int = 5) -> tuple[list[float], list[float]] | None:
    """XGrammar's step (bitmask fill + apply + accept) and compile seconds, or None without it."""
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    normalize_spec(spec)                              # a bad spec raises here, as for ours
    vocab = lm.model.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(lm.tokenizer, vocab_size=vocab)

    def compile_once():
        return _xgrammar_compile(xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False), spec)

    compile_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled = compile_once()
        compile_s.append(time.perf_counter() - start)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    logits = torch.randn(1, vocab)
    step_s = []
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        for ids in token_runs:
            matcher = xgr.GrammarMatcher(compiled)
            for t in ids:
                matcher.fill_next_token_bitmask(bitmask)
                xgr.apply_token_bitmask_inplace(logits, bitmask)
                matcher.accept_token(t)
                n += 1
        step_s.append((time.perf_counter() - start) / max(n, 1))
    return step_s, compile_s


def mask_agreement(lm: LoadedModel, spec: dict, token_runs: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """Along ``token_runs``: (states where our allowed-token set equals XGrammar's, states compared),
    or None without XGrammar. Meaningful where both compile the spec exactly (see the chapter)."""
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    g = for_model(spec, lm)
    info = xgr.TokenizerInfo.from_huggingface(lm.tokenizer, vocab_size=g.vocab_size)
    compiled = _xgrammar_compile(xgr.GrammarCompiler(info, max_threads=1), spec)
    bitmask = xgr.allocate_token_bitmask(1, g.vocab_size)
    bits = torch.arange(32, dtype=torch.int32)
    equal = compared = 0
    for ids in token_runs:
        matcher, state = xgr.GrammarMatcher(compiled), g.initial_state()
        for t in ids:
            matcher.fill_next_token_bitmask(bitmask)
            theirs = ((bitmask[0].unsqueeze(-1) >> bits) & 1).flatten()[:g.vocab_size].bool()
            equal += bool(torch.equal(g.allowed_token_mask(state), theirs))
            compared += 1
            state = g.advance(state, t)
            matcher.accept_token(t)
    return equal, compared


def our_compile_seconds(lm: LoadedModel, spec: dict, repeats: int = 5) -> list[float]:
    """Cold compile time (cache cleared): tree → DFA → every state's token mask."""
    out = []
    for _ in range(repeats):
        _CACHE.clear()
        out.append(for_model(spec, lm).compile_seconds)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the validity table and the cost table."""
    from ..models import load_model

    parser = argparse.ArgumentParser(prog="python -m labsupport.bench structured", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="tiny-gpt2")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    print(f"Structured output benchmark: {args.model}, T = 1, {args.runs} runs per spec, "
          f"{args.threads} torch thread(s), times = median (min-max) of {args.repeats}")
    print(f"{'spec':<18} {'valid (grammar)':>16} {'ended with EOS':>15} {'valid (prompt only)':>20}")
    rows = {}
    ok = True
    for name, (spec, prompt) in SPECS.items():
        v = validity(lm, spec, prompt, runs=args.runs, name=name)
        rows[name] = v
        ok &= v.constrained_valid == v.constrained_stopped
        print(f"{name:<18} {v.constrained_valid / v.runs:>15.0%} {v.constrained_stopped / v.runs:>15.0%} "
              f"{v.unconstrained_valid / v.runs:>20.0%}")
    steps = decode_step_seconds(lm, args.repeats)
    step = statistics.median(steps)
    steps8 = decode_step_seconds(lm, args.repeats, batch=8)
    step8 = statistics.median(steps8)
    print(f"\nmodel decode step (batch 1, KV cache): {median_range(steps, scale=1e3, digits=3, unit=' ms')}; "
          f"batch 8: {median_range(steps8, scale=1e3, digits=3, unit=' ms')}")
    print(f"{'spec':<18} {'ours µs/step':>26} {'cold':>6} {'% of decode':>12} {'XGrammar µs/step':>26} "
          f"{'ours/XGr':>9} {'ours compile ms':>28} {'XGr compile ms':>24} {'states':>7} {'masks equal':>12} "
          f"{'batch 8: % of step':>19}")
    for name, (spec, _) in SPECS.items():
        runs = [lm.encode(t) for t in rows[name].constrained_texts[:20]]
        comp = our_compile_seconds(lm, spec, args.repeats)          # leaves a freshly compiled grammar
        ours = mask_step_seconds(lm, spec, runs, args.repeats + 1)  # its first pass is cold
        cold, ours = ours[0], ours[1:]
        peer = xgrammar_step_seconds(lm, spec, runs, args.repeats)
        states = for_model(spec, lm).num_states
        agree = mask_agreement(lm, spec, runs)
        at8 = statistics.median(batch_mask_step_seconds(lm, spec, runs, 8, args.repeats)) / step8
        same = "n/a" if agree is None else f"{agree[0]}/{agree[1]}"
        if peer is None:
            xs, xc, ratio = "n/a", "n/a", "n/a"
        else:
            xs, xc = median_range(peer[0], scale=1e6, digits=1), median_range(peer[1], scale=1e3, digits=1)
            ratio = f"{statistics.median(ours) / statistics.median(peer[0]):.2f}×"
        print(f"{name:<18} {median_range(ours, scale=1e6, digits=1):>26} {cold * 1e6:>6.0f} "
              f"{statistics.median(ours) / step:>11.1%} {xs:>26} {ratio:>9} "
              f"{median_range(comp, scale=1e3, digits=1):>28} {xc:>24} {states:>7} {same:>12} {at8:>19.1%}")
    print("\n(XGrammar compiles with one thread and no cache; the step replays the same token sequences "
          "for both. A constrained output cut by max_tokens is a valid prefix, not a valid document. "
          "'masks equal' counts the replayed states where both allow the same tokens: our any-order objects "
          "allow each key once where XGrammar's any_order allows repeats, and bounded strings differ by design "
          "(chapter 08), so only the fixed-order and unbounded specs can agree everywhere. The pushdown specs "
          "(EBNF, recursive) build a state's mask on its first visit and cache it: 'cold' is the first pass after compiling, "
          "'states' the states it met.)")
    return 0 if ok else 1


if __name__ == "__main__":
    import sys
    sys.exit(main())
