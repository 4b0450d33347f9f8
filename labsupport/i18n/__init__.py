"""The package's own words in the reader's language: one switch, one lookup, English as the source.

Panels, quizzes, exercise checks, figure titles and the set-up banner show text through
:func:`tr`::

    from ..i18n import tr
    label = tr("Temperature")                          # a fixed string
    readout = tr("{n} tokens per forward", n=3.2)      # named fields, filled in after lookup

The English text *is* the message id (as in ``gettext``), so code reads as before. Each other
language is a plain dictionary, English → translation, in ``labsupport/i18n/<lang>/``; a missing
entry falls back to English, and ``tests/test_translation.py`` lists any that are missing, unused,
or whose ``{fields}`` differ from the English. Exceptions are not translated: they are for
programmers, and an error message is easier to search for in English.

The language is chosen by :func:`set_language` (``setup_chapter(lang="ko")`` calls it) or, before
that, by the environment variable ``LABSUPPORT_LANG`` (``en`` or ``ko``; default ``en``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping
from types import MappingProxyType

#: The languages the package speaks; English is the source.
LANGUAGES = ("en", "ko")
ENV_VAR = "LABSUPPORT_LANG"

_language: str | None = None          # set_language's choice; None: read ENV_VAR


def _check_language(lang, where: str) -> str:
    if not isinstance(lang, str):
        raise TypeError(f"{where} must be a str, one of {LANGUAGES}, got {type(lang).__name__}")
    if lang not in LANGUAGES:
        raise ValueError(f"{where} must be one of {LANGUAGES}, got {lang!r}")
    return lang


def set_language(lang: str) -> str:
    """Make ``lang`` (``"en"`` or ``"ko"``) the language of every panel, quiz and check from now on.

    Returns:
        ``lang``.

    Raises:
        TypeError: ``lang`` is not a str.
        ValueError: ``lang`` is not one of :data:`LANGUAGES`.
    """
    global _language
    _language = _check_language(lang, "lang")
    return _language


def get_language() -> str:
    """The language :func:`tr` translates into: :func:`set_language`'s, else ``$LABSUPPORT_LANG``, else ``"en"``.

    Raises:
        ValueError: ``$LABSUPPORT_LANG`` is set to a language outside :data:`LANGUAGES`.
    """
    if _language is not None:
        return _language
    return _check_language(os.environ.get(ENV_VAR, "en") or "en", f"${ENV_VAR}")


@contextlib.contextmanager
def language(lang: str):
    """``with language("ko"): ...`` — :func:`tr` speaks ``lang`` inside the block, as before after it.

    Raises:
        TypeError, ValueError: as :func:`set_language`.
    """
    global _language
    before = _language
    set_language(lang)
    try:
        yield lang
    finally:
        _language = before


def catalogue(lang: str) -> Mapping[str, str]:
    """The messages of ``lang`` (English → ``lang``), read-only; empty for English.

    Raises:
        TypeError, ValueError: as :func:`set_language`.
    """
    _check_language(lang, "lang")
    if lang == "en":
        return MappingProxyType({})
    return MappingProxyType(importlib.import_module(f"{__name__}.{lang}").MESSAGES)


def tr(message: str, /, **fields) -> str:
    """``message`` in the current language, with ``{fields}`` filled in (``str.format``).

    Args:
        message: the English text, which is also the key of every catalogue. Literal braces in a
            message that has fields are written ``{{`` and ``}}``, as in ``str.format``.
        **fields: values for the message's ``{name}`` / ``{name:.2f}`` fields.

    Returns:
        The translation (English when the catalogue has none), formatted when fields are given.

    Raises:
        TypeError: ``message`` is not a str.
        ValueError: a field of the message is not given (the message and the field are named).
    """
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    lang = get_language()
    text = message if lang == "en" else catalogue(lang).get(message, message)
    if not fields:
        return text
    try:
        return text.format(**fields)
    except KeyError as err:
        raise ValueError(f"message {message!r} needs the field {err.args[0]!r}; given {sorted(fields)}") from None


def N_(message: str, /) -> str:
    """Mark ``message`` for translation where it is *stored* (a table of cases, a constant) and return it
    unchanged; :func:`tr_marked` translates it where it is *shown*. (gettext's ``gettext_noop``.)
    The test of the catalogue collects the literals of ``N_(...)`` like those of :func:`tr`."""
    return message


def tr_marked(message: str, /, **fields) -> str:
    """:func:`tr` for a message that is not a literal here but was marked with :func:`N_` where it is defined."""
    return tr(message, **fields)


__all__ = ["LANGUAGES", "N_", "catalogue", "get_language", "language", "set_language", "tr", "tr_marked"]
