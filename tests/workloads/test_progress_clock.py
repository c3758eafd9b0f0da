"""The one clock every progress line shows its elapsed time and ETA in (preparation, training
sets, the sweep's trials, the winners' tests)."""

from workloads.core.logs import clock


def test_the_clock_reads_minutes_and_seconds_then_hours_and_minutes_and_nothing_for_nan():
    assert [clock(s) for s in (0, 59.9, 61, 3599, 3600, 3725, 90061)] == [
        "0m00s", "0m59s", "1m01s", "59m59s", "1h00m", "1h02m", "25h01m"]
    assert clock(float("nan")) == "?"  # nothing done yet to extrapolate from
    assert clock(-115) == "0m00s"  # (more trials ended than planned: nothing left, not a negative time)
