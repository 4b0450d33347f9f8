"""Panels of the chapter on serving around the KV cache: the CacheBlend recompute fraction and
the KV-tier capacities. Thin wiring: sliders → :mod:`labsupport.serving` → :mod:`labsupport.viz.serving`.

Each panel draws its first state when built (nbval runs no callbacks); a callback that fails
shows the error as a red line in the panel, which keeps working.
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import ipywidgets as W
import numpy as np

from ..i18n import tr
from ..kv import blocks_needed
from ..serving.cacheblend import CacheBlend
from ..serving.tiers import TIERS, TieredKVCache, run_chat
from ..viz.serving import blend_curve_figure, tier_figure
from .common import show_figure
from .snapshot import Panel

R_GRID = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)


def _error(e: Exception) -> str:
    line = tr("error: {kind}: {message}", kind=html.escape(type(e).__name__), message=html.escape(str(e)))
    return f"<div style='color:#c00; font-size:15px'>{line}</div>"


def _method_names() -> dict[str, str]:
    """CacheBlend's selection methods as the reader reads them."""
    return {"deviation": tr("deviation"), "random": tr("random"), "none": tr("none")}


def _position_names() -> dict[str, str]:
    """Where the chunks sit (the keys of ``blends`` the chapter uses; others as given)."""
    return {"final": tr("final"), "zero": tr("zero")}


def _slider(s: W.Widget) -> W.Widget:
    """A control of fixed width that never shrinks (three in a row used to squeeze a slider's track to
    33 px, too small to drag in front of a room): the row wraps instead (:func:`_row`)."""
    s.style.description_width = "150px"
    s.layout.width = "440px"
    s.layout.flex = "0 0 auto"
    return s


def _row(controls) -> W.HBox:
    return W.HBox(controls, layout=W.Layout(flex_flow="row wrap"))


def cacheblend_lab(blends: Mapping[str, CacheBlend], r: float = 0.15, grid=R_GRID) -> W.VBox:
    """Recompute fraction ``r`` (0–100 %), selection method and chunk positions → KL and top-1
    against the full prefill, on the curves of every (positions, method) pair.

    Args:
        blends: ``{"final": CacheBlend(..., positions="final"), "zero": ...}`` (one or both).
        r: the slider's first value, in [0, 1].

    Raises:
        ValueError: ``blends`` empty.
    """
    if not blends:
        raise ValueError("blends must hold at least one CacheBlend")
    methods, positions = _method_names(), _position_names()
    curves = {}
    for pos, cb in blends.items():
        for method in ("deviation", "random"):
            res = [cb.run(x, method) for x in grid]
            name = tr("{method}, chunks at {positions}", method=methods[method], positions=positions.get(pos, pos))
            curves[name] = (list(grid), [x.kl for x in res], [x.top1 for x in res])
    r_s = _slider(W.IntSlider(value=round(100 * r), min=0, max=100, step=1, description=tr("recompute r (%)"),
                              continuous_update=False))
    method = _slider(W.Dropdown(options=[(methods[m], m) for m in ("deviation", "random", "none")], value="deviation",
                                description=tr("select by")))
    pos = _slider(W.Dropdown(options=[(str(positions.get(p, p)), p) for p in blends], value=next(iter(blends)),
                             description=tr("chunk positions")))
    info, out = W.HTML(), W.Output()

    def redraw(_=None) -> None:
        try:
            none = method.value == "none"                    # reuse as is: r does not apply
            r_s.disabled = none
            r = 0.0 if none else r_s.value / 100
            res = blends[pos.value].run(r, method.value)
            scores = {"kl": res.kl, "top1": res.top1, "compute": res.compute_fraction}
            if none:
                line = tr("select by none: the chunks' caches reused as they are, nothing recomputed (r does not "
                          "apply): KL = {kl:.4f} nats, top-1 = {top1:.0%}, compute ≈ {compute:.0%} of a full prefill",
                          **scores)
            else:
                line = tr("r = {r} % ({n} of {T} context tokens): KL = {kl:.4f} nats, top-1 = {top1:.0%}, "
                          "compute ≈ {compute:.0%} of a full prefill",
                          r=r_s.value, n=len(res.selected), T=blends[pos.value].T, **scores)
            info.value = f"<div style='font-size:16px'>{line}</div>"
            show_figure(out, blend_curve_figure(curves, marker_r=r))
        except (TypeError, ValueError, RuntimeError) as e:       # the panel keeps working
            info.value = _error(e)

    for w in (r_s, method, pos):
        w.observe(redraw, "value")
    redraw()
    return Panel([_row([r_s, method, pos]), info, out])


def tier_lab(lm, system: list[int], conversations: list[list[list[int]]], num_blocks: int = 14,
             cpu_capacity: int = 8, disk_capacity: int = 64, block_size: int = 16, new_tokens: int = 8) -> W.VBox:
    """Pool size and CPU / disk tier capacities → a multi-turn chat run on the real engine:
    blocks served per tier, TTFT by slowest tier, tokens computed (vs tiering off).

    Raises:
        TypeError / ValueError: capacities out of range (from the engine / tiers).
    """
    from ..engine import LLMEngine

    longest = len(system) + sum(len(t) + new_tokens for t in max(conversations, key=len))
    low = blocks_needed(longest, block_size) + 1                          # one conversation must fit the pool
    pool = _slider(W.IntSlider(value=max(num_blocks, low), min=low, max=4 * low, description=tr("pool blocks"),
                               continuous_update=False))
    cpu = _slider(W.IntSlider(value=cpu_capacity, min=0, max=128, description=tr("CPU tier (blocks)"),
                              continuous_update=False))
    disk = _slider(W.IntSlider(value=disk_capacity, min=0, max=256, description=tr("disk tier (blocks)"),
                               continuous_update=False))
    info, out = W.HTML(), W.Output()

    def redraw(_=None) -> None:
        try:
            engine = LLMEngine(lm, block_size=block_size, num_blocks=pool.value, enable_prefix_caching=True)
            with TieredKVCache(engine, cpu.value, disk.value) as tiers:
                recs = run_chat(engine, tiers, conversations, system, new_tokens)
                tiers.audit()
            hits = {t: sum(r[t] for r in recs) for t in (*TIERS, "miss")}
            by = {t: [r["ttft"] for r in recs if r["served_by"] == t] for t in (*TIERS, "miss")}
            ttft = {t: 1e3 * float(np.median(v)) if v else float("nan") for t, v in by.items()}
            computed = sum(r["computed"] for r in recs)
            total = sum(r["prompt_tokens"] for r in recs)
            line = tr("{n} requests: {computed:,} of {total:,} prompt tokens computed; audit of every tier passed",
                      n=len(recs), computed=computed, total=total)
            info.value = f"<div style='font-size:16px'>{line}</div>"
            show_figure(out, tier_figure(hits, ttft, {t: len(v) for t, v in by.items()}))
        except (TypeError, ValueError, RuntimeError) as e:      # e.g. an audit failure: shown, not raised
            info.value = _error(e)

    for w in (pool, cpu, disk):
        w.observe(redraw, "value")
    redraw()
    return Panel([_row([pool, cpu, disk]), info, out])
