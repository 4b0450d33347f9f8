"""Structured output (constrained decoding): a grammar → byte DFA → per-state token masks.

``regex`` and ``json_schema`` build a grammar tree; ``automaton`` compiles it to a minimal
byte-level DFA; ``token_index`` lifts the DFA to the vocabulary (which tokens are allowed in
each state, and where they lead); ``grammar`` wraps it all as :class:`StructuredOutput`;
``logits`` masks the logits. References: Willard & Louf, 2023 (Outlines); Dong et al., 2024
(XGrammar).
"""

from .automaton import DFA, MAX_ANY_ORDER_KEYS, compile_tree
from .grammar import StructuredOutput, compile_structured_output, for_model, normalize_spec
from .json_schema import schema_to_tree
from .logits import apply_structured_mask
from .regex import parse_regex
from .token_index import TokenIndex, token_bytes

__all__ = ["DFA", "MAX_ANY_ORDER_KEYS", "StructuredOutput", "TokenIndex", "apply_structured_mask",
           "compile_structured_output", "compile_tree", "for_model", "normalize_spec", "parse_regex",
           "schema_to_tree", "token_bytes"]

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "DFA": "automaton",
    "MAX_STACK": "pushdown",
    "TokenIndex": "token_index",
    "compare": "peer",
    "difference": "automaton",
    "intersect": "automaton",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
