"""labsupport.timing: median and range of repeated timings, and the noise-proof comparison."""

import pytest

from labsupport.timing import Timing, clearly_faster, time_call, timing_of


def test_median_range_and_spread_of_samples():
    t = timing_of([0.010, 0.030, 0.012, 0.011, 0.013])
    assert t.median == pytest.approx(0.012)
    assert (t.low, t.high) == (pytest.approx(0.010), pytest.approx(0.030))
    assert t.spread == pytest.approx(0.020 / 0.012)
    assert t.ms() == "12.0 ms (10.0–30.0, 5 runs)"


def test_time_call_warms_up_then_times_each_repeat():
    calls = []
    t = time_call(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(t.samples) == 4
    assert all(s >= 0 for s in t.samples)


def test_clearly_faster_only_when_the_ranges_do_not_overlap():
    fast, slow = timing_of([1.0, 1.1, 1.2]), timing_of([1.3, 1.5, 2.0])
    assert clearly_faster(fast, slow) and not clearly_faster(slow, fast)
    overlapping = timing_of([1.15, 1.4])
    assert not clearly_faster(fast, overlapping) and not clearly_faster(overlapping, fast)


@pytest.mark.parametrize("samples", [[], [float("nan")], [-0.1, 0.2]])
def test_bad_samples_raise_value_error(samples):
    with pytest.raises(ValueError, match="sample"):
        timing_of(samples)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="repeats"):
        time_call(lambda: None, repeats=0)
    with pytest.raises(TypeError, match="fn"):
        time_call(3)
    with pytest.raises(TypeError, match="a must be a Timing"):
        clearly_faster(1.0, Timing((1.0,)))


def test_median_range_formats_repeats_of_any_measurement():
    from labsupport.timing import median_range

    assert median_range([1.5, 1.3, 1.42], unit="×") == "1.42× (1.30–1.50, 3 runs)"
    assert median_range([0.002, 0.001, 0.003], scale=1e3, digits=1, unit=" ms") == "2.0 ms (1.0–3.0, 3 runs)"
    assert median_range([7.0]) == "7.00 (1 run)"
    with pytest.raises(ValueError, match="at least one"):
        median_range([])


def test_time_interleaved_runs_the_jobs_in_turn_with_untimed_hooks():
    """The benchmarks' comparison helper: a, b, a, b, … after the warm-up rounds; before/after hooks untimed."""
    from labsupport.timing import time_interleaved

    log, clock = [], [0.0]
    cost = {"a": 1.0, "b": 3.0}

    def job(k):
        def run():
            log.append(k)
            clock[0] += cost[k]
        return run

    import labsupport.timing as T
    real = T.time.perf_counter
    T.time.perf_counter = lambda: clock[0]
    try:
        t = time_interleaved({"a": job("a"), "b": job("b")}, repeats=3, warmup=1,
                             before=lambda k: log.append(f"<{k}"), after=lambda k: clock.__setitem__(0, clock[0] + 100))
    finally:
        T.time.perf_counter = real
    assert [x for x in log if not x.startswith("<")] == ["a", "b"] * 4          # one warm-up round, three timed
    assert log[:2] == ["<a", "a"] and len([x for x in log if x.startswith("<")]) == 8
    assert t["a"].samples == (1.0, 1.0, 1.0) and t["b"].samples == (3.0, 3.0, 3.0)   # the hooks' 100 s never counted
    assert list(t) == ["a", "b"]
    with pytest.raises(ValueError, match="jobs must hold at least one job"):
        time_interleaved({})
    with pytest.raises(TypeError, match="jobs\\['x'\\]"):
        time_interleaved({"x": 3})
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved({"a": job("a")}, repeats=0)
