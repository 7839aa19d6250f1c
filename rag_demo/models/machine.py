"""The machine a model runs on, in words: the CPU's name and whether it multiplies bfloat16
natively (which decides the offline generator's precision), or the GPU's name. Measurement and
training both record it beside every number they write. And how to time it: `best_of`, the one
timer of the cost model's calibration and of the bounds bench."""
from __future__ import annotations

import platform
import time
from pathlib import Path

import torch


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX tiles or AVX512-BF16)."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch.cpu's own probes
    return any(bool(getattr(torch.cpu, c, lambda: False)()) for c in checks)


def cpu_name() -> str:
    """The CPU's model name, with its family / model numbers (one name can span CPU generations)
    and whether it multiplies bfloat16 natively."""
    name, fields = platform.processor() or "?", {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if not line.strip():
                break  # the first processor's block is enough
    except OSError:
        pass
    name = fields.get("model name", name)
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    return name + (", native bfloat16" if cpu_has_native_bf16() else ", no native bfloat16")


def device_name(device: str | torch.device = "cpu") -> str:
    """`cpu_name()` for the CPU, else the accelerator's own name ("NVIDIA H200")."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def cpu_flags() -> list[str]:
    """The CPU's feature flags that decide its kernels (vector widths, bfloat16 and matrix units),
    from /proc/cpuinfo; [] where it is not readable: two CPUs' results compare by these."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8", "neon", "sve")
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    have = set(line.split(":", 1)[-1].split())
    return [f for f in wanted if f in have]


def best_of(fn, repeats: int, warm: bool = True) -> float:
    """min over `repeats` calls of fn's wall time: a busy neighbour only ever slows a call down, so
    the fastest is the machine's own. `warm`: one untimed call first (it pays for kernel selection
    and first-call allocations)."""
    if warm:
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
