"""Panels of the batching chapter: thin wiring of sliders → simulators / measured results → figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as W

from labsupport.widgets.snapshot import Panel

from ..engine.metrics import RequestMetrics, goodput, meets_slo, request_throughput
from ..i18n import tr
from ..kv import decode_throughput, step_time, throughput_ceiling
from ..serving_math import batching_report
from ..sim.batching import simulate_batching, spread_lengths
from ..sim.serving import latency_stats, poisson_requests, simulate
from ..validation import check_real
from ..viz.batching import (
    goodput_bars_figure,
    latency_scatter_figure,
    latency_summary_figure,
    slot_gantt_figure,
    step_time_figure,
)
from .common import FigureOutput, guarded, panel_int, panel_real, show_figure


def _slider(s: W.Widget, width: str = "420px") -> W.Widget:
    s.style.description_width = "130px"
    s.layout.width = width
    return s


def _text(*lines: str) -> str:
    return "<div style='font-size:16px; line-height:1.5'>" + "<br>".join(lines) + "</div>"


# ----------------------------------------------------------------------------- step time

def step_time_lab(weight_gb: float = 16.0, kv_gb: float = 0.25, bandwidth_tbs: float = 3.3) -> W.VBox:
    """``t(B) = (W + B·K) / BW`` with sliders for ``K`` (KV per request) and ``W``.

    Raises:
        TypeError / ValueError: ``weight_gb`` outside 1–140, ``kv_gb`` outside 0.01–2 (the
            sliders), ``bandwidth_tbs`` not > 0.
    """
    panel_real("weight_gb", weight_gb, 1.0, 140.0)
    panel_real("kv_gb", kv_gb, 0.01, 2.0)
    check_real("bandwidth_tbs", bandwidth_tbs, 0, low_open=True)
    kv = _slider(W.FloatSlider(value=kv_gb, min=0.01, max=2.0, step=0.01, description=tr("K (GB/request)"),
                               continuous_update=False))
    wt = _slider(W.FloatSlider(value=weight_gb, min=1.0, max=140.0, step=1.0, description=tr("W (GB weights)"),
                               continuous_update=False))
    batches = list(range(1, 257))

    def data():
        w, k, bw = wt.value * 1e9, kv.value * 1e9, bandwidth_tbs * 1e12
        ms = [1e3 * step_time(w, bw, b, k) for b in batches]
        tps = [decode_throughput(w, bw, b, k) for b in batches]
        return ms, tps, throughput_ceiling(k, bw)

    fig = FigureOutput()
    info = W.HTML()
    error = W.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(_=None) -> None:
        ms, tps, ceil = data()
        fig.show(step_time_figure(batches, ms, tps, ceiling=ceil, marks=(1, 64, 240)))
        info.value = _text(tr("t(1) = {t1:.2f} ms, t(64) = {t64:.2f} ms → throughput ×{gain:.1f}; "
                              "ceiling BW/K = {ceiling:,.0f} tokens/s",
                              t1=ms[0], t64=ms[63], gain=tps[63] / tps[0], ceiling=ceil))

    kv.observe(redraw, "value")
    wt.observe(redraw, "value")
    redraw()
    box = Panel([W.HBox([wt, kv]), info, fig, error])
    box.error = error
    return box


# ----------------------------------------------------------------------------- static vs continuous

def batching_lab(num_requests: int = 32, batch_size: int = 8, mean_len: int = 225, spread: float = 7 / 9,
                 seed: int = 0) -> W.VBox:
    """Static vs continuous batching of a bimodal workload, on slots.

    Half the requests produce ``mean·(1 − spread)`` tokens, half ``mean·(1 + spread)``
    (alternating, so every static batch holds both kinds as in the 4 × 50 + 4 × 400 example).
    Sliders: length spread, batch size, number of requests. Shows both Gantt charts, the
    simulated step counts and the closed form of :func:`labsupport.serving_math.batching_report`.

    Raises:
        TypeError / ValueError: a starting value outside its slider's range (requests 8–128,
            batch size 2–32, spread 0–0.95) or ``mean_len`` outside 1–10 000.
    """
    panel_int("num_requests", num_requests, 8, 128)
    panel_int("batch_size", batch_size, 2, 32)
    panel_int("mean_len", mean_len, 1, 10_000)
    panel_real("spread", spread, 0.0, 0.95)
    panel_int("seed", seed, 0, 2 ** 32 - 1)
    spread_s = _slider(W.FloatSlider(value=spread, min=0.0, max=0.95, step=0.01, description=tr("length spread"),
                                     continuous_update=False))
    bsz = _slider(W.IntSlider(value=batch_size, min=2, max=32, step=2, description=tr("batch size"),
                              continuous_update=False))
    nreq = _slider(W.IntSlider(value=num_requests, min=8, max=128, step=8, description=tr("requests"),
                               continuous_update=False))
    info = W.HTML()
    error = W.HTML()

    def runs():
        short, long = spread_lengths(mean_len, spread_s.value)
        lens = [short if i % 2 == 0 else long for i in range(nreq.value)]
        return lens, {p: simulate_batching(lens, bsz.value, p) for p in ("static", "continuous")}

    fig = FigureOutput()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(_=None) -> None:
        lens, rs = runs()
        b = bsz.value
        shown = {"static": tr("static batching"), "continuous": tr("continuous batching")}
        fig.show(slot_gantt_figure({shown[p]: r.segments for p, r in rs.items()}, batch_size=b,
                                   lengths=dict(enumerate(lens)),
                                   num_steps={shown[p]: r.num_steps for p, r in rs.items()},
                                   title=tr("Slots over time (blue = short request, orange = long, grey = idle)")))
        st, co = rs["static"], rs["continuous"]
        rep = batching_report(lens, b)
        short, long = spread_lengths(mean_len, spread_s.value)
        info.value = _text(
            tr("lengths {short} and {long} tokens, batch {b}, {n} requests", short=short, long=long, b=b, n=len(lens)),
            tr("<b>static</b>: {steps} steps, utilisation {util:.1f} % (closed form {closed:.1f} %)",
               steps=st.num_steps, util=100 * st.utilisation, closed=100 * rep.utilisation),
            tr("<b>continuous</b>: {steps} steps, utilisation {util:.1f} %", steps=co.num_steps, util=100 * co.utilisation),
            tr("speed-up simulated ×{simulated:.2f}; closed form (endless queue) ×{closed:.2f}",
               simulated=st.num_steps / co.num_steps, closed=rep.speedup))

    for s in (spread_s, bsz, nreq):
        s.observe(redraw, "value")
    redraw()
    box = Panel([W.HBox([W.VBox([spread_s, bsz, nreq]), info]), fig, error])
    box.error = error
    return box


# ----------------------------------------------------------------------------- goodput

def goodput_lab(results: Mapping[str, Sequence[RequestMetrics]], ttft_slo_ms: float = 200.0,
                tpot_slo_ms: float = 20.0) -> W.VBox:
    """TTFT / TPOT SLO sliders over measured runs: per-request scatter, throughput vs goodput bars.

    Args:
        results: ``{configuration: [RequestMetrics of each request]}`` — e.g. real-engine runs
            at several ``max_num_seqs``; goodput is :func:`labsupport.engine.metrics.goodput`.
        ttft_slo_ms, tpot_slo_ms: initial targets.

    Raises:
        ValueError: no configurations, one without requests, or an SLO not > 0.
    """
    if not hasattr(results, "items") or not results:
        raise ValueError(f"results must map at least one configuration to its RequestMetrics, got {results!r}")
    for n, ms in results.items():
        if not ms:
            raise ValueError(f"results[{n!r}] must hold at least one RequestMetrics, got none")
    check_real("ttft_slo_ms", ttft_slo_ms, 1.0)
    check_real("tpot_slo_ms", tpot_slo_ms, 0.1)
    names = list(results)
    # a request that finished without a token ("error", or aborted in the queue) has no TTFT: it is
    # not a point of the scatter (goodput counts it as missing the SLO, as the metrics functions do)
    points = {n: ([1e3 * m.ttft for m in ms if m.ttft is not None],
                  [1e3 * (m.tpot or 0.0) for m in ms if m.ttft is not None]) for n, ms in results.items()}
    top_ttft = max([max(p[0], default=0.0) for p in points.values()] + [ttft_slo_ms])
    top_tpot = max([max(p[1], default=0.0) for p in points.values()] + [tpot_slo_ms])
    ttft_s = _slider(W.FloatSlider(value=ttft_slo_ms, min=1.0, max=round(top_ttft * 1.2, 0), step=1.0,
                                   description="TTFT SLO (ms)", continuous_update=False))
    tpot_s = _slider(W.FloatSlider(value=tpot_slo_ms, min=0.1, max=round(top_tpot * 1.2, 1), step=0.1,
                                   description="TPOT SLO (ms)", continuous_update=False))
    # Plain plotly outputs redrawn on every move (show_figure), not FigureWidgets updated in place: in
    # JupyterLab 4 those rendered as empty axes after "Restart Kernel and Run All" (browser check).
    scatter, bars = W.Output(), W.Output()

    def goodputs() -> list[float]:
        return [goodput(ms, ttft_s.value / 1e3, tpot_s.value / 1e3) for ms in results.values()]

    rates = [request_throughput(ms) for ms in results.values()]
    info = W.HTML()
    error = W.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(_=None) -> None:
        good = goodputs()
        scatter_fig = latency_scatter_figure(points, ttft_s.value, tpot_s.value)
        scatter_fig.update_layout(width=520, autosize=False)
        bars_fig = goodput_bars_figure(names, rates, good)
        bars_fig.update_layout(width=440, autosize=False)
        show_figure(scatter, scatter_fig)
        show_figure(bars, bars_fig)
        lines = []
        for n, ms, g, r in zip(names, results.values(), good, rates):
            ok = sum(meets_slo(m, ttft_s.value / 1e3, tpot_s.value / 1e3) for m in ms)
            lines.append(tr("<b>{name}</b>: {ok}/{total} requests within the SLO, goodput {goodput:.2f} of {rate:.2f} req/s",
                            name=n, ok=ok, total=len(ms), goodput=g, rate=r))
        info.value = _text(*lines)

    ttft_s.observe(redraw, "value")
    tpot_s.observe(redraw, "value")
    redraw()
    box = Panel([W.HBox([ttft_s, tpot_s]), info, W.HBox([scatter, bars]), error])
    box.error = error
    return box


# ----------------------------------------------------------------------------- disaggregation

def disaggregation_lab(rate: float = 6.0, long_prompt: int = 4096, chunk: int = 512, num_requests: int = 200,
                       seed: int = 0) -> W.VBox:
    """Colocated vs chunked prefill vs disaggregated prefill/decode, on a Llama 3 8B / H100 cost model.

    Requests: half with a 256-token prompt, half with ``long_prompt`` tokens, 128 output
    tokens each, Poisson arrivals. Two machines in every case (two colocated replicas, or
    one prefill + one decode machine). Sliders: arrival rate, long-prompt length, chunk size.

    Raises:
        TypeError / ValueError: a starting value outside its slider's range (rate 0.5–20,
            long prompt 512–16 384, chunk 64–4096) or ``num_requests`` outside 1–10 000.
    """
    panel_real("rate", rate, 0.5, 20.0)
    panel_int("long_prompt", long_prompt, 512, 16384)
    panel_int("chunk", chunk, 64, 4096)
    panel_int("num_requests", num_requests, 1, 10_000)
    panel_int("seed", seed, 0, 2 ** 32 - 1)
    rate_s = _slider(W.FloatSlider(value=rate, min=0.5, max=20.0, step=0.5, description=tr("requests/s"),
                                   continuous_update=False))
    long_s = _slider(W.IntSlider(value=long_prompt, min=512, max=16384, step=512, description=tr("long prompt"),
                                 continuous_update=False))
    chunk_s = _slider(W.IntSlider(value=chunk, min=64, max=4096, step=64, description=tr("chunk (tokens)"),
                                  continuous_update=False))
    names = {"colocated": tr("colocated ×2"), "chunked": tr("chunked prefill ×2"),
             "disaggregated": tr("1 prefill + 1 decode")}

    def rows():
        reqs = poisson_requests(rate_s.value, num_requests, [256, long_s.value], 128, seed=seed)
        return {names[p]: latency_stats(simulate(reqs, p, chunk=chunk_s.value)) for p in names}

    title = tr("Latency on two H100s (Llama 3 8B cost model)")
    fig = FigureOutput(latency_summary_figure(rows(), title))
    error = W.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(_=None) -> None:
        fig.show(latency_summary_figure(rows(), title))

    for s in (rate_s, long_s, chunk_s):
        s.observe(redraw, "value")
    box = Panel([W.HBox([rate_s, long_s, chunk_s]), fig, error])
    box.error = error
    return box
