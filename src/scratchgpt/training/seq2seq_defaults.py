"""The training defaults of seq2seq runs: data, no torch, so that ``scratchgpt seq2seq train
--help`` states them without importing the training job (``training/seq2seq.py``)."""

from __future__ import annotations

from typing import Any

# Training defaults of seq2seq runs (flags override them); tuned on the dates task on a 2-core
# CPU (docs/bench_seq2seq.md). Without --max-iters a run lasts --time-budget, 10 minutes by
# default.
# One torch thread, as bench seq2seq and the experiments: on a busy 2-core machine torch's
# default two OpenMP threads spin-waited against the other jobs, and 20 updates of the dates
# task's lstm-attention took 96-115 s where one thread took 7-13 s (its final greedy decodes
# alike), so the guide's 2-minute run ended inside its warmup.
TRAIN_DEFAULTS: dict[str, Any] = dict(
    batch_size=64, learning_rate=2e-3, warmup_iters=200, weight_decay=0.01,
    eval_interval=250, eval_iters=20, log_interval=10, seed=0, threads=1)
DEFAULT_THREADS = TRAIN_DEFAULTS["threads"]  # translate's, eval's and attention's too
DEFAULT_BUDGET = "10m"
UNLIMITED_ITERS = 10**12
MIN_LR_FRACTION = 0.05  # the cosine ends at this fraction of the peak rate unless --min-lr

# Held-out pairs ``seq2seq train``'s final check decodes unless --eval-pairs. An untrained
# transformer (d=64), which never ends an output, decoded some 10 reverse pairs a second on one
# CPU thread to twice the longest target: all 2,000 took minutes (9 on a busy machine) after a
# run of 20 s. To the longest target plus 2 (training/seq2seq.py's EVAL_MARGIN), 256 take
# about 6 s.
DEFAULT_EVAL_PAIRS = 256
