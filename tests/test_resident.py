"""Where the resident set goes (rag_demo/measure/resident.py): the page map's kinds, and parts that
add up to the resident set they describe."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rag_demo.measure.resident import ANONYMOUS, FILES, LIBRARIES, mapped, memory_parts
from rag_demo.serving.memory import rss_bytes

SMAPS = """\
7f0000000000-7f0000100000 r-xp 00000000 08:01 123 /usr/lib/libtorch_cpu.so
Rss:                 400 kB
7f0000100000-7f0000200000 r--p 00000000 08:01 124 /usr/lib/libc.so.6
Rss:                 100 kB
7f0000200000-7f0000300000 r--p 00000000 08:01 125 /data/model.safetensors
Rss:                  30 kB
55d000000000-55d000100000 rw-p 00000000 00:00 0 [heap]
Rss:                  20 kB
7f0000300000-7f0000400000 rw-p 00000000 00:00 0
Rss:                   5 kB
"""


def test_the_page_map_is_read_by_what_backs_each_page(tmp_path):
    f = tmp_path / "smaps"
    f.write_text(SMAPS)
    assert mapped(f) == {LIBRARIES: 500 * 1024, FILES: 30 * 1024, ANONYMOUS: 25 * 1024}
    assert mapped(tmp_path / "missing") == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the page map is Linux's")
def test_the_parts_add_up_to_the_resident_set_and_name_the_pipelines_tensors():
    now = mapped()
    assert abs(sum(now.values()) - rss_bytes()) < 0.05 * rss_bytes()  # the page map covers the resident set
    weights = torch.nn.Linear(256, 256)  # 263,168 bytes of float32
    gen = SimpleNamespace(model=weights, kept_caches=lambda: {})
    index = SimpleNamespace(embeddings=np.zeros((10, 4), np.float32), index=SimpleNamespace(ntotal=10, d=4))
    pipe = SimpleNamespace(stack=SimpleNamespace(modes={"token": SimpleNamespace(generator=gen)},
                                                 ctx_encoder=SimpleNamespace(model=torch.nn.Linear(4, 4))), index=index)
    rss = rss_bytes()
    parts = memory_parts(pipe, now, rss)
    assert parts["generators"] == 256 * 257 * 4 and parts["encoders"] == 20 * 4
    assert parts["index"] == 2 * 10 * 4 * 4 and parts["kept states"] == 0
    # the named parts against the kernel's own count of resident pages (statm, not the page map they
    # were read from): nearly everything here was held before "loading", so they cover it
    statm = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    named = sum(v for k, v in parts.items() if k != "not attributed")
    assert abs(statm - named) < 0.1 * statm, (statm, parts)
    assert abs(parts["not attributed"]) < 0.1 * rss, parts


def test_the_kernel_cache_is_bounded_unless_the_environment_says(monkeypatch):
    from rag_demo.serving import memory as mem

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert mem.limit_kernel_cache() is True
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(mem.KERNEL_CACHE)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    assert mem.limit_kernel_cache() is False and os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


def test_the_app_bounds_the_kernel_cache_before_torch_starts():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    code = ("import sys; sys.argv=['app.py','--help']\n"
            "import runpy\n"
            "try:\n runpy.run_path('app.py', run_name='not_main')\nexcept SystemExit: pass\n"
            "import os; print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.stdout.split()[-1:] == ["128"], out.stdout + out.stderr
