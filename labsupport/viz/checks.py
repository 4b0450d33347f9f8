"""Input checks every figure builder shares: a figure draws only finite numbers it can label,
columns of one length, and says which parameter is wrong otherwise (ValueError / TypeError)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..validation import is_real


def series(name: str, values, *, low: float | None = None, allow_empty: bool = False,
           length: int | None = None, length_of: str = "") -> list[float]:
    """``values`` as a list of finite floats, each ``>= low``.

    Raises:
        TypeError: not a sequence of numbers.
        ValueError: empty (unless ``allow_empty``), NaN / ±inf, below ``low``, or not of
            ``length`` (the length of ``length_of``).
    """
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, range)):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if not is_real(v):
            raise TypeError(f"{name}[{i}] must be a number, got {v!r} ({type(v).__name__})")
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"{name}[{i}] must be finite, got {v!r}")
        if low is not None and f < low:
            raise ValueError(f"{name}[{i}] must be >= {low}, got {v!r}")
        out.append(f)
    if not out and not allow_empty:
        raise ValueError(f"{name} must hold at least one value, got none")
    if length is not None and len(out) != length:
        raise ValueError(f"{name} must have one value per entry of {length_of or 'the data'} ({length}), "
                         f"got {len(out)}")
    return out


def mapping(name: str, value, *, allow_empty: bool = False) -> Mapping:
    """``value`` if it is a (non-empty) mapping.

    Raises:
        TypeError: not a mapping. ValueError: empty.
    """
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping, got {type(value).__name__}")
    if not value and not allow_empty:
        raise ValueError(f"{name} must hold at least one entry, got none")
    return value


def optional_real(name: str, value, low: float | None = None) -> float | None:
    """``None`` or a finite number ``>= low``.

    Raises:
        TypeError: not a number. ValueError: not finite or below ``low``.
    """
    if value is None:
        return None
    return series(name, [value], low=low)[0] if is_real(value) else _type_error(name, value)


def _type_error(name: str, value):
    raise TypeError(f"{name} must be a number or None, got {value!r} ({type(value).__name__})")


def text(name: str, value, *, optional: bool = False) -> str | None:
    """``value`` if it is a ``str`` (or ``None`` when ``optional``).

    Raises:
        TypeError: anything else.
    """
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str{' or None' if optional else ''}, got {value!r} "
                        f"({type(value).__name__})")
    return value
