"""How a corpus of a million passages loads: the Arrow cache (memory-mapped) against Python lists.

    python experiments/corpus_scale.py [--n 1000000] [--cache-dir DIR]
    python experiments/corpus_scale.py --n 2000          # a quick run

Makes a corpus of N passages by repeating the Vital Articles passages (ids suffixed, so unique;
real text lengths), writes it once with `corpus.cached_corpus` (a `datasets` save_to_disk
folder), then, in fresh processes, measures (1) loading it from that cache and reading 5 random
passages, (2) the same passages held as a list of `Passage` objects unpickled from disk (what a
corpus was until 2026-11-24): seconds and the growth of the process's resident memory (RSS).
Prints a table; numbers depend on the machine (it says which CPU) and on the page cache.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import ROOT


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make(n: int, cache_dir: Path) -> None:
    """Write the N-passage corpus to the Arrow cache and as a pickled list."""
    from rag_demo.knowledge.corpus import Corpus, Passage, cached_corpus, load_vital_articles

    base = list(load_vital_articles().passages)

    def build() -> Corpus:
        rows = [base[i % len(base)] for i in range(n)]
        return Corpus(f"scale-{n}", [Passage(f"{p.id}~{i}", p.title, p.text, p.url) for i, p in enumerate(rows)])

    t = time.perf_counter()
    corpus = cached_corpus(f"scale-{n}", f"n={n}", build, cache_dir)
    print(f"built and cached {len(corpus):,} passages in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    with open(cache_dir / f"scale-{n}.pickle", "wb") as f:
        pickle.dump(list(corpus.passages), f, protocol=pickle.HIGHEST_PROTOCOL)


def measure(kind: str, n: int, cache_dir: Path) -> dict:
    """Run in a fresh process: load the corpus one way, read 5 passages."""
    import random

    from rag_demo.knowledge.corpus import Corpus, cached_corpus

    import datasets  # noqa: F401  (imported before the baseline: both ways pay for it alike)

    before, t = rss_mb(), time.perf_counter()
    if kind == "arrow":
        corpus = cached_corpus(f"scale-{n}", f"n={n}", lambda: (_ for _ in ()).throw(RuntimeError("not cached")),
                               cache_dir)
        rows = corpus.passages
    else:
        with open(cache_dir / f"scale-{n}.pickle", "rb") as f:
            rows = pickle.load(f)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    picked = [rows[random.randrange(n)] for _ in range(5)]
    read_ms = (time.perf_counter() - t) * 1000
    assert all(p.text for p in picked) and isinstance(Corpus, type)
    return {"kind": kind, "load_s": load_s, "read_5_ms": read_ms, "rss_growth_mb": rss_mb() - before}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="passages (default 1,000,000)")
    ap.add_argument("--cache-dir", default=None, help="where to write the corpus (default: a temp folder, removed after)")
    ap.add_argument("--measure", choices=("arrow", "list"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be at least 1")
    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="corpus-scale-"))
    if args.measure:
        print(json.dumps(measure(args.measure, args.n, cache)))
        return 0
    try:
        report(args.n, cache)
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)
    return 0


def report(n: int, cache: Path) -> None:
    make(n, cache)
    rows = []
    for kind in ("arrow", "list"):
        out = subprocess.run([sys.executable, __file__, "--n", str(n), "--cache-dir", str(cache), "--measure", kind],
                             capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    arrow_mb = sum(f.stat().st_size for f in cache.rglob("*.arrow")) / 2**20
    from rag_demo.measure.evaluate import cpu_name

    print(f"{n:,} passages ({arrow_mb:,.0f} MB of Arrow on disk); {cpu_name()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| held as | load | read 5 passages | RSS growth |")
    print("|---|---:|---:|---:|")
    for r in rows:
        what = "Arrow table, memory-mapped (cached_corpus)" if r["kind"] == "arrow" else "list of Passage objects (pickle)"
        print(f"| {what} | {r['load_s']:.2f} s | {r['read_5_ms']:.2f} ms | {r['rss_growth_mb']:,.0f} MB |")


if __name__ == "__main__":
    sys.exit(main())
