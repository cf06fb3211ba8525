"""The server's numbers, in Prometheus' text format (``GET /metrics``).

    scratchgpt_requests_total{endpoint="/v1/completions",status="200"}  requests answered
    scratchgpt_prompt_tokens_total / scratchgpt_generated_tokens_total   tokens in and out
    scratchgpt_generated_tokens_per_second                               over the last 10 s
    scratchgpt_queue_depth / scratchgpt_batch_rows                       right now
    scratchgpt_batch_rows_per_step                                       mean over 10 s
    scratchgpt_time_to_first_token_seconds (histogram)                   submit -> first token

A request is counted under the route it matched, by its template (``/static/{name}``, never the
name a client sent), and one that matched no route as ``other``: clients cannot add series.

Counters only grow; the engine thread and the web server's thread both update them (under a
lock). Rendering reads the engine's queue and batch sizes through ``gauges``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_WINDOW_S = 10.0


class Metrics:
    """Counters, a rate window and a histogram, rendered as Prometheus text."""

    def __init__(self, gauges: Callable[[], dict[str, int]] = dict):
        self.gauges = gauges
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)  # the last: above every bucket
        self.ttft_sum = 0.0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps
        self._since = time.monotonic()  # a server up for less than the window: its uptime

    # ---- updates (any thread)

    def request_done(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1

    def prompt_tokens_in(self, n: int) -> None:
        with self._lock:
            self.prompt_tokens += n

    def tokens_generated(self, n: int) -> None:
        """One engine iteration produced ``n`` tokens (the batch's width, when decoding)."""
        now = time.monotonic()
        with self._lock:
            self.generated_tokens += n
            self._recent.append((now, n))
            self._forget(now)

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft_counts[bisect.bisect_left(TTFT_BUCKETS, seconds)] += 1
            self.ttft_sum += seconds

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    # ---- reading

    def rates(self) -> tuple[float, float]:
        """Tokens per second and mean tokens per engine iteration over the last window (the
        time since the server started, while that is shorter). The rate is over the whole
        window, idle time included: over the time since its first step, a lone token just
        generated read as a thousand a second."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            recent = list(self._recent)
        if not recent:
            return 0.0, 0.0
        total = sum(n for _, n in recent)
        span = max(min(RATE_WINDOW_S, now - self._since), 1e-3)
        return total / span, total / len(recent)

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        rate, per_step = self.rates()
        with self._lock:
            lines = _counter("scratchgpt_requests_total", "HTTP requests answered, by endpoint "
                             "and status", [(f'endpoint="{e}",status="{s}"', n)
                                            for (e, s), n in sorted(self.requests.items())])
            lines += _counter("scratchgpt_prompt_tokens_total", "prompt tokens read",
                              [("", self.prompt_tokens)])
            lines += _counter("scratchgpt_generated_tokens_total", "tokens generated",
                              [("", self.generated_tokens)])
            lines += self._histogram()
        lines += _gauge("scratchgpt_generated_tokens_per_second",
                        f"tokens generated per second over the last {RATE_WINDOW_S:.0f} s", rate)
        lines += _gauge("scratchgpt_batch_rows_per_step", "mean tokens per engine step over "
                        f"the last {RATE_WINDOW_S:.0f} s (the decode batch size)", per_step)
        for name, value in self.gauges().items():
            lines += _gauge(f"scratchgpt_{name}", name.replace("_", " "), value)
        return "\n".join(lines) + "\n"

    def _histogram(self) -> list[str]:
        name = "scratchgpt_time_to_first_token_seconds"
        lines = [f"# HELP {name} time from a request's arrival to its first token",
                 f"# TYPE {name} histogram"]
        total = 0
        for bound, n in zip((*TTFT_BUCKETS, float("inf")), self.ttft_counts, strict=True):
            total += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{name}_bucket{{le="{le}"}} {total}')
        lines += [f"{name}_sum {self.ttft_sum!r}", f"{name}_count {total}"]
        return lines


def _counter(name: str, help_text: str, samples: list[tuple[str, int]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    return lines + [f"{name}{{{labels}}} {n}" if labels else f"{name} {n}"
                    for labels, n in samples]


def _gauge(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
