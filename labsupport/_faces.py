"""Package faces: a subpackage's ``__init__`` names what chapters use, imported on first use.

``from labsupport.widgets import quiz_panel`` works without importing every widget module (and
without import cycles between the rooms): each face lists ``{name: submodule}`` and resolves a
name with the module-level ``__getattr__`` of PEP 562 when it is first asked for. Chapters import
from the faces only, so a module can move inside its package without editing the chapters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_face(package: str, names: Mapping[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` whose ``names`` map each public name to the submodule
    defining it; a resolved name is stored in ``namespace`` (the package's globals), so it is looked up once.
    The package's ``__all__`` becomes its own eager names (a literal ``__all__`` written before the call, if
    any) and the lazy ones, sorted.

    Raises (from the returned ``__getattr__``):
        AttributeError: a name the face does not list.
    """
    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    namespace["__all__"] = sorted({*namespace.get("__all__", ()), *names})
    return __getattr__, __dir__
