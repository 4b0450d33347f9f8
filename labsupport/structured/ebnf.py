"""EBNF grammar text → one grammar tree per rule, with the recursive references left as symbols.

The notation is the GBNF / XGrammar EBNF that vLLM's ``grammar`` option takes::

    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::= factor (("*" | "/") factor)*
    factor ::= [0-9]+ | "(" expr ")"

Rules ``name ::= body``; a body has alternatives ``|``, sequences, string literals ``"..."``
(escapes ``\\n \\t \\r \\" \\\\ \\xHH \\uHHHH``), character classes ``[...]`` (as in a regular
expression), ``.`` (any character but a newline), groups ``( )``, and the postfix operators
``* + ? {m} {m,} {m,n}``; ``#`` starts a comment. ``root`` is the start rule.

A rule that is not part of a cycle of references is **inlined** where it is used: it is
regular there, and the finite automata handle it. A rule that can reach itself — the
recursion a finite automaton cannot count (nested brackets, nested JSON values) — stays a
**symbol**: a reference to it is a :class:`~.regex.RawByte` that no UTF-8 text contains
(``0xF5`` … ``0xFF``), and :mod:`.pushdown` keeps a stack of rules where the automaton sees one.
"""

from __future__ import annotations

import re

from .regex import MAX_NESTING, Alt, RawByte, Repeat, Seq, literal, nesting_error, parse_regex

#: The byte codes a recursive rule's reference gets: bytes no UTF-8 text has.
SYMBOL_BYTES = tuple(range(0xF5, 0x100))
MAX_REPEAT = 1000
_TOKEN = re.compile(r"""\s+|\#[^\n]*|(?P<def>::=)|(?P<name>[A-Za-z_][A-Za-z0-9_-]*)|(?P<str>"(?:[^"\\]|\\.)*")
                        |(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<rep>\{\s*\d+\s*(?:,\s*\d*\s*)?\})|(?P<op>[|()*+?.])""", re.VERBOSE)


def _error(text: str, at: int, why: str) -> ValueError:
    line = text.count("\n", 0, at) + 1
    return ValueError(f"grammar line {line}: {why} (at {text[at:at + 20]!r})")


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            raise _error(text, i, "unexpected character")
        if m.lastgroup:
            out.append((m.lastgroup, m.group(m.lastgroup), i))
        i = m.end()
    return out


def _string(token: str, text: str, at: int) -> str:
    body, out, i = token[1:-1], [], 0
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "/": "/"}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in simple:
            out.append(simple[nxt])
            i += 2
        elif nxt in "xu" and re.fullmatch(rf"[0-9a-fA-F]{{{2 if nxt == 'x' else 4}}}",
                                         body[i + 2:i + (4 if nxt == "x" else 6)]):
            width = 2 if nxt == "x" else 4
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            raise _error(text, at, f"unknown escape \\{nxt} in a string literal")
    return "".join(out)


class _Parser:
    def __init__(self, text: str, tokens: list) -> None:
        self.text, self.toks, self.i, self.depth = text, tokens, 0, 0

    def peek(self, k: int = 0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else (None, None, len(self.text))

    def at_rule_start(self) -> bool:
        return self.peek()[0] == "name" and self.peek(1)[0] == "def"

    def alternation(self):
        options = [self.sequence()]
        while self.peek()[1] == "|" and self.peek()[0] == "op":
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self):
        items = []
        while True:
            kind, value, _ = self.peek()
            if kind is None or self.at_rule_start() or (kind == "op" and value in "|)"):
                break
            items.append(self.postfix())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def postfix(self):
        node = self.atom()
        while True:
            kind, value, at = self.peek()
            if kind == "op" and value in "*+?":
                self.i += 1
                node = Repeat(node, {"*": 0, "+": 1, "?": 0}[value], None if value != "?" else 1)
            elif kind == "rep":
                self.i += 1
                nums = [s.strip() for s in value[1:-1].split(",")]
                low = int(nums[0])
                high = low if len(nums) == 1 else (int(nums[1]) if nums[1] else None)
                if low > MAX_REPEAT or (high is not None and (high > MAX_REPEAT or high < low)):
                    raise _error(self.text, at, f"repetition {value} must have 0 <= m <= n <= {MAX_REPEAT}")
                node = Repeat(node, low, high)
            else:
                return node

    def atom(self):
        kind, value, at = self.peek()
        self.i += 1
        if kind == "str":
            return literal(_string(value, self.text, at))
        if kind == "cls":
            try:
                return parse_regex(value)
            except ValueError as err:
                raise _error(self.text, at, str(err)) from None
        if kind == "name":
            return ("ref", value, at)
        if kind == "op" and value == ".":
            return parse_regex(".")
        if kind == "op" and value == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise nesting_error(f"grammar parentheses (line {self.text.count(chr(10), 0, at) + 1})")
            node = self.alternation()
            self.depth -= 1
            if self.peek()[1] != ")":
                raise _error(self.text, self.peek()[2], "missing ')'")
            self.i += 1
            return node
        raise _error(self.text, at, "expected a literal, a class, a rule name or '('")


def parse_ebnf(text: str) -> dict:
    """Parse grammar ``text`` into ``{rule name: tree}`` where a reference is ``("ref", name, position)``.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: malformed syntax, naming the line; no ``root`` rule; a rule defined twice.
    """
    if not isinstance(text, str):
        raise TypeError(f"grammar must be a str, got {type(text).__name__}")
    parser = _Parser(text, _tokens(text))
    rules: dict = {}
    while parser.peek()[0] is not None:
        if not parser.at_rule_start():
            raise _error(text, parser.peek()[2], "expected 'name ::= …'")
        name, at = parser.peek()[1], parser.peek()[2]
        parser.i += 2
        if name in rules:
            raise _error(text, at, f"rule {name!r} is defined twice")
        if parser.peek()[0] is None or parser.at_rule_start():
            raise _error(text, at, f"rule {name!r} has an empty body")
        rules[name] = parser.alternation()
    if "root" not in rules:
        raise ValueError("grammar must define the start rule 'root ::= …'")
    return rules


def _refs(node) -> set[str]:
    if isinstance(node, tuple) and node and node[0] == "ref":
        return {node[1]}
    if isinstance(node, (Seq, Alt)):
        return set().union(*(_refs(n) for n in (node.items if isinstance(node, Seq) else node.options)))
    if isinstance(node, Repeat):
        return _refs(node.item)
    return set()


def _reaches(graph: dict, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def lower(text: str) -> tuple[list[str], dict]:
    """``(symbols, trees)``: the rules kept as symbols (``root`` first, then the recursive ones) and,
    for each, its tree with every other rule inlined and every symbol a :class:`RawByte`.

    Raises:
        ValueError: as :func:`parse_ebnf`; a reference to an undefined rule; more recursive rules
            than :data:`SYMBOL_BYTES` has codes.
    """
    rules = parse_ebnf(text)
    graph = {name: _refs(body) for name, body in rules.items()}
    for name, refs in graph.items():
        missing = sorted(refs - set(rules))
        if missing:
            raise ValueError(f"grammar rule {name!r} refers to {missing[0]!r}, which is not defined")
    recursive = [n for n in rules if n in _reaches(graph, n)]
    symbols = ["root"] + [n for n in recursive if n != "root"]
    if len(symbols) > len(SYMBOL_BYTES):
        raise ValueError(f"grammar has {len(symbols)} rules that need a stack (recursive ones and root); at most "
                         f"{len(SYMBOL_BYTES)} are supported")
    code = {name: SYMBOL_BYTES[i] for i, name in enumerate(symbols)}

    def inline(node, trail=()):
        if isinstance(node, tuple) and node and node[0] == "ref":
            name = node[1]
            if name in code:
                return RawByte(code[name])
            if len(trail) >= MAX_NESTING:
                raise nesting_error(f"grammar rules inlined into each other ({' → '.join(trail[:3])} → …)")
            return inline(rules[name], trail + (name,))
        if isinstance(node, Seq):
            return Seq(tuple(inline(n, trail) for n in node.items))
        if isinstance(node, Alt):
            return Alt(tuple(inline(n, trail) for n in node.options))
        if isinstance(node, Repeat):
            return Repeat(inline(node.item, trail), node.low, node.high)
        return node

    return symbols, {name: inline(rules[name]) for name in symbols}
