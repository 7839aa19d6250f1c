"""Process memory for the app: glibc allocator settings that give freed memory back, and RSS.

Why: PyTorch frees its activation buffers (KV caches, (K, V) log-prob rows) with `free`, and
glibc keeps freed blocks in per-thread arenas (up to 8 x cores of them) instead of returning
them to the OS. With gradio running handlers on a pool of worker threads, each thread grows its
own arena, so RSS crept from 0.8 GB to 3.5 GB under load with nothing alive. Two arenas and a
`malloc_trim(0)` after each request keep RSS near its warm value (docs/results.md §4).
Setting `MALLOC_ARENA_MAX=2` in the environment before Python starts has the same effect as
`limit_arenas(2)`; `limit_arenas` is for when the launcher cannot set it.

oneDNN, which runs the linear layers, keeps a compiled kernel (and its buffers) for every shape it
has met, up to 1024 of them: every prefill and teacher-forced pass has its own number of tokens, so a
class's wave left ~0.3 GB of them. `limit_kernel_cache` bounds them (docs/results.md §3.6).

Torch-free, and a no-op (returns False) where glibc is not the allocator (macOS, musl).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_ARENA_MAX = -8  # glibc malloc.h

_libc = None


def _glibc():
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            _libc = False
        else:
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc = lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else False
            except OSError:
                _libc = False
    return _libc or None


def limit_arenas(n: int = 2) -> bool:
    """At most `n` malloc arenas from now on (call before worker threads start). True if set."""
    lib = _glibc()
    return bool(lib and lib.mallopt(M_ARENA_MAX, int(n)) == 1)


# oneDNN kernels kept (its default is 1024): the shapes a question meets again (decoding steps, the
# common prompt lengths) stay compiled, the long tail is recompiled when it comes back
KERNEL_CACHE = 128


def limit_kernel_cache(n: int = KERNEL_CACHE) -> bool:
    """Keep at most `n` oneDNN kernels (ONEDNN_PRIMITIVE_CACHE_CAPACITY), unless the environment
    already says; call before torch runs its first matrix product. True if set here."""
    if "ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ:
        return False
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(int(n))
    return True


def trim() -> bool:
    """Give free heap memory back to the OS (glibc `malloc_trim(0)`); True if something was released."""
    lib = _glibc()
    return bool(lib and lib.malloc_trim(0))


def _status_kb(field: str, pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident set size now (Linux /proc), or None."""
    kb = _status_kb("VmRSS", pid)
    return None if kb is None else kb * 1024


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """Peak resident set size of the process so far (VmHWM), or None."""
    kb = _status_kb("VmHWM", pid)
    return None if kb is None else kb * 1024


def env_arena_max() -> str | None:
    return os.environ.get("MALLOC_ARENA_MAX")
