"""benchmarks.timing against a scripted clock: which calls are timed, and the figure each
function returns, computed by hand."""

import pytest

from benchmarks import timing


class ScriptedClock:
    """`time.perf_counter` that advances by the next of `durations` on each call of the timed
    function, and not at all otherwise."""

    def __init__(self, durations):
        self.now = 100.0
        self.durations = list(durations)
        self.calls = 0

    def perf_counter(self):
        return self.now

    def step(self):
        self.calls += 1
        self.now += self.durations.pop(0)


@pytest.fixture
def clock(monkeypatch):
    def make(durations):
        made = ScriptedClock(durations)
        monkeypatch.setattr(timing.time, "perf_counter", made.perf_counter)
        return made
    return make


def test_the_median_leaves_out_the_warmup_calls(clock):
    # 2 warmup calls of 50 s (tracing), then 3, 1 and 2 s: the median of the timed ones is 2.
    made = clock([50.0, 50.0, 3.0, 1.0, 2.0])
    assert timing.median_seconds(made.step, warmup=2, repeats=3) == pytest.approx(2.0)
    assert made.calls == 5 and not made.durations


def test_an_even_count_gives_the_upper_middle_timing(clock):
    made = clock([4.0, 1.0, 3.0, 2.0])  # sorted 1, 2, 3, 4: the upper middle is 3
    assert timing.median_seconds(made.step, warmup=0, repeats=4) == pytest.approx(3.0)


def test_the_best_of_repeats_divides_each_by_its_batches(clock):
    # 1 warmup (9 s); then 3 repeats of 2 calls: 2+4 = 6, 1+2 = 3, 5+5 = 10 s -> 3 / 2.
    made = clock([9.0, 2.0, 4.0, 1.0, 2.0, 5.0, 5.0])
    assert timing.best_seconds(made.step, warmup=1, batches=2, repeats=3) == pytest.approx(1.5)
    assert made.calls == 7


@pytest.mark.parametrize("call", [
    lambda fn: timing.median_seconds(fn, warmup=1, repeats=0),
    lambda fn: timing.best_seconds(fn, warmup=1, batches=0, repeats=2),
    lambda fn: timing.best_seconds(fn, warmup=1, batches=2, repeats=0),
])
def test_nothing_to_time_is_refused_before_any_call(call):
    calls = []
    with pytest.raises(ValueError, match="must be >= 1"):
        call(lambda: calls.append(1))
    assert calls == []
