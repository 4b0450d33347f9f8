"""A chapter cell run before the set-up cell: a NameError that says which cell to run first.

Every chapter's first code cell (the set-up) loads the model and imports what the later cells
use. A student who opens a chapter and runs a panel cell first would otherwise see a bare
``NameError: name 'target' is not defined``. ``make setup`` writes an IPython kernel config into
the course's virtual environment (``.venv/etc/ipython/ipython_kernel_config.py``) whose start-up
line calls :func:`install`; it adds one sentence to such errors and changes nothing else (no
heavy import: this module imports nothing but IPython, which the kernel has loaded already, and,
when the hint is shown, :mod:`labsupport.i18n`, which imports only the standard library).

The sentence is in the package's language (:func:`labsupport.i18n.get_language`). Before the
set-up cell has chosen one, that is ``$LABSUPPORT_LANG``, else Korean when the kernel runs in the
Korean edition's folder (``chapters-ko/``: JupyterLab starts a notebook's kernel in its folder),
else English.
"""

from __future__ import annotations

KOREAN_FOLDER = "chapters-ko"


def hint() -> str:
    """The sentence added to a NameError raised before the set-up cell ran, in the package's language."""
    import os
    from pathlib import Path

    from labsupport import i18n

    try:
        lang = i18n.get_language()
    except ValueError:                               # a bad $LABSUPPORT_LANG: the hint still shows, in English
        lang = "en"
    try:
        if i18n._language is None and not os.environ.get(i18n.ENV_VAR) and Path.cwd().name == KOREAN_FOLDER:
            lang = "ko"
    except OSError:                                  # the working folder was removed
        pass
    with i18n.language(lang):
        return i18n.tr("This name is defined by the chapter's set-up: run the first code cell of the chapter "
                       "(at the top, under the title) — or Run ▸ Run All Cells — then this cell again.")


def _handler(shell, etype, value, tb, tb_offset=None):
    """Show the usual traceback, then the hint — unless the set-up already ran (then it is a typo)."""
    import sys

    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    lab = sys.modules.get("labsupport.lab")
    if not getattr(lab, "SETUP_DONE", False):
        print(f"\n{hint()}")


def install() -> bool:
    """Register the NameError hint with the running IPython shell; False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    shell.set_custom_exc((NameError,), _handler)
    return True


KERNEL_CONFIG = """# Written by `make setup`: chapter cells run before the set-up cell say which cell to run first.
c.InteractiveShellApp.exec_lines = ["import labsupport.setup_hint as _h; _h.install(); del _h"]
"""


def main() -> int:
    """``python -m labsupport.setup_hint DIR``: write ``ipython_kernel_config.py`` into ``DIR``."""
    import sys
    from pathlib import Path

    target = Path(sys.argv[1]) / "ipython_kernel_config.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(KERNEL_CONFIG)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
