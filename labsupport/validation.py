"""One place for argument checks: every public function validates with these helpers.

The rule of the whole package: a value of the wrong *type* raises ``TypeError``, a value of
the right type outside its range raises ``ValueError``; both messages name the parameter,
the value received and the valid range, e.g. ``top_p must be in (0, 1], got 1.5``.

Integers are any ``numbers.Integral`` except ``bool`` (so numpy integer scalars are
accepted everywhere); reals are any ``numbers.Real`` except ``bool``. The helpers return the
value converted to a plain ``int`` / ``float`` so callers store Python scalars.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any


def is_int(value: Any) -> bool:
    """True for an integer (Python or numpy), never for a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for a real number (Python or numpy int/float), never for a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _range_text(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return "finite"


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None,
              *, hint: str = "") -> int:
    """``value`` as an ``int`` within ``[low, high]`` (either bound may be ``None``).

    Raises:
        TypeError: not an integer (bools and floats included, even ``3.0``).
        ValueError: outside ``[low, high]``.
    """
    want = _range_text(low, high, False, False)
    if not is_int(value):
        raise TypeError(f"{name} must be an integer {want}{hint}, got {value!r} ({type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer {want}{hint}, got {value!r}")
    return int(value)


def check_real(name: str, value: Any, low: float | None = None, high: float | None = None, *,
               low_open: bool = False, high_open: bool = False, hint: str = "") -> float:
    """``value`` as a finite ``float`` within the given bounds (open or closed).

    Raises:
        TypeError: not a real number.
        ValueError: NaN, ±inf, or outside the bounds.
    """
    want = _range_text(low, high, low_open, high_open)
    what = "a finite number" if want == "finite" else f"a number {want}"
    if not is_real(value):
        raise TypeError(f"{name} must be {what}{hint}, got {value!r} ({type(value).__name__})")
    v = float(value)
    bad = (not math.isfinite(v)
           or (low is not None and (v <= low if low_open else v < low))
           or (high is not None and (v >= high if high_open else v > high)))
    if bad:
        raise ValueError(f"{name} must be {what}{'' if want == 'finite' else ' (finite)'}{hint}, got {value!r}")
    return v


def check_positive(name: str, value: Any) -> float:
    """``value`` as a ``float`` > 0 (and finite).

    Raises:
        TypeError: not a real number.
        ValueError: ≤ 0, NaN or ±inf.
    """
    return check_real(name, value, 0, low_open=True)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is exactly ``True`` or ``False`` (not ``"False"``, not ``0``).

    Raises:
        TypeError: anything else.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_callable(name: str, value: Any) -> Callable:
    """``value`` if it can be called.

    Raises:
        TypeError: it cannot.
    """
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r} ({type(value).__name__})")
    return value


def check_type(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    """``value`` if it is an instance of ``kind``.

    Raises:
        TypeError: it is not.
    """
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(f"{name} must be a {names}, got {value!r} ({type(value).__name__})")
    return value


def check_choice(name: str, value: Any, choices) -> Any:
    """``value`` if it is one of ``choices``.

    Raises:
        ValueError: it is not (the message lists the choices).
    """
    try:
        ok = value in choices
    except TypeError:                         # unhashable value against a set/dict
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {sorted(map(repr, choices))}, got {value!r}")
    return value


def check_token_ids(name: str, ids: Any, vocab_size: int, *, allow_empty: bool = False) -> list[int]:
    """A flat sequence of token ids (list, tuple, range, 1-D tensor or array) → ``list[int]``,
    every id in ``[0, vocab_size)``.

    Raises:
        TypeError: not a flat sequence of integers.
        ValueError: empty (unless ``allow_empty``) or an id outside the vocabulary.
    """
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, range)):
        raise TypeError(f"{name} must be a sequence of token ids, got {type(ids).__name__}")
    bad = [t for t in ids if not is_int(t)]
    if bad:
        raise TypeError(f"{name} must hold integer token ids, got {bad[0]!r} ({type(bad[0]).__name__})")
    out = [int(t) for t in ids]
    if not out and not allow_empty:
        raise ValueError(f"{name} must contain at least one token id, got an empty {name}")
    wrong = [t for t in out if not 0 <= t < vocab_size]
    if wrong:
        raise ValueError(f"{name} must be token ids in [0, {vocab_size}), got {wrong[:5]}")
    return out


def renamed(new_name: str, new_value: Any, old_name: str, old_value: Any) -> Any:
    """The value of an argument that was renamed: ``new_value``, or — when a caller still passes
    the old name — ``old_value`` with a ``DeprecationWarning`` that names the new one.

    Raises:
        ValueError: both names given.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"give {new_name} or its old name {old_name}, not both "
                         f"(got {new_name}={new_value!r} and {old_name}={old_value!r})")
    warnings.warn(f"{old_name} is deprecated: use {new_name}", DeprecationWarning, stacklevel=3)
    return old_value
