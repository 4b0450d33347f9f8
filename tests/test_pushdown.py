"""Context-free grammars (EBNF) through the pushdown matcher: parsing, exact languages, masks equal to
XGrammar's on random walks, and parseable output through generate, LLMEngine and the speculative engine."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from helpers import shipped_tokenizer

from labsupport.engine import LLMEngine
from labsupport.generation import generate
from labsupport.sampling import SamplingParams
from labsupport.structured import compile_structured_output, normalize_spec
from labsupport.structured.ebnf import lower

ARITH = r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*   # a product
factor ::= [0-9]+ | "(" expr ")"
'''
JSON = r'''
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" (string ":" value ("," string ":" value)*)? "}"
array  ::= "[" (value ("," value)*)? "]"
string ::= "\"" ([^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+-]? [0-9]+)?
'''


def _arith(text: str) -> bool:
    """A reference recursive-descent recogniser of ARITH, written independently of the matcher."""
    pos = 0

    def factor():
        nonlocal pos
        if pos < len(text) and text[pos].isdigit():
            while pos < len(text) and text[pos].isdigit():
                pos += 1
            return True
        if pos < len(text) and text[pos] == "(":
            pos += 1
            if not expr() or pos >= len(text) or text[pos] != ")":
                return False
            pos += 1
            return True
        return False

    def chain(item, ops):
        nonlocal pos
        if not item():
            return False
        while pos < len(text) and text[pos] in ops:
            pos += 1
            if not item():
                return False
        return True

    def expr():
        return chain(lambda: chain(factor, "*/"), "+-")

    return expr() and pos == len(text)


def _compile(grammar: str):
    tok = shipped_tokenizer()
    return compile_structured_output({"grammar": grammar}, tok)


def test_recursive_rules_stay_symbols_and_the_rest_is_inlined():
    symbols, _ = lower(JSON)
    assert symbols == ["root", "value", "object", "array"]          # string and number are regular: inlined
    symbols, _ = lower('root ::= item+\nitem ::= "a" | "b"')
    assert symbols == ["root"]


def test_the_arithmetic_language_is_exact_on_random_strings():
    g = _compile(ARITH)
    rng = random.Random(0)
    texts = ["1+2", "(1+2)*3", "((4))", "7/(8-9)*((1))", "(1+", "1+)", "", "()", "1++2", "(((((((((1)))))))))"]
    texts += ["".join(rng.choice("0123()+*") for _ in range(rng.randint(0, 12))) for _ in range(3000)]
    wrong = [t for t in texts if g.matches(t) != _arith(t)]
    assert not wrong, wrong[:5]
    assert sum(_arith(t) for t in texts) > 100                      # the sample holds valid texts too


def test_the_json_language_agrees_with_json_loads():
    g = _compile(JSON)
    good = ['{"a":[1,2,{"b":null}]}', "[[[]]]", '"x"', "-0.5e+3", '{"k":"\\u00e9\\n"}', "[true,false,null]"]
    bad = ['{"a":}', "[1,]", "01", '{"a" 1}', "[[]", '"\x01"', "nul"]
    assert all(g.matches(t) for t in good) and not any(g.matches(t) for t in bad)
    for t in good:
        json.loads(t)


@pytest.mark.parametrize("grammar, error", [
    ("expr ::= \"a\"", "start rule 'root"),
    ("root ::= item", "refers to 'item', which is not defined"),
    ("root ::= root \"a\" | \"b\"", "left-recursive"),
    ("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"", "left-recursive"),
    ("root ::= a\na ::= c a \"y\" | \"x\"\nc ::= d\nd ::= \"(\" c \")\" | \"\"", "left-recursive"),  # c empty via d
    ("root ::= \"\\q\"", "unknown escape"),
    ("root ::= \"a\"{5,2}", "repetition"),
    ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
    ("root ::= (\"a\"", "missing ')'"),
    ("root ::= ", "empty body"),
])
def test_bad_grammars_are_refused_naming_the_problem(grammar, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        normalize_spec({"grammar": grammar})


def test_grammar_spec_types_and_options_are_checked():
    with pytest.raises(TypeError, match="structured_output\\['grammar'\\] must be"):
        normalize_spec({"grammar": 3})
    for value in ("yes", 0, None, "", []):                  # falsy values are not a quiet "off"
        with pytest.raises(TypeError, match="fit_max_tokens"):
            normalize_spec({"grammar": ARITH, "fit_max_tokens": value})
    with pytest.raises(ValueError, match="matches no string"):   # a surrogate has no UTF-8: no text has it
        normalize_spec({"grammar": 'root ::= "\\uD800"'})


def test_masks_equal_the_brute_force_walk_of_every_token():
    """The cached fast path (top-frame masks + walking the rest) allows exactly the tokens whose bytes
    some stack can read."""
    g = _compile(ARITH)
    rng = random.Random(1)
    state = g.initial_state()
    for _ in range(12):
        fast = g.allowed_token_mask(state)
        slow = torch.tensor([bool(t) and bool(g._walk(g._states[state], t)) for t in g.tokens])
        slow[g.eos_token_id] = g.is_accepting(state)
        assert torch.equal(fast, slow)
        choices = torch.nonzero(fast).flatten().tolist()
        token = rng.choice([c for c in choices if c != g.eos_token_id] or choices)
        if token == g.eos_token_id:
            break
        state = g.advance(state, token)


@pytest.mark.parametrize("grammar, opener", [
    ('root ::= a\na ::= "(" a ")" | "ABCDEFGHIJKLMNOP"', "("),     # the innermost text is 16 bytes long
    (ARITH, "("),
], ids=["deep-text", "arithmetic"])
def test_no_state_is_a_dead_end_at_the_stack_limit(grammar, opener):
    """At MAX_STACK frames a bracket whose contents would need one more frame is refused, so every
    reachable state can still be completed: the mask is never empty and the distance stays finite."""
    from labsupport.structured.pushdown import MAX_STACK
    g = _compile(grammar)
    tok = g.tokens.index(opener.encode())
    state, opened, text = g.initial_state(), 0, b""
    while g.allowed_token_mask(state)[tok]:
        state = g.advance(state, tok)
        opened += 1
        text += g.tokens[tok]
        assert opened < 2 * MAX_STACK, "the stack limit never bit"
    # root, then one frame per bracket (ARITH: expr, term, factor per level) — deep up to the limit
    depth = max(len(s) for s in g.stacks(state))
    assert MAX_STACK - 3 <= depth <= MAX_STACK
    slow = torch.tensor([bool(t) and bool(g._walk(g._states[state], t)) for t in g.tokens])
    slow[g.eos_token_id] = g.is_accepting(state)
    assert torch.equal(g.allowed_token_mask(state), slow)
    steps = 0
    while not g.is_accepting(state):                   # close every bracket, never stuck on the way
        mask = g.allowed_token_mask(state)
        assert mask.any() and g.tokens_to_finish(state) < float("inf")
        token = int(g._token_reach(state).argmin())
        state = g.advance(state, token)
        text += g.tokens[token]
        steps += 1
        assert steps <= 40 * MAX_STACK
    assert g.matches(text.decode())


def test_a_grammar_that_matches_nothing_or_is_too_ambiguous_is_refused():
    with pytest.raises(ValueError, match="matches no string at all"):
        _compile('root ::= a\na ::= "(" a ")"')
    g = _compile('root ::= a\na ::= "x" a a | ""')      # x^n has a Catalan number of parses
    x, state = g.tokens.index(b"x"), g.initial_state()
    with pytest.raises(ValueError, match="too ambiguous.*MAX_STACKS=1024"):
        for _ in range(20):
            state = g.advance(state, x)
            g.allowed_token_mask(state)


def test_the_budget_mask_never_allows_what_the_grammar_refuses():
    tok = shipped_tokenizer()
    g = compile_structured_output({"grammar": 'root ::= a\na ::= "(" a ")" | "x"', "fit_max_tokens": True}, tok)
    state = g.advance(g.advance(g.initial_state(), g.tokens.index(b"(")), g.tokens.index(b"("))
    base = g.allowed_token_mask(state)
    for left in range(6):
        mask = g.allowed_token_mask(state, left)
        assert mask.any() and not (mask & ~base).any(), left
    assert int(g.allowed_token_mask(state, 0).sum()) < int(base.sum())
    with pytest.raises(TypeError, match="tokens_left"):
        g.allowed_token_mask(state, True)
    with pytest.raises(ValueError, match="tokens_left must be an integer >= 0, got -1"):
        g.allowed_token_mask(state, -1)


@pytest.mark.parametrize("grammar", [ARITH, JSON], ids=["arithmetic", "json"])
def test_masks_equal_xgrammars_on_random_walks(grammar):
    xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install xgrammar)")
    tok = shipped_tokenizer()
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))).compile_grammar(grammar)
    ours = _compile(grammar)
    from labsupport.structured.token_index import token_bytes
    has_ed = torch.tensor([t is not None and 0xED in t for t in token_bytes(tok, len(tok))])  # see test_structured
    rng = random.Random(2)
    compared = 0
    for _ in range(6):
        matcher, state = xgr.GrammarMatcher(compiled), ours.initial_state()
        for _ in range(24):
            bitmask = xgr.allocate_token_bitmask(1, len(tok))
            matcher.fill_next_token_bitmask(bitmask)
            theirs = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:len(tok)].bool()
            mine = ours.allowed_token_mask(state)
            assert torch.equal(mine, theirs), (f"ours-only {torch.nonzero(mine & ~theirs).flatten()[:8].tolist()}, "
                                               f"xgrammar-only {torch.nonzero(theirs & ~mine).flatten()[:8].tolist()}")
            compared += 1
            token = rng.choice(torch.nonzero(mine & ~has_ed).flatten().tolist())
            if token == ours.eos_token_id:
                break
            state = ours.advance(state, token)
            assert matcher.accept_token(token)
    assert compared >= 30


def test_outputs_parse_through_generate_the_engine_and_the_speculative_engine(tiny_lm):
    from labsupport.models import load_model
    from labsupport.speculative import NgramProposer, SpeculativeEngine
    lm = load_model("tiny-gpt2", device="cpu")
    for grammar, check in ((ARITH, _arith), (JSON, lambda t: isinstance(json.loads(t), (dict, list, str, int, float,
                                                                                        bool, type(None))))):
        spec, stopped = {"grammar": grammar}, 0
        params = [SamplingParams(temperature=0.0, max_tokens=48, structured_output=spec)] + \
            [SamplingParams(temperature=1.0, seed=s, max_tokens=48, structured_output=spec) for s in range(4)]
        for p in params:
            out = generate(lm, "x = ", p, record=False)
            if out.finish_reason == "stop":
                assert check(out.text), out.text
                stopped += 1
            else:                                                 # cut at max_tokens: a prefix of a valid text
                assert out.finish_reason == "length"
        engine = LLMEngine(lm, block_size=4, num_blocks=256)
        outs = engine.generate(["x = ", "y = ", "data = "], params[1])
        spec_outs = SpeculativeEngine(lm, NgramProposer(3), block_size=4).generate(["x = "], params[0])
        greedy = generate(lm, "x = ", params[0], record=False)
        assert spec_outs[0].token_ids == greedy.token_ids          # speculation keeps greedy's tokens under the grammar
        for o in outs + spec_outs:
            if o.finish_reason == "stop":
                assert check(o.text), o.text
                stopped += 1
        assert stopped >= 1, f"no output of {grammar[:30]!r}… stopped: the parse check never ran"


TREE = {"$defs": {"node": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                       "maxItems": 2}},
                           "required": ["name"]}},
        "$ref": "#/$defs/node"}
ANY = {"type": "object", "properties": {"id": {"type": "integer"}, "extra": True}, "required": ["id"]}


def test_recursive_schemas_take_the_pushdown_path_and_the_dfa_path_still_refuses_them():
    from labsupport.structured import schema_to_tree
    from labsupport.structured.json_schema import schema_to_rules
    assert schema_to_rules(TREE)[0] == ["root", "#/$defs/node"] and schema_to_rules(ANY)[0] == ["root", "$any"]
    assert schema_to_rules({"type": "integer"})[0] == ["root"]           # no recursion: the DFA path as before
    for schema, keyword in ((TREE, "$ref"), (ANY, "true")):
        with pytest.raises(ValueError, match=re.escape(repr(keyword))):
            schema_to_tree(schema)
    tok = shipped_tokenizer()
    assert type(compile_structured_output({"json": TREE}, tok)).__name__ == "PushdownOutput"
    beside = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n", "maxItems": 1}}}, "$ref": "#/$defs/n"}
    with pytest.raises(ValueError, match="only a bare recursive"):
        normalize_spec({"json": beside})


@pytest.mark.parametrize("schema", [TREE, ANY], ids=["tree", "any-value"])
def test_recursive_schemas_are_exact_on_cases_and_sound_on_random_walks(schema):
    import jsonschema
    tok = shipped_tokenizer()
    g = compile_structured_output({"json": schema}, tok)
    valid = [{"name": "a", "children": [{"name": "b", "children": []}, {"name": ""}]}] if schema is TREE else \
        [{"id": 3, "extra": {"x": [1, {"y": None}], "z": "w"}}, {"id": -1}, {"extra": [[[]]], "id": 0}]
    invalid = [{"name": "toolongname"}, {"children": []}, {"name": "a", "children": [{}]}] if schema is TREE else \
        [{"extra": 1}, {"id": 1.5}]
    for v in valid:
        jsonschema.validate(v, schema)
        assert g.matches(json.dumps(v, separators=(",", ":")))
    for v in invalid:
        assert not g.matches(json.dumps(v, separators=(",", ":")))
    rng = random.Random(4)
    finished = 0
    for _ in range(20):                                   # random allowed tokens until EOS
        state, ids = g.initial_state(), []
        for _ in range(60):
            allowed = torch.nonzero(g.allowed_token_mask(state)).flatten().tolist()
            eos = g.eos_token_id in allowed
            token = g.eos_token_id if eos and rng.random() < 0.3 else rng.choice([a for a in allowed if a != g.eos_token_id] or allowed)
            if token == g.eos_token_id:
                jsonschema.validate(json.loads(tok.decode(ids)), schema)
                finished += 1
                break
            ids.append(token)
            state = g.advance(state, token)
    assert finished >= 5


def _shortest_by_bytes(g, limit: int = 40) -> int:
    """The shortest complete text in bytes, by breadth-first search over the matcher's stack sets
    (each byte one step) — independent of the distance tables under test."""
    frontier, seen = [g._states[g.initial_state()]], set()
    for n in range(limit):
        if any(g._accepts(s) for s in frontier):
            return n
        nxt = []
        for stacks in frontier:
            for b in range(32, 127):
                after = g.step(stacks, b)
                if after and after not in seen:
                    seen.add(after)
                    nxt.append(after)
        frontier = nxt
    raise AssertionError("no complete text within the limit")


@pytest.mark.parametrize("spec", [{"grammar": ARITH}, {"grammar": JSON}, {"json": TREE}, {"json": ANY}],
                         ids=["arithmetic", "json-grammar", "tree", "any-value"])
def test_the_distance_to_a_complete_output_is_the_shortest_completion(spec):
    tok = shipped_tokenizer()
    g = compile_structured_output(spec, tok)
    d0 = g.tokens_to_finish(g.initial_state())
    assert d0 == _shortest_by_bytes(g)
    # along a real text the distance is what is left of the shortest completion from there
    text = {"arithmetic": "(1+2)*(", "json-grammar": '{"a":[1,{"b":', "tree": '{"name":"a","children":[{',
            "any-value": '{"id":1,"extra":[['}
    key = next(k for k, v in {"arithmetic": ARITH, "json-grammar": JSON}.items() if spec.get("grammar") == v) \
        if "grammar" in spec else ("tree" if spec["json"] is TREE else "any-value")
    stacks = g._walk(g._states[g.initial_state()], text[key].encode())
    close = {"arithmetic": "1)", "json-grammar": "1}]}", "tree": '"name":""}]}', "any-value": "]]}"}[key]
    assert g._stacks_distance(stacks) == len(close)
    assert g._accepts(g._walk(stacks, close.encode()))


@pytest.mark.parametrize("spec", [{"grammar": ARITH}, {"json": TREE}], ids=["arithmetic", "tree"])
def test_fit_max_tokens_completes_every_sampled_output_on_the_pushdown_path(tiny_lm, spec):
    fit = dict(spec, fit_max_tokens=True)
    g = compile_structured_output(fit, tiny_lm.tokenizer, vocab_size=tiny_lm.model.config.vocab_size,
                                  eos_token_id=tiny_lm.eos_token_id)
    shortest = int(g.tokens_to_finish(g.initial_state()))
    complete = {False: 0, True: 0}
    for budget in (shortest + 1, shortest + 4, 24):
        for seed in range(6):
            for on in (False, True):
                params = SamplingParams(temperature=1.0, seed=seed, max_tokens=budget,
                                        structured_output=fit if on else spec)
                out = generate(tiny_lm, "x = (", params, record=False)
                ok = out.finish_reason == "stop" and g.is_accepting(g.state_after(out.token_ids[:-1]))
                if on:
                    assert ok, (budget, seed, out.text, out.finish_reason)
                    assert len(out.token_ids) <= budget
                complete[on] += ok
    assert complete[True] == 18 and complete[False] < 18     # the plain mask is cut at max_tokens


def test_fit_max_tokens_on_the_pushdown_path_through_the_engine(tiny_lm):
    spec = {"grammar": ARITH, "fit_max_tokens": True}
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=256)
    outs = engine.generate(["x = (", "y = ", "1+"], SamplingParams(temperature=1.0, seed=2, max_tokens=6,
                                                                 structured_output=spec))
    for o in outs:
        assert o.finish_reason == "stop" and _arith(o.text), o.text


def test_the_panel_drives_the_pushdown_matcher_and_shows_its_stack(tiny_lm):
    from labsupport.bench.structured import ARITHMETIC
    from labsupport.widgets.structured import structured_lab
    panel = structured_lab(tiny_lm, {"grammar": ARITHMETIC}, "x = ", seed=0, max_complete=12, example="((1+2)*3))")
    assert "((1+2)*3))" in panel.controls["text"].placeholder
    panel.force_text("((1+2)*3))")
    assert "refused" in panel.note.value
    assert tiny_lm.decode(panel.state["out"]) == "((1+2)*3"             # the token "))" is refused: one "(" is open
    panel.update()
    assert "stack (bottom › top)" in panel.stats.value and "root" in panel.stats.value
    assert "incomplete" in panel.stats.value
    panel.force_text(")")
    panel.update()
    assert "matches ✓" in panel.stats.value                               # Python's parser agrees
    panel.reset()
    panel.force_text("((")
    panel.update()
    assert "frames" in panel.stats.value and "incomplete" in panel.stats.value
    panel.controls["temperature"].value = 0.0
    panel.controls["complete"].click()
    assert panel.note.value == ""
    with pytest.raises(TypeError, match="example"):
        structured_lab(tiny_lm, {"grammar": ARITHMETIC}, "x", example=3)


def test_stack_figure_draws_depths_and_refuses_ragged_input():
    from labsupport.viz.structured import stack_figure
    fig = stack_figure(["(", "1", ")"], [4, 7, 1], [1, 1, 0])
    assert list(fig.data[0].y) == [4, 7, 1] and list(fig.data[1].y) == [1, 1, 0]
    assert fig.layout.yaxis2.overlaying == "y"
    assert list(fig.layout.xaxis.ticktext) == ["(", "1", ")"]          # the tokens label the axis
    with pytest.raises(ValueError, match="same length, got 1, 2 and 1"):
        stack_figure(["("], [4, 7], [1])
    with pytest.raises(ValueError, match=r"depths\[1\] must be an integer >= 0, got -2"):
        stack_figure(["(", ")"], [4, -2], [1, 0])
    with pytest.raises(TypeError, match=r"brackets\[0\] must be an integer"):
        stack_figure(["("], [4], [float("nan")])


def test_the_bench_checks_arithmetic_with_pythons_parser():
    from labsupport.bench.structured import ARITHMETIC, arithmetic_ok, is_valid
    assert arithmetic_ok("(1+2)*3") and arithmetic_ok("0") and arithmetic_ok("10/(2-1)")
    for bad in ("", "1+", "(1", "1 + 2", "-1", "1.5", "f(1)", "1e3", "(1)(2)"):
        assert not arithmetic_ok(bad), bad
    assert is_valid("2*(3)", {"grammar": ARITHMETIC})
    assert not arithmetic_ok("(" * 5000 + "1" + ")" * 5000)   # deeper than Python's parser goes: not a crash
    assert not any(arithmetic_ok(t) for t in ("00", "0+00", "(007)"))   # Python reads "00"; the grammar does not
    assert arithmetic_ok("1" * 5000 + "+0")                   # more digits than Python's int() limit
    with pytest.raises(ValueError, match="no independent check"):
        is_valid("a", {"grammar": 'root ::= "a"'})
    # JSON as RFC 8259 has it, not Python's json: no NaN/Infinity, no key twice
    number = {"json": {"type": "number"}}
    assert is_valid("1.5", number)
    assert not any(is_valid(t, number) for t in ("NaN", "Infinity", "-Infinity"))
    assert not is_valid('{"a":1,"a":2}', {"json": {"type": "object"}})
    assert is_valid('{"a":1,"b":{"a":2}}', {"json": {"type": "object"}})


def test_the_bench_measures_grammar_steps_and_agrees_with_xgrammar_on_the_pushdown_specs(tiny_lm):
    from labsupport.bench import structured as bench
    spec = bench.SPECS["arithmetic (EBNF)"][0]
    runs = [tiny_lm.encode(t) for t in ("(1+2)*3", "10/(2-0)", "7")]
    at8 = bench.batch_mask_step_seconds(tiny_lm, spec, runs, batch=8, repeats=2)
    assert len(at8) == 2 and all(s > 0 for s in at8)
    for kwargs, error in (({"batch": 0}, "batch must be an integer >= 1, got 0"),
                          ({"repeats": 0}, "repeats must be an integer >= 1, got 0")):
        with pytest.raises(ValueError, match=error):
            bench.batch_mask_step_seconds(tiny_lm, spec, runs, **kwargs)
    with pytest.raises(TypeError, match="batch must be an integer"):
        bench.batch_mask_step_seconds(tiny_lm, spec, runs, batch=2.0)
    with pytest.raises(ValueError, match="token_runs must hold"):
        bench.batch_mask_step_seconds(tiny_lm, spec, [[]])
    pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install xgrammar)")
    for name, texts in (("arithmetic (EBNF)", ("(1+2)*3", "10/(2-0)")),
                        ("tree (recursive)", ('{"name":"a","children":[{"name":"b","children":[]}]}',))):
        equal, compared = bench.mask_agreement(tiny_lm, bench.SPECS[name][0], [tiny_lm.encode(t) for t in texts])
        assert compared >= 5 and equal == compared, name
    equal, compared = bench.mask_agreement(tiny_lm, {"json": bench.PERSON},
                                           [tiny_lm.encode('{"name":"Al","age":3,"student":true}')])
    assert equal < compared            # any order, each key once (ours) vs XGrammar's repeatable any_order


class _FailsAfter:
    """A real compiled grammar whose mask raises once ``done`` tokens of ``max_tokens`` are made, as a
    too-ambiguous pushdown grammar does mid-output (``tokens_left`` tells how far the output is)."""

    def __init__(self, grammar, max_tokens: int, done: int):
        self.grammar, self.limit = grammar, max_tokens - done

    def __getattr__(self, name):
        return getattr(self.grammar, name)

    def allowed_token_mask(self, state, tokens_left=None):
        if tokens_left is not None and tokens_left <= self.limit:
            raise ValueError("the grammar is too ambiguous to match (a test double)")
        return self.grammar.allowed_token_mask(state, tokens_left)


@pytest.mark.parametrize("kind", ["engine", "speculative"])
def test_a_grammar_that_fails_mid_output_ends_its_own_request_only(tiny_lm, kind):
    """An error in one request's grammar ends that request with finish_reason "error" and the
    message; the others finish, no block is left held, and the engine takes new requests."""
    from labsupport.speculative import NgramProposer, SpeculativeEngine
    spec = {"grammar": ARITH}
    params = SamplingParams(temperature=0.0, max_tokens=12, structured_output=spec)
    eng = LLMEngine(tiny_lm, block_size=4, num_blocks=64) if kind == "engine" else \
        SpeculativeEngine(tiny_lm, NgramProposer(3), block_size=4, num_blocks=64)
    free = eng.block_manager.num_free_blocks
    bad = eng.add_request("x = (", params)
    good = eng.add_request("y = (", params)
    eng.requests[bad].grammar = _FailsAfter(eng.requests[bad].grammar, 12, done=3)
    outs = {o.request_id: o for o in eng.run()}
    assert outs[bad].finish_reason == "error" and "too ambiguous" in outs[bad].error
    assert "structured output" in outs[bad].error and len(outs[bad].token_ids) == 3
    assert outs[good].finish_reason in ("stop", "length") and len(outs[good].token_ids) >= 3
    assert not eng.has_unfinished_requests() and eng.block_manager.num_free_blocks == free
    again = eng.generate(["z = ("], params)
    assert again[0].finish_reason in ("stop", "length")


def test_a_grammar_is_compiled_to_automata_once_for_its_check_and_its_tokenizer():
    """SamplingParams checks a grammar, the engine compiles it later: the same DFAs serve both."""
    from labsupport.structured.pushdown import compile_rules
    text = ARITH + "\n# a comment makes this text new to the cache\n"
    symbols, dfas = compile_rules(text)
    SamplingParams(structured_output={"grammar": text})
    g = _compile(text)
    assert g.symbols == list(symbols) and all(a is b for a, b in zip(g.dfas, dfas))
    assert g.matches("(1+2)*3") and not g.matches("(1+2")
    with pytest.raises(TypeError, match="must be a str"):
        compile_rules(["root ::= \"a\""])
