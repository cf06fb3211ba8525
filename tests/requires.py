"""Optional packages in tests: skipped where absent, unless the test set-up requires them.

``scripts/test.sh`` installs the ``gguf`` extra (llama-cpp-python, gguf) and sets
``SCRATCHGPT_TEST_REQUIRE=gguf,llama_cpp``, so there a missing package fails the tests that need
it instead of skipping them quietly.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def optional(name: str) -> ModuleType:
    """``pytest.importorskip(name)``, or a failure when ``$SCRATCHGPT_TEST_REQUIRE`` names it."""
    required = {n.strip() for n in os.environ.get("SCRATCHGPT_TEST_REQUIRE", "").split(",")}
    if name in required:
        try:
            return __import__(name)
        except ImportError as e:
            pytest.fail(f"{name} is required by SCRATCHGPT_TEST_REQUIRE but not importable: {e}")
    return pytest.importorskip(name)
