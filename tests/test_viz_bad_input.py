"""Figure builders refuse what they cannot draw honestly: NaN, inf, negative values, columns of
different lengths, unknown states (ValueError / TypeError naming the parameter)."""

from __future__ import annotations

import math

import pytest

from labsupport.viz.batching import (
    goodput_bars_figure,
    latency_summary_figure,
    request_timeline_figure,
    step_time_figure,
)
from labsupport.viz.paged import block_table_figure
from labsupport.viz.sampling import entropy_curve_figure


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_latency_summary_figure_refuses_values_it_cannot_draw(value):
    with pytest.raises(ValueError, match="rows"):
        latency_summary_figure({"a": {"TTFT p50": value}}, "t")


def test_latency_summary_figure_refuses_configurations_with_other_statistics():
    with pytest.raises(ValueError, match="same statistics"):
        latency_summary_figure({"a": {"x": 1.0}, "b": {"y": 1.0}}, "t")
    fig = latency_summary_figure({"a": {"x": 1.0}, "b": {"x": 20.0}}, "t")
    assert [tr.text for tr in fig.data] == [("1.0",), ("20",)]


@pytest.mark.parametrize("values", [[math.inf], [math.nan], [-0.5]])
def test_entropy_curve_figure_refuses_non_finite_or_negative_entropy(values):
    with pytest.raises(ValueError, match="entropy_bits"):
        entropy_curve_figure([1.0], values)


def test_entropy_curve_figure_refuses_a_zero_temperature():
    with pytest.raises(ValueError, match="temperatures"):
        entropy_curve_figure([0.0], [1.0])


def test_step_time_figure_refuses_empty_or_mismatched_columns():
    with pytest.raises(ValueError, match="batches"):
        step_time_figure([], [], [])
    with pytest.raises(ValueError, match="step_ms"):
        step_time_figure([1, 2], [1.0], [1.0, 2.0])
    with pytest.raises(TypeError, match="tokens_per_s"):
        step_time_figure([1], [1.0], ["fast"])


def test_block_table_figure_refuses_a_short_ref_counts():
    with pytest.raises(ValueError, match="ref_counts"):
        block_table_figure({"a": [0, 1]}, 4, ref_counts=[1])
    fig = block_table_figure({"a": [0, 1]}, 4, ref_counts=[1, 1, 0, 0])
    assert len(fig.data) > 0


def test_request_timeline_figure_refuses_an_unknown_state():
    with pytest.raises(ValueError, match="states"):
        request_timeline_figure({"a": ["waiting", "flying"]})
    with pytest.raises(ValueError, match="states"):
        request_timeline_figure({"a": ["waiting"], "b": ["waiting", "decode"]})


def test_goodput_bars_figure_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="throughput"):
        goodput_bars_figure(["a"], [1.0, 2.0], [1.0])
