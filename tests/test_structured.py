"""Structured output: regex / JSON Schema → byte DFA → token masks, checked against Python's
``re``, ``jsonschema`` and XGrammar (Dong et al., 2024) on the shipped 4,096-token tokenizer."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch
from helpers import shipped_tokenizer

from labsupport.generation import generate, generate_batch
from labsupport.models import SHIPPED
from labsupport.sampling import SamplingParams, probs_from_logits
from labsupport.structured import (
    MAX_ANY_ORDER_KEYS,
    apply_structured_mask,
    compile_structured_output,
    compile_tree,
    normalize_spec,
    parse_regex,
    schema_to_tree,
)
from labsupport.structured.automaton import utf8_ranges
from labsupport.structured.json_schema import integer_range

SHIPPED_PRESENT = (SHIPPED["tiny-gpt2"] / "model.safetensors").exists()

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer",
                                                                         "minimum": 0, "maximum": 120},
                         "student": {"type": "boolean"}},
          "required": ["name", "age", "student"]}
ITEMS = {"type": "object",
         "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                        "score": {"type": "number"}, "note": {"type": "null"}},
         "required": ["tags"]}


# ----------------------------------------------------------------------------- the automaton

@pytest.mark.parametrize("pattern", [r"\d{4}-\d{2}-\d{2}", r"(ab|cd)*e?", r"[^a-c]+x", r"colou?r|gr[ae]y",
                                     r"-?(0|[1-9]\d*)(\.\d+)?", r"[A-Z][a-z]{0,3}\s\w"])
def test_regex_dfa_agrees_with_python_re(pattern):
    dfa = compile_tree(parse_regex(pattern))
    rng = random.Random(0)
    alphabet = "abcdexyz0129-.AZ é"
    samples = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(3000)]
    samples += ["2024-01-31", "abcde", "color", "grey", "-0.5", "Ab 1", "éx", "dx"]
    mismatches = [s for s in samples if dfa.matches(s) != bool(re.fullmatch(pattern, s))]
    assert mismatches == []
    assert any(dfa.matches(s) for s in samples)


def test_utf8_ranges_cover_exactly_the_code_points():
    rng = random.Random(1)
    for lo, hi in [(0x41, 0xE9), (0x7F, 0x800), (0xFFF0, 0x10010), (0x20, 0x10FFFF)]:
        seqs = utf8_ranges(lo, hi)
        probes = {lo, hi, lo - 1, hi + 1} | {rng.randint(max(0, lo - 50), min(0x10FFFF, hi + 50)) for _ in range(300)}
        for cp in probes:
            if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                continue
            enc = chr(cp).encode()
            hit = sum(len(s) == len(enc) and all(a <= b <= c for (a, c), b in zip(s, enc)) for s in seqs)
            assert hit == (1 if lo <= cp <= hi else 0), hex(cp)


def test_integer_range_matches_exactly_the_integers():
    for lo, hi in [(0, 255), (-37, 1205), (-500, -3), (7, 7)]:
        dfa = compile_tree(integer_range(lo, hi))
        assert [i for i in range(-1500, 1500) if dfa.matches(str(i))] == list(range(lo, hi + 1))
        assert not dfa.matches("007") and not dfa.matches("-0")
    # 14-digit bounds: the full-width middle digits are one repetition, not a split on both sides
    # (which took 2^n calls and overflowed the automaton limit at 10^13)
    lo, hi = -10 ** 13 - 7, 10 ** 14 - 1
    dfa = compile_tree(integer_range(lo, hi))
    probes = [lo - 1, lo, lo + 1, -10 ** 13, -1, 0, 1, 10 ** 13, 99999999999999, hi, hi + 1, 10 ** 14 + 5]
    assert [i for i in probes if dfa.matches(str(i))] == [i for i in probes if lo <= i <= hi]
    assert dfa.num_states < 100


def test_json_keys_in_any_order_once_each_all_required():
    dfa = compile_tree(schema_to_tree(PERSON))
    good = [{"name": "a", "age": 3, "student": True}, {"student": False, "name": "", "age": 120},
            {"age": 0, "student": True, "name": "xy"}]
    for obj in good:
        assert dfa.matches(json.dumps(obj, separators=(",", ":")))
    assert not dfa.matches('{"name":"a","age":3}')                                 # missing required
    assert not dfa.matches('{"name":"a","age":3,"student":true,"age":4}')          # duplicate key
    assert not dfa.matches('{"name":"a","age":121,"student":true}')                # above maximum
    assert not dfa.matches('{"name":"a", "age":3,"student":true}')                 # whitespace 0
    fixed = compile_tree(schema_to_tree(PERSON, any_order=False))
    assert fixed.matches('{"name":"a","age":3,"student":true}')
    assert not fixed.matches('{"age":3,"name":"a","student":true}')


def test_whitespace_is_bounded():
    dfa = compile_tree(schema_to_tree(ITEMS, whitespace=2))
    assert dfa.matches('{ "tags" : [ "red",\n"blue" ] }')
    assert dfa.matches('{"tags":[],"note":null,"score":-1.5e3}')
    assert not dfa.matches('{   "tags":[]}')                                       # 3 spaces > 2
    assert not dfa.matches('{"tags":["red","red","red","red"]}')                   # maxItems 3


@pytest.mark.parametrize("schema, keyword", [
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "oneOf"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"$ref": "#/defs/x"}, "$ref"),
    ({"type": ["string", "string"]}, "type"),
    ({"type": "string", "format": "hostname"}, "format"),
    ({"type": "string", "pattern": "a.b"}, "pattern"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "maximum"),
    ({"type": "number", "minimum": 0.5, "maximum": 0.25}, "maximum"),
    ({"type": "number", "multipleOf": 0.01}, "multipleOf"),
    ({"type": "string", "not": {"const": "a"}}, "not"),
    ({"type": "number", "not": {"type": "integer"}}, "not"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "string", "enum": [1, 2]}, "enum"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
    ({"type": "object", "properties": {"a": False}}, "false"),
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"], "maxProperties": 0},
     "maxProperties"),
    ({"type": "object", "additionalProperties": {"type": "null"}, "minProperties": -1}, "minProperties"),
    ({"type": "object", "patternProperties": {"^a": {"type": "null"}, "b$": {"type": "boolean"}}}, "patternProperties"),
    ({"type": "object", "patternProperties": ["^a"]}, "patternProperties"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"minLength": 3}, "minLength"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "required"),
    ({"type": "object", "properties": {}, "additionalProperties": True}, "additionalProperties"),
    ({"type": "array"}, "items"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "maxLength"),
])
def test_unsupported_or_bad_schemas_raise_naming_the_keyword(schema, keyword):
    with pytest.raises(ValueError, match=re.escape(repr(keyword))):
        normalize_spec({"json": schema})


def test_too_many_any_order_keys_raise_and_fixed_order_works():
    n = MAX_ANY_ORDER_KEYS + 1
    schema = {"type": "object", "properties": {f"k{i}": {"type": "boolean"} for i in range(n)},
              "required": [f"k{i}" for i in range(n)]}
    tok = shipped_tokenizer()
    with pytest.raises(ValueError, match=f"at most {MAX_ANY_ORDER_KEYS} keys"):
        compile_structured_output({"json": schema}, tok)
    g = compile_structured_output({"json": schema, "any_order": False}, tok)
    assert g.matches(json.dumps({f"k{i}": True for i in range(n)}, separators=(",", ":")))


@pytest.mark.parametrize("spec, error", [
    ("not a dict", TypeError), ({"regex": 5}, TypeError), ({"regex": "a(b"}, ValueError),
    ({"regex": r"(a)\1"}, ValueError), ({"choice": []}, ValueError), ({"choice": ["a", 1]}, TypeError),
    ({"regex": "a", "choice": ["a"]}, ValueError), ({"json": PERSON, "whitespace": 9}, ValueError),
    ({"json": PERSON, "whitespace": True}, TypeError), ({"regex": "a", "whitespace": 1}, ValueError),
])
def test_bad_specs_raise(spec, error):
    with pytest.raises(error):
        SamplingParams(structured_output=spec)


def test_structured_output_refuses_ignore_eos_and_min_tokens():
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(structured_output={"regex": "a+"}, ignore_eos=True)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(structured_output={"regex": "a+"}, min_tokens=2)


# ----------------------------------------------------------------------------- token masks

def test_token_boundary_tokens_cross_grammar_pieces():
    tok = shipped_tokenizer()
    g = compile_structured_output({"json": PERSON}, tok)
    vocab = tok.get_vocab()
    s = g.initial_state()
    allowed = set(torch.nonzero(g.allowed_token_mask(s)).flatten().tolist())
    assert vocab["{"] in allowed
    assert vocab.get('{"') is None or vocab['{"'] in allowed        # brace + quote in one token
    assert tok.eos_token_id not in allowed and not g.is_accepting(s)
    text = '{"name":"Ann","age":7,"student":true}'
    ids = tok.encode(text)
    final = g.state_after(ids)
    assert g.is_accepting(final) and g.is_terminal(final)
    assert g.allowed_token_mask(final)[tok.eos_token_id]
    step = s
    for t in ids:                                              # replay == step by step
        assert g.allowed_token_mask(step)[t]
        step = g.advance(step, t)
    assert step == final
    with pytest.raises(ValueError, match="not allowed"):
        g.advance(s, vocab["a"])


def test_masked_tokens_get_probability_exactly_zero():
    g = compile_structured_output({"choice": ["yes", "no"]}, shipped_tokenizer())
    mask = g.allowed_token_mask(0)
    logits = torch.randn(2, mask.shape[0], generator=torch.Generator().manual_seed(0))
    for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=5.0)):
        probs = probs_from_logits(logits, params, allowed=mask)
        assert (probs[:, ~mask] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(2))
    masked = apply_structured_mask(logits, mask)
    assert torch.isneginf(masked[:, ~mask]).all() and torch.equal(masked[:, mask], logits[:, mask])
    with pytest.raises(ValueError, match="at least one"):
        apply_structured_mask(logits, torch.zeros_like(mask))
    with pytest.raises(TypeError):
        apply_structured_mask(logits, mask.int())


def test_compiled_grammars_are_cached_per_tokenizer_and_spec():
    tok = shipped_tokenizer()
    a = compile_structured_output({"json": PERSON}, tok)
    assert compile_structured_output(dict(PERSON), tok) is a          # bare schema == {"json": ...}
    assert compile_structured_output({"json": PERSON, "whitespace": 1}, tok) is not a


# ----------------------------------------------------------------------------- XGrammar peer

def _xgr_setup():
    xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install xgrammar)")
    tok = shipped_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    return xgr, tok, xgr.GrammarCompiler(info)


def _xgr_mask(xgr, matcher, vocab):
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bitmask)
    bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab].bool()


def _walks(xgr, ours, compiled, n_walks, rng, max_steps=32, relation="equal"):
    """Random walks over allowed tokens; compare the two allowed sets at every state.

    The walks never *choose* a token holding byte 0xED: after it XGrammar also allows
    0xA0-0xBF, i.e. UTF-8-encoded surrogates (U+D800-U+DFFF), which are not valid UTF-8; ours
    does not (the one documented difference, pinned in its own test below).
    """
    vocab = ours.vocab_size
    from labsupport.structured.token_index import token_bytes
    has_ed = torch.tensor([t is not None and 0xED in t for t in token_bytes(shipped_tokenizer(), vocab)])
    compared = strict = 0
    for _ in range(n_walks):
        matcher, state = xgr.GrammarMatcher(compiled), ours.initial_state()
        for _ in range(max_steps):
            a, b = ours.allowed_token_mask(state), _xgr_mask(xgr, matcher, vocab)
            compared += 1
            if relation == "equal":
                assert torch.equal(a, b), f"state {state}: ours-only {torch.nonzero(a & ~b).flatten()[:8].tolist()}, " \
                                          f"xgrammar-only {torch.nonzero(b & ~a).flatten()[:8].tolist()}"
            else:
                assert not (a & ~b).any()
                strict += int(not torch.equal(a, b))
            token = rng.choice(torch.nonzero(a & ~has_ed).flatten().tolist())
            if token == ours.eos_token_id:
                break
            state = ours.advance(state, token)
            assert matcher.accept_token(token)
    return compared, strict


PEER_SCHEMAS = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]}, 0),
    ({"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"},
                                       "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["ok"]}, 0),
    ({"type": "object", "properties": {"kind": {"enum": ["cat", "dog", 3]}, "n": {"type": "null"},
                                       "inner": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                 "required": ["x"]}},
      "required": ["kind", "inner"]}, 2),
    ({"type": "array", "items": {"type": "integer", "minimum": -20, "maximum": 300}}, 1),
]


@pytest.mark.parametrize("schema, ws", PEER_SCHEMAS)
def test_allowed_sets_equal_xgrammar_json_schema(schema, ws):
    xgr, tok, compiler = _xgr_setup()
    ours = compile_structured_output({"json": schema, "whitespace": ws, "any_order": False}, tok)
    opts = {"any_whitespace": False, "separators": (",", ":")} if ws == 0 else \
        {"any_whitespace": True, "max_whitespace_cnt": ws}
    compiled = compiler.compile_json_schema(schema, strict_mode=True, any_order=False, **opts)
    compared, _ = _walks(xgr, ours, compiled, 250, random.Random(0))
    assert compared >= 1000


@pytest.mark.parametrize("pattern", [r"\d{4}-\d{2}-\d{2}", r"(yes|no|maybe)", r"[a-z]+@[a-z]+\.(com|org)",
                                     r"The (cat|dog) sat\."])
def test_allowed_sets_equal_xgrammar_regex(pattern):
    xgr, tok, compiler = _xgr_setup()
    ours = compile_structured_output({"regex": pattern}, tok)
    compared, _ = _walks(xgr, ours, compiler.compile_regex(pattern), 60, random.Random(1))
    assert compared >= 100


def test_surrogate_bytes_are_the_documented_difference():
    xgr, tok, compiler = _xgr_setup()
    schema = {"type": "string"}
    ours = compile_structured_output({"json": schema}, tok)
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=False))
    from labsupport.structured.token_index import token_bytes
    quote = tok.get_vocab()['"']
    state = ours.advance(0, quote)
    assert matcher.accept_token(quote)
    byte_id = {t: i for i, t in enumerate(token_bytes(tok)) if t is not None and len(t) == 1}
    state = ours.advance(state, byte_id[b"\xed"])
    assert matcher.accept_token(byte_id[b"\xed"])
    a, b = ours.allowed_token_mask(state), _xgr_mask(xgr, matcher, ours.vocab_size)
    extra = {bytes(token_bytes(tok)[i]) for i in torch.nonzero(b & ~a).flatten().tolist()}
    assert not (a & ~b).any() and extra and all(0xA0 <= t[0] <= 0xBF for t in extra)


def test_any_order_is_stricter_than_xgrammar_any_order():
    """XGrammar's any_order writes `{item (, item)*}`: it allows duplicate and missing keys.
    Ours is a subset of it at every state, and strictly smaller at some."""
    xgr, tok, compiler = _xgr_setup()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"]}
    ours = compile_structured_output({"json": schema}, tok)
    compiled = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"), any_order=True)
    compared, strict = _walks(xgr, ours, compiled, 200, random.Random(2), relation="subset")
    assert compared >= 500 and strict > 0


# ----------------------------------------------------------------------------- generation

@pytest.mark.skipif(not SHIPPED_PRESENT, reason="shipped models not built yet")
@pytest.mark.parametrize("schema", [PERSON, ITEMS])
def test_every_generated_output_validates(schema):
    from labsupport.models import load_model
    lm = load_model("tiny-gpt2", device="cpu")
    params = SamplingParams(temperature=1.0, max_tokens=120, structured_output={"json": schema})
    grammar = compile_structured_output({"json": schema}, lm.tokenizer)
    singles = [generate(lm, "Answer in JSON: ", params.replace(seed=seed), record=False) for seed in range(8)]
    batch = generate_batch(lm, ["A:", "JSON please:", "x"], params.replace(seed=5))
    # Without a token budget in the grammar a sampled output can be cut by max_tokens: then it is an
    # unfinished prefix (never a finished-but-invalid one); most of them finish.
    assert sum(res.finish_reason == "stop" for res in singles) >= 6
    for res in singles + batch:
        if res.finish_reason == "stop":
            assert res.token_ids[-1] == lm.eos_token_id
            jsonschema.validate(json.loads(res.text), schema)
        else:                              # cut by max_tokens: still a prefix the grammar can finish
            assert not grammar.is_accepting(grammar.state_after(res.token_ids))
    assert any(res.finish_reason == "stop" for res in batch)


def test_generate_with_choice_and_records_on_random_model(tiny_lm):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10, structured_output={"choice": ["alpha", "beta"]})
    res = generate(tiny_lm, "Pick:", params)
    assert res.text in ("alpha", "beta")
    assert all(s.prob > 0 for s in res.steps)


def test_speculative_decoding_keeps_structured_output(tiny_lm):
    """The grammar masks the target's verification: a draft outside it is rejected, so the output is
    the grammar's on both speculative paths, and greedy output equals plain greedy's."""
    from labsupport.speculative import NgramProposer, SelfSpecProposer, SpeculativeEngine, speculative_generate
    params = SamplingParams(temperature=0.0, max_tokens=8, structured_output={"regex": "[0-9]+"})
    prompt = [4, 4, 4, 4]
    want = generate(tiny_lm, prompt, params, record=False)
    got = speculative_generate(tiny_lm, NgramProposer(3), prompt, params)
    assert (got.token_ids, got.text) == (want.token_ids, want.text) and want.text.isdigit()
    out = SpeculativeEngine(tiny_lm, SelfSpecProposer(1, 3), block_size=4).generate([prompt], params)[0]
    assert (out.token_ids, out.text) == (want.token_ids, want.text)


# ----------------------------------------------------------------------------- figures and panel

def test_automaton_figure_draws_every_state_and_refuses_huge_ones():
    from labsupport.viz.structured import automaton_figure, byte_label
    dfa = compile_tree(parse_regex(r"\d{4}-\d{2}-\d{2}"))
    fig = automaton_figure(dfa.transitions, dfa.accepting, current=3)
    assert len(fig.data[0].x) == dfa.num_states
    widths = list(fig.data[0].marker.line.width)
    assert sum(w > 0 for w in widths) == int(dfa.accepting.sum())
    assert byte_label(range(48, 58)) == "0-9" and byte_label([45]) == "-"
    big = compile_tree(schema_to_tree(PERSON))
    with pytest.raises(ValueError, match="at most"):
        automaton_figure(big.transitions, big.accepting)


def test_masked_candidates_figure_marks_refused_tokens():
    from labsupport.viz.structured import ALLOWED_COLOR, REFUSED_COLOR, masked_candidates_figure
    fig = masked_candidates_figure(["a", "b", "c"], [0.5, 0.3, 0.2], [0.0, 0.6, 0.4], [False, True, True])
    allowed, refused = fig.data[1], fig.data[2]
    assert allowed.marker.color == ALLOWED_COLOR and list(allowed.y) == [None, 0.6, 0.4]   # legend swatch = bars
    assert refused.marker.color == REFUSED_COLOR and refused.y[0] == 0.0 and refused.text[0] == "0"
    assert len(masked_candidates_figure(["a"], [1.0], [1.0], [True]).data) == 2             # nothing refused
    with pytest.raises(ValueError):
        masked_candidates_figure(["a"], [0.5, 0.5], [1.0], [True])


def test_panel_refuses_duplicate_keys_and_never_raises(tiny_lm):
    from labsupport.widgets.structured import structured_lab
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "ok": {"type": "boolean"}}, "required": ["name", "ok"]}
    panel = structured_lab(tiny_lm, {"json": schema}, "x", seed=1, max_complete=30)
    assert panel.controls["temperature"].layout.width == "460px"          # wide enough to read
    visible = [b for b in panel.chips.children if b.layout.display != "none"]
    assert visible and all(b.token is not None for b in visible), "candidate chips are shown"
    panel.force_text('{"name":"Al","name"')
    assert "refused" in panel.note.value
    assert tiny_lm.decode(panel.state["out"]) == '{"name":"Al","'      # stopped before the duplicate
    panel.force_text('ok":true}')
    panel.update()
    assert panel.state["gstate"] is not None and panel.grammar.is_accepting(panel.state["gstate"])
    assert "matches the schema" in panel.stats.value
    panel.reset()
    panel.controls["grammar"].value = False
    panel.force_text("hello")
    panel.update()
    assert panel.state["gstate"] is None and "left the grammar" in panel.stats.value
    panel.reset()
    panel.controls["grammar"].value = True
    panel.chips.children[0].click()                 # a chip forces a token the grammar allows
    assert len(panel.state["out"]) == 1 and panel.state["gstate"] is not None
    panel.controls["temperature"].value = 0.0
    panel.controls["complete"].click()
    assert panel.note.value == ""                   # no error line
    with pytest.raises(ValueError):
        structured_lab(tiny_lm, {"json": schema}, "x", seed=100)


# ----------------------------------------------------------------------------- engine

ENGINE_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "bb", "ccc"]},
                                                  "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "required": ["ok", "kind", "n"]}


def _engine_outputs(lm, prompts, **engine_kw):
    from labsupport.engine import LLMEngine
    engine = LLMEngine(lm, **engine_kw)
    params = SamplingParams(temperature=1.0, max_tokens=40, structured_output={"json": ENGINE_SCHEMA})
    ids = [engine.add_request(p, params.replace(seed=10 + k)) for k, p in enumerate(prompts)]
    outs = {o.request_id: o for o in engine.run()}
    return engine, [outs[i] for i in ids]


def test_engine_structured_output_survives_preemption_and_chunked_prefill(tiny_lm):
    prompts = [[(7 * k + 3 * j) % 4000 + 5 for j in range(n)] for k, n in enumerate([9, 14, 6, 11])]
    _, roomy = _engine_outputs(tiny_lm, prompts, block_size=4, num_blocks=128)
    for o in roomy:
        assert o.finish_reason == "stop"
        jsonschema.validate(json.loads(o.text), ENGINE_SCHEMA)
    for kw in ({"num_blocks": 14, "preemption_mode": "recompute"},
               {"num_blocks": 14, "preemption_mode": "swap", "num_cpu_blocks": 64},
               {"num_blocks": 128, "enable_chunked_prefill": True, "max_prefill_chunk": 4, "max_num_batched_tokens": 8}):
        engine, outs = _engine_outputs(tiny_lm, prompts, block_size=4, **kw)
        if "preemption_mode" in kw:
            assert sum(o.metrics.num_preemptions for o in outs) > 0, kw
        assert [o.token_ids for o in outs] == [o.token_ids for o in roomy], kw      # same seeded tokens
        for o in outs:
            jsonschema.validate(json.loads(o.text), ENGINE_SCHEMA)
    for rid, req in engine.requests.items():      # the cached state is the replayed one
        assert req.grammar_state() == req.grammar.state_after(req.output_ids), rid


def test_engine_equals_generate_with_structured_output(tiny_lm):
    from labsupport.engine import LLMEngine
    params = SamplingParams(temperature=0.9, max_tokens=30, seed=4, structured_output={"json": ENGINE_SCHEMA})
    want = generate(tiny_lm, [11, 12, 13], params, record=False)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=64)
    (out,) = engine.generate([[11, 12, 13]], params)
    assert out.token_ids == want.token_ids and out.text == want.text
    greedy = SamplingParams(temperature=0.0, max_tokens=30, structured_output={"choice": ["left", "right"]})
    outs = LLMEngine(tiny_lm, block_size=4, num_blocks=64).generate([[5, 6], [7, 8, 9]], greedy.replace(n=2))
    assert all(o.text in ("left", "right") for o in outs)


def test_engine_without_tokenizer_refuses_structured_output(tiny_lm):
    from labsupport.engine import LLMEngine
    engine = LLMEngine(tiny_lm.model, block_size=4, num_blocks=16)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request([1, 2, 3], SamplingParams(structured_output={"regex": "a+"}))


def test_lab_after_eos_shows_no_stale_candidates(tiny_lm):
    from labsupport.widgets.structured import _only, structured_lab

    panel = structured_lab(tiny_lm, {"choice": ["yes", "no"]}, "Answer:", seed=0, max_complete=20)
    panel.controls["complete"].click()
    (shown,) = panel.figure.outputs
    plot = shown["data"]["application/vnd.plotly.v1+json"]
    assert plot["layout"]["title"]["text"].startswith("No more candidates") and not plot["data"]
    assert _only(1) == "only 1 token is" and _only(3) == "only 3 tokens are"


# ----------------------------------------------------------------------------- valid at max_tokens

THREE_KEYS = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "city": {"type": "string"}}, "required": ["name", "age", "city"]}


def test_tokens_to_finish_satisfies_the_bellman_equation(tiny_lm):
    g = compile_structured_output({"json": PERSON, "fit_max_tokens": True}, tiny_lm.tokenizer,
                                  vocab_size=tiny_lm.model.config.vocab_size, eos_token_id=tiny_lm.eos_token_id)
    dist = g.tokens_to_finish_all()
    assert all((dist[s] == 0) == g.is_accepting(s) for s in range(g.num_states))
    for s in range(g.num_states):
        if not g.is_accepting(s):
            row = g.index.next_rows(s)
            assert dist[s] == 1 + min(dist[t] for t in set(row.tolist()) if t >= 0)
    assert g.tokens_to_finish(0) >= len('{"name":"","age":0}') // 8        # a few tokens, not zero


@pytest.mark.skipif(not SHIPPED_PRESENT, reason="shipped models not built yet")
def test_fit_max_tokens_makes_every_sampled_output_complete():
    """9 of 20 sampled outputs of a 3-key schema at T = 1 end inside a string at max_tokens = 40 without
    the budget; with it every one is complete and validates, through generate, the engine and the
    speculative engine, for every max_tokens from the shortest completion up."""
    from labsupport.engine import LLMEngine
    from labsupport.models import load_model
    from labsupport.speculative import SpeculativeEngine
    lm = load_model("tiny-gpt2", device="cpu")
    g = compile_structured_output({"json": THREE_KEYS, "fit_max_tokens": True}, lm.tokenizer)
    shortest = int(g.tokens_to_finish(0)) + 1                              # + EOS
    plain = SamplingParams(temperature=1.0, max_tokens=40, structured_output={"json": THREE_KEYS})
    fit = plain.replace(structured_output={"json": THREE_KEYS, "fit_max_tokens": True})
    cut = [o for o in LLMEngine(lm, max_num_seqs=20).generate(["JSON: "] * 20, plain.replace(seed=1))
           if o.finish_reason == "length"]
    assert cut                                                             # the problem exists
    runs = []
    for max_tokens in (shortest, shortest + 3, 40):
        p = fit.replace(max_tokens=max_tokens)
        runs += [generate(lm, "JSON: ", p.replace(seed=s), record=False) for s in range(3)]
        eng = LLMEngine(lm, max_num_seqs=8)
        for s in range(6):
            eng.add_request("JSON: ", p.replace(seed=10 + s))
        runs += eng.run()
        spec = SpeculativeEngine(lm, {"method": "ngram", "num_speculative_tokens": 3})
        runs += spec.generate(["JSON: the name is", "JSON: "], p.replace(seed=4))
    for res in runs:
        assert res.finish_reason == "stop", (res.text, len(res.token_ids))
        jsonschema.validate(json.loads(res.text), THREE_KEYS)


def test_fit_max_tokens_changes_nothing_while_the_budget_does_not_bite(tiny_lm):
    spec = {"regex": "[ab]{3}"}
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=2, structured_output=spec)
    a = generate(tiny_lm, "x", params, record=False)
    b = generate(tiny_lm, "x", params.replace(structured_output=dict(spec, fit_max_tokens=True)), record=False)
    assert a.token_ids == b.token_ids
    with pytest.raises(TypeError, match="fit_max_tokens"):
        compile_structured_output(dict(spec, fit_max_tokens="yes"), tiny_lm.tokenizer)


def test_fit_max_tokens_below_the_shortest_completion_heads_for_the_end(tiny_lm):
    g = compile_structured_output({"json": PERSON, "fit_max_tokens": True}, tiny_lm.tokenizer,
                                  vocab_size=tiny_lm.model.config.vocab_size, eos_token_id=tiny_lm.eos_token_id)
    dist = g.tokens_to_finish_all()
    mask = g.allowed_token_mask(0, 1)                          # far too few tokens: still some allowed
    rows = g.index.next_rows(0)
    allowed = mask.nonzero().flatten().tolist()
    assert allowed and all(dist[rows[t]] == dist[rows].min(where=rows >= 0, initial=1e9) for t in allowed)


def test_xgrammars_native_warnings_are_caught_not_printed(capfd):
    """XGrammar's C++ side warns on stderr when it falls back (allOf, overlapping oneOf); in a notebook
    that is a red box mid-lesson. The peer comparison catches it at the file descriptor and keeps it."""
    pytest.importorskip("xgrammar")
    from labsupport.structured import peer

    before = len(peer.XGRAMMAR_WARNINGS)
    rows = {r.label: r for r in peer.compare()}
    out, err = capfd.readouterr()
    assert "json_schema_converter" not in err and "Warning" not in err
    caught = peer.XGRAMMAR_WARNINGS[before:]
    assert any("oneOf" in w and "anyOf" in w for w in caught), caught
    assert rows["overlapping oneOf"].xgrammar.startswith("ACCEPTS")       # the fall-back the warning announced
    with peer.captured_native_stderr() as lines:
        import os
        os.write(2, b"native line\n")
    assert lines == ["native line"] and peer.XGRAMMAR_WARNINGS[-1] == "native line"


def test_one_grammar_cursor_caches_the_state_and_replays_a_changed_output():
    """#50: the engine's requests and the speculative engine's sequences share one cursor; it starts at the
    grammar's own initial state, follows advance, and replays when the output is not the one it consumed."""
    from labsupport.structured.cursor import GrammarCursor

    tok = shipped_tokenizer()
    for spec in ({"regex": "[0-9]{1,6}"}, {"grammar": 'root ::= "(" root ")" | "1"'}):
        g = compile_structured_output(spec, tok)
        ids = tok.encode("((1))" if "grammar" in spec else "123")
        cursor = GrammarCursor(g)
        assert cursor.state_for([]) == g.initial_state() and cursor.consumed == 0
        out: list[int] = []
        for t in ids:
            cursor.advance(out, t)
            out.append(t)
            assert cursor.consumed == len(out) and cursor.state == g.state_after(out)
        child = cursor.copy()
        assert child.state_for(out) == cursor.state and child is not cursor
        assert cursor.state_for(out[:1]) == g.state_after(out[:1])          # a shorter output: replayed, not cached
        assert child.state == g.state_after(out)                             # the copy did not move with it
