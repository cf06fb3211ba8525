"""keep_freed_memory: a training step reuses the memory the last one freed (glibc only)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from scratchgpt.training import allocator

# In a fresh process: a 24 MiB block from malloc, then freed. mallinfo2's hblks counts the
# blocks malloc has mapped on their own, arena the bytes of its heap: glibc's defaults map a
# block this large by itself (its first threshold is 128 KiB) and unmap it when it is freed;
# with memory kept, it comes from the heap, and the heap keeps it when it is freed.
CHILD = """
import ctypes
from scratchgpt.training.allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_freed_memory()
before = libc.mallinfo2().hblks
block = libc.malloc(24 << 20)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(kept, mapped, libc.mallinfo2().arena >= 24 << 20)
"""


def _child(malloc: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in allocator.USER_SETTINGS}
    env["SCRATCHGPT_MALLOC"] = malloc
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout.split()


@pytest.mark.skipif(not allocator._glibc() or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="glibc's malloc only, 2.33 or later (mallinfo2)")
def test_a_large_block_comes_from_the_heap_and_stays_there():
    """What a training step's tensors get: with memory kept, a block of up to 32 MiB is not
    mapped on its own and is not handed back when freed, so the next step finds it in place
    (no fresh pages to fault in); with glibc's defaults the same block is mapped and unmapped."""
    assert _child("") == ["True", "0", "True"]
    assert _child("default") == ["False", "1", "False"]


@pytest.mark.parametrize("name,value", [("SCRATCHGPT_MALLOC", "default"),
                                        ("MALLOC_TRIM_THRESHOLD_", "131072"),
                                        ("MALLOC_MMAP_THRESHOLD_", "131072")])
def test_the_users_own_setting_wins(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert allocator.keep_freed_memory.__wrapped__() is False
