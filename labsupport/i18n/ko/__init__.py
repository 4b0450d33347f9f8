"""Korean messages: English text → Korean text, one module per part of the package.

Each module beside this one holds ``MESSAGES = {"English": "한국어", ...}`` for the panels,
figures or checks it is named after; this module merges them. To translate a new message, add
it to the module of the code that shows it (``tests/test_translation.py`` names any that are
missing). Terms follow ``chapters-ko/glossary.md``.
"""

from __future__ import annotations

import importlib
import pkgutil

MESSAGES: dict[str, str] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    _part = importlib.import_module(f"{__name__}.{_info.name}").MESSAGES
    for _key, _text in _part.items():
        if MESSAGES.get(_key, _text) != _text:
            raise ValueError(f"two Korean translations of {_key!r}: {MESSAGES[_key]!r} and {_text!r}")
        MESSAGES[_key] = _text
