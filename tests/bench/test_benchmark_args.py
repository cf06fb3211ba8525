"""The Python benchmarks refuse a probability out of its range, and a thread count below
0, in one line of usage error (exit 2), before anything runs."""

from __future__ import annotations

import pytest

from tests.bench.test_benchmark_scripts import _one_line_of_usage_error, _python_script


@pytest.mark.parametrize("script, value", [
    ("top_p", "0"), ("top_p", "1.5"), ("top_p", "nan"),  # 0: an AssertionError traceback
    ("dropout", "1.5"), ("dropout", "-0.1"), ("dropout", "inf"),  # torch's ValueError
])
def test_a_probability_out_of_range_is_one_line(script, value):
    line = _one_line_of_usage_error(_python_script(script, "--p", value))
    assert line.startswith(f"{script}.py: error: argument --p: expected ")


def test_speedrun_refuses_negative_threads_before_any_run(tmp_path):
    """--threads -1 went to every training run in turn, each failing on it."""
    line = _one_line_of_usage_error(_python_script("speedrun", "--threads", "-1"))
    assert "argument --threads: expected 0 (one per core) to" in line
