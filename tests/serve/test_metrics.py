"""The server's rate gauges, on a clock the test sets."""

from __future__ import annotations

import pytest

from scratchgpt.serve import metrics as m


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(m.time, "monotonic", lambda: now[0])
    return now


def test_tokens_per_second_is_over_the_whole_window_not_since_the_first_step(clock):
    """One token generated just now, by a server up for a minute, is 0.1 a second over the
    last 10 s: it read as 1,000 a second (one token over the millisecond since it came)."""
    metrics = m.Metrics()
    clock[0] += 60.0
    metrics.tokens_generated(1)
    clock[0] += 0.001
    assert metrics.rates() == pytest.approx((1 / m.RATE_WINDOW_S, 1.0))
    metrics.tokens_generated(16)  # a step of 16 rows
    assert metrics.rates() == pytest.approx((17 / m.RATE_WINDOW_S, 8.5))
    clock[0] += m.RATE_WINDOW_S + 0.01  # both steps out of the window
    assert metrics.rates() == (0.0, 0.0)


def test_a_server_younger_than_the_window_rates_over_its_uptime(clock):
    metrics = m.Metrics()
    clock[0] += 2.0
    metrics.tokens_generated(10)
    assert metrics.rates()[0] == pytest.approx(10 / 2.0)
    assert "scratchgpt_generated_tokens_per_second 5.0" in metrics.render()
