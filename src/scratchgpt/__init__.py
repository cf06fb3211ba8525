"""scratchgpt: build language models from scratch, as real, fast, tested software."""

__version__ = "0.1.0"
