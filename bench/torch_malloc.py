"""Keep glibc's malloc from returning PyTorch's freed tensors to the kernel (the benchmarks' PyTorch side).

PyTorch's CPU allocator is glibc malloc: a tensor of 128 KiB or more is its own mmap, unmapped when it is freed, and the
next step maps it again and faults in every page. On a virtual machine whose page faults are dear (the Zen 5 VM of
2026-11-28: half of PyTorch's small-preset step was system time) that doubled PyTorch's step. attograd keeps its
blocks in a caching allocator; giving PyTorch the same (what a PyTorch user would do with MALLOC_TRIM_THRESHOLD_ /
MALLOC_TOP_PAD_) keeps the comparison about the arithmetic. Call keep_freed_memory() before `import torch`.
"""

import ctypes
import ctypes.util

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_applied = None


def keep_freed_memory():
    """Raises glibc's mmap threshold to its maximum (32 MiB), never trims the heap and pads each heap growth by 256 MiB
    (so freed tensors are reused from the heap instead of unmapped and faulted in again); returns a one-line summary,
    or why it could not (not glibc)."""
    global _applied
    if _applied is not None:
        return _applied
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = (libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
              and libc.mallopt(_M_TOP_PAD, 256 << 20) == 1)
        _applied = ("glibc malloc: mmap threshold 32 MiB, trim threshold 1 GiB, top pad 256 MiB" if ok else
                    "glibc malloc: mallopt refused a setting (defaults kept)")
    except (OSError, AttributeError) as e:
        _applied = f"malloc defaults kept ({e})"
    return _applied
