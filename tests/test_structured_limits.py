"""Structured output under hostile specs: compile work is bounded (a pattern past the limits is
"grammar too large", not minutes of subset construction), nesting past the limit is a ValueError
on every front end (never a RecursionError), a refused spec leaves an engine's running requests
alone, and with ``fit_max_tokens`` a ``max_tokens`` below the shortest complete output is refused
up front on every path instead of ending invalid at ``"length"``."""

from __future__ import annotations

import json

import pytest
from helpers import make_tiny_lm

from labsupport.engine import LLMEngine
from labsupport.generation import generate, generate_batch
from labsupport.sampling import GREEDY, SamplingParams
from labsupport.speculative import NgramProposer, SpeculativeEngine, speculative_generate
from labsupport.structured import compile_structured_output, compile_tree, for_model, normalize_spec, parse_regex
from labsupport.structured.automaton import MAX_DFA_WORK, determinise, expansion_size
from labsupport.structured.grammar import MAX_JSON_NESTING
from labsupport.structured.regex import MAX_NESTING

NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def lm():
    return make_tiny_lm(seed=5, n_positions=128)


# ----------------------------------------------------------------------------- bounded compile work
@pytest.mark.parametrize("pattern", ["(a|b)*a(a|b){16}", "((a{2,20}){2,20}){2,20}", "(a|b)*a(a|b){18}",
                                     "([a-z]{1,30}){1,30}x", "(a|b)*a(a|b){14}", "[a-z]*a[a-z]{13}"])
def test_patterns_past_the_limits_are_refused_as_too_large(pattern, lm):
    """These took 81 s and 97 s (and more) and then compiled or ran out of memory; the work budget
    of the subset construction, or the expansion count before it, refuses them."""
    with pytest.raises(ValueError, match="grammar too large"):
        compile_tree(parse_regex(pattern))
    schema = {"type": "string", "pattern": f"^{pattern}$"}
    with pytest.raises(ValueError, match="grammar too large"):
        for_model({"json": schema}, lm)


def test_nested_bounds_are_counted_before_anything_is_built():
    tree = parse_regex("((a{10,60}){10,60}){10,60}x")
    assert expansion_size(tree) > 60 ** 3                              # 216,000 copies of "a" at least
    with pytest.raises(ValueError, match=r"its repetitions expand to [\d,]+ automaton states"):
        compile_tree(tree)


def test_the_work_budget_is_what_stops_the_subset_construction():
    from labsupport.structured.automaton import NFA
    nfa = NFA()
    start = nfa.new()
    end = nfa.build(parse_regex("(a|b)*a(a|b){12}"), start)
    assert determinise(nfa, start, end).num_states > 2 ** 13           # fits the default budget
    with pytest.raises(ValueError, match=r"takes more than 1,000 steps"):
        determinise(nfa, start, end, max_work=1000)
    assert MAX_DFA_WORK >= 1_000_000


@pytest.mark.parametrize("pattern,states", [("(a|b)*a(a|b){10}", 2 ** 11), ("((a{2,8}){2,8}){2,8}", 513),
                                            (r"[a-z]{0,200}", 201), (r"\d{3}-\d{4}", 9)])
def test_patterns_that_compiled_before_still_compile_to_the_same_automaton(pattern, states):
    dfa = compile_tree(parse_regex(pattern))
    assert dfa.num_states == states                                  # the minimal DFA


def test_a_large_automaton_fills_its_token_rows_on_first_use(lm):
    """4,096 states: past the warm-up size, so the compile leaves the token index empty; masks are
    still right, and fit_max_tokens (which needs every row) fills them all."""
    g = for_model({"regex": "(a|b)*a(a|b){11}"}, lm)
    assert g.dfa.num_states == 2 ** 12 and g.index.cached_states == 0
    out = generate(lm, [5, 9], SamplingParams(temperature=0.0, max_tokens=20,
                                              structured_output={"regex": "(a|b)*a(a|b){11}"}))
    assert 1 <= g.index.cached_states <= 21 and out.text and set(out.text) <= {"a", "b"}   # the states it visited
    assert out.finish_reason != "stop" or g.matches(out.text)
    fit = for_model({"regex": "(a|b)*a(a|b){11}", "fit_max_tokens": True}, lm)
    assert fit.tokens_to_finish(0) >= 1 and fit.index.cached_states == fit.dfa.num_states


def test_a_refused_pattern_leaves_the_running_requests_alone(lm):
    prompts = [[5, 9, 2, 7], [3, 3, 8]]
    expected = [o.token_ids for o in LLMEngine(lm, block_size=4, num_blocks=64).generate(prompts, GREEDY, 8)]
    eng = LLMEngine(lm, block_size=4, num_blocks=64)
    ids = [eng.add_request(p, GREEDY, 8) for p in prompts]
    eng.step()
    eng.step()
    with pytest.raises(ValueError, match="grammar too large"):
        bad = SamplingParams(temperature=0.0, max_tokens=8,
                             structured_output={"json": {"type": "string", "pattern": "^(a|b)*a(a|b){16}$"}})
        eng.add_request([1, 2], bad)
    with pytest.raises(ValueError, match="grammar too large"):
        eng.add_request([1, 2], SamplingParams(temperature=0.0, max_tokens=8,
                                               structured_output={"regex": "((a{2,20}){2,20}){2,20}"}))
    assert list(eng.requests) == ids
    eng.run()
    assert [eng.output(i).token_ids for i in ids] == expected
    eng.block_manager.audit()


# ----------------------------------------------------------------------------- deep nesting
def _array(depth):
    s = {"type": "integer"}
    for _ in range(depth):
        s = {"type": "array", "items": s}
    return s


def _any_of(depth):
    s = {"type": "integer"}
    for _ in range(depth):
        s = {"anyOf": [s, {"type": "null"}]}
    return s


def _ref_chain(depth):
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


CHAIN = "\n".join(["root ::= r0"] + [f'r{i} ::= "a" r{i + 1}' for i in range(199)] + ['r199 ::= "b"'])
DEEP = {
    "array 1000 deep": ({"json": _array(1000)}, MAX_JSON_NESTING),
    "anyOf 2000 deep": ({"json": _any_of(2000)}, MAX_JSON_NESTING),
    "$ref chain of 200": ({"json": _ref_chain(200)}, MAX_NESTING),
    "recursive schema nested 1000 deep": ({"json": {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                                                    "anyOf": [_array(1000), {"$ref": "#/$defs/t"}]}}, MAX_JSON_NESTING),
    "regex with 3000 nested groups": ({"regex": "(" * 3000 + "a" + ")" * 3000}, MAX_NESTING),
    "EBNF with 3000 nested parentheses": ({"grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000}, MAX_NESTING),
    "EBNF chain of 200 rules": ({"grammar": CHAIN}, MAX_NESTING),
}


@pytest.mark.parametrize("name", list(DEEP))
def test_deep_nesting_is_a_value_error_on_every_front_end(name, lm):
    spec, limit = DEEP[name]
    match = rf"structured_output: .*nesting deeper than {limit} levels"
    with pytest.raises(ValueError, match=match):
        normalize_spec(spec)
    with pytest.raises(ValueError, match=match):
        compile_structured_output(spec, lm.tokenizer)
    with pytest.raises(ValueError, match=match):
        SamplingParams(temperature=0.0, structured_output=spec)


def test_nesting_up_to_the_limit_still_compiles(lm):
    for spec in ({"regex": "(" * MAX_NESTING + "a" + ")" * MAX_NESTING},
                 {"grammar": "root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING},
                 {"json": _array(3)}):
        g = compile_structured_output(spec, lm.tokenizer)
        assert g.matches("a" if "json" not in spec else "[[[1]]]")


# ----------------------------------------------------------------------------- never invalid at max_tokens
def _paths(lm, params):
    prompt = [5, 9, 2, 7]
    yield "generate", lambda: generate(lm, prompt, params)
    yield "generate_batch", lambda: generate_batch(lm, [prompt, prompt[:2]], params)
    yield "engine", lambda: LLMEngine(lm, block_size=4, num_blocks=64).generate([prompt], params)
    yield "spec-engine", lambda: SpeculativeEngine(lm, NgramProposer(3), block_size=4, num_blocks=64).generate(
        [prompt], params)
    yield "speculative_generate", lambda: speculative_generate(lm, NgramProposer(3), prompt, params)


def test_fit_max_tokens_refuses_a_budget_below_the_shortest_completion_on_every_path(lm):
    spec = {"json": NAME, "fit_max_tokens": True}
    need = int(for_model(spec, lm).tokens_to_finish(0))
    assert need >= 3
    short = SamplingParams(temperature=0.0, max_tokens=need - 1, structured_output=spec)
    for path, run in _paths(lm, short):
        with pytest.raises(ValueError, match=rf"max_tokens must be at least {need} .* got {need - 1}"):
            run()
    enough = SamplingParams(temperature=0.0, max_tokens=need, structured_output=spec)
    for path, run in _paths(lm, enough):
        out = run()
        text = out.text if hasattr(out, "text") else out[0].text
        assert isinstance(json.loads(text)["name"], str), path


def test_without_fit_max_tokens_a_short_budget_is_the_users_choice(lm):
    params = SamplingParams(temperature=0.0, max_tokens=2, structured_output={"json": NAME})
    out = generate(lm, [5, 9, 2, 7], params)
    assert out.finish_reason == "length" and len(out.token_ids) == 2
