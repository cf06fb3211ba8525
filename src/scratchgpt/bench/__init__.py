"""Benchmarks, one module each (see scratchgpt.commands.bench)."""
