"""Generation: every path is built from the decode steps of :mod:`.decode`.

decode (prefill, decode steps, the loop, the slide rule) · stopping (StopRule) ·
sampling_config (SamplingConfig, plain data) · sampling (temperature, top-k, top-p, draws) ·
generate (stream, batches) · beam · speculative (+ drafters, policy) · numpy_engine · prompt
(unconditional start).
"""
