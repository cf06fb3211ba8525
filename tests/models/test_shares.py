"""How the C training kernels share their rows between threads (models/shares.h): each thread
a run of consecutive items, as OpenMP's static schedule, and a thread done with its own run
takes the last items of a slower one's; every item taken exactly once; none taken over under
SCRATCHGPT_SHARES=static. The kernels' results are the same either way (test_block_kernel)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from scratchgpt.models import c_kernels

HEADER = Path(c_kernels.__file__).with_name("shares.h")

# Two threads take n items; thread 1 starts `late` microseconds after thread 0, and each item
# takes `work` microseconds. owner[i]: the thread that took item i (2: taken twice; -1: never).
PROGRAM = """
#include "{header}"
#include <unistd.h>

void run(long n, int late, int work, int *owner) {{
    for (long i = 0; i < n; i++) owner[i] = -1;
    Shares sh;
#pragma omp parallel num_threads(2)
    {{
        int t = shares_begin(&sh, n);
        if (t == 1) usleep(late);
        for (long i; (i = take(&sh, t)) >= 0;) {{
            owner[i] = owner[i] == -1 ? t : 2;
            usleep(work);
        }}
    }}
}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    source = tmp_path_factory.mktemp("shares") / "shares_test.c"
    source.write_text(PROGRAM.format(header=HEADER))
    lib = c_kernels.load_library(source, None)
    if lib is None:
        pytest.skip("the C kernels need AVX-512 and a C compiler")
    lib.run.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]

    def owners(n: int, late_us: int, work_us: int) -> np.ndarray:
        owner = np.empty(n, dtype=np.int32)
        lib.run(n, late_us, work_us, owner.ctypes.data)
        return owner

    return owners


def test_a_thread_done_with_its_run_takes_the_end_of_a_late_one(run):
    # thread 0's 20 items take ~20 ms; thread 1 starts after 200 ms
    owner = run(40, 200_000, 1_000)
    assert set(owner.tolist()) <= {0, 1}  # every item taken, none twice
    assert (owner[:20] == 0).all()  # thread 0's own run, in full
    taken_over = int((owner[20:] == 0).sum())
    assert taken_over > 0
    # what thread 1 took is the front of its run: thread 0 took from the back
    assert (owner[20:40 - taken_over] == 1).all() and (owner[40 - taken_over:] == 0).all()


def test_static_keeps_each_thread_to_its_own_run(run, monkeypatch):
    monkeypatch.setenv(c_kernels.SHARES_SWITCH, "static")
    owner = run(41, 50_000, 100)
    assert (owner[:20] == 0).all() and (owner[20:] == 1).all()


def test_every_item_is_taken_once_however_the_threads_run(run):
    for n, late, work in ((0, 0, 0), (1, 0, 0), (3, 1_000, 0), (1000, 0, 0), (257, 300, 1)):
        owner = run(n, late, work)
        assert set(owner.tolist()) <= {0, 1}, (n, late, work)
