"""`bench --scale`: the index kinds (rag_demo/knowledge/ann.py) at a million vectors, and projected to wiki_dpr.

Owns making a large, realistic vector set without embedding a million passages, measuring each
index kind on it, and projecting memory to the paper's 21,015,300 passages. A script that
measures and prints, not a test.

How the vectors are made (nothing here is random noise around nothing):
1. the real passage vectors: every Vital Articles passage under all-MiniLM-L6-v2 (the index
   cache, 11,485 x 384), their mean, and their covariance's eigen-decomposition;
2. a bigger corpus is denser: the median cosine between a real passage and its nearest other
   passage grows with the corpus (read on 1/8, 1/4, 1/2 and all of it, and printed; values in
   docs/results.md). Nearest-neighbour distances shrink as a power of N, so
   1 - cos(nn) = a·N^-alpha is fitted to those four points and read at the synthetic N;
3. each synthetic vector is a random real one plus Gaussian noise with the real vectors'
   covariance (spread along the directions real passages vary in), L2-normalised, its cosine to
   that real vector sqrt(c) for the fitted c: two vectors made from the same real one then meet
   at about c, the fitted nearest-neighbour cosine (the set's own median is computed and printed);
4. 768-d (DPR's width): every 384-d vector mapped by one fixed random isometry into 768-d (inner
   products kept), plus isotropic noise holding 10% of each vector's energy so all 768
   dimensions are used; queries are mapped by the same isometry, without noise;
5. queries are real questions embedded with the same encoder: the dev set, and the external
   questions file when present.
Exact search over the same vectors is the ground truth for recall@5.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

from rag_demo.knowledge.ann import AnnSettings, Searcher, build, bytes_per_vector, default_nlist, expected_recall

WIKI_DPR_PASSAGES = 21_015_300
EXTERNAL_QA = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa_train_vital.jsonl"

# (label, settings): the kinds compared; ivfpq with and without the exact re-rank
_HNSW = dict(kind="hnsw", hnsw_m=16, hnsw_ef_construction=40)
CONFIGS = (
    ("flat", AnnSettings(kind="flat")),
    # M 16 / efConstruction 40 here, not the defaults 32 / 80: at 1M vectors on a small CPU the
    # defaults take far longer to build (docs/results.md); one graph, searched at two efSearch
    ("hnsw ef 64", AnnSettings(**_HNSW)),
    ("hnsw ef 256", AnnSettings(**_HNSW, hnsw_ef_search=256)),
    # one IVF-PQ index (4-bit fast-scan codes, nprobe 128: the defaults), searched as it is and
    # with the exact re-rank at two depths; then the classic 8-bit codes at nprobe 64 beside them,
    # for comparison
    ("ivfpq", AnnSettings(kind="ivfpq")),
    ("ivfpq + re-rank 10k", AnnSettings(kind="ivfpq", rerank=10)),
    ("ivfpq + re-rank 40k (default)", AnnSettings(kind="ivfpq", rerank=40)),
    ("ivfpq 8-bit, nprobe 64", AnnSettings(kind="ivfpq", pq_bits=8, nprobe=64)),
    ("ivfpq 8-bit, nprobe 64 + re-rank 40k", AnnSettings(kind="ivfpq", pq_bits=8, nprobe=64, rerank=40)),
)
TIMED_QUERIES = 200  # latency is timed on the first 200 queries, one at a time


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def real_vectors(cache_dir: Path | None = None, say: Callable[[str], None] = print) -> tuple[np.ndarray, np.ndarray]:
    """(passages (N, 384), questions (Q, 384)): the Vital Articles index (cached, else built) and
    the dev + external questions, all under all-MiniLM-L6-v2, passages in the precision the app
    uses on this CPU (StackSpec.passage_dtype), so the app's cached index is reused."""
    from rag_demo.models.stack_spec import StackSpec, default_cache_dir
    from rag_demo.knowledge.corpus import load_vital_articles
    from rag_demo.models.encoders import MiniLMEncoder
    from rag_demo.knowledge.index import load_or_build_index
    from rag_demo.models.stacks import resolve_dtype

    enc = MiniLMEncoder(passage_dtype=resolve_dtype(StackSpec().passage_dtype))
    index, info = load_or_build_index(load_vital_articles(), enc, Path(cache_dir or default_cache_dir()))
    say(f"real passage vectors: {index.embeddings.shape} ({info.source})")
    questions = []
    for path in (Path(__file__).resolve().parents[2] / "assets" / "qa_dev.jsonl", EXTERNAL_QA):
        if path.is_file():
            questions += [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]
    return index.embeddings, enc.encode_questions(questions)


def nearest_neighbour_cosine(real: np.ndarray, sample: int = 2000, seed: int = 0) -> float:
    """The median cosine between a real vector and its nearest other real vector."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(real), size=min(sample, len(real)), replace=False)
    sims = real[rows] @ real.T  # (S, N)
    sims[np.arange(len(rows)), rows] = -np.inf  # not itself
    return float(np.median(sims.max(1)))


def nn_cosine_at(real: np.ndarray, n: int, seed: int = 0) -> tuple[float, dict]:
    """The median nearest-neighbour cosine a corpus like `real` would have at `n` passages:
    1 - cos = a * N^-alpha fitted (least squares in log-log) on random 1/8, 1/4, 1/2 and all of
    `real` (module docstring, step 2), read at n. Returns (cosine, the fit)."""
    rng = np.random.default_rng(seed)
    sizes = [len(real) // 8, len(real) // 4, len(real) // 2, len(real)]
    gaps = [1 - nearest_neighbour_cosine(real[rng.choice(len(real), m, replace=False)], seed=seed) for m in sizes]
    slope, icept = np.polyfit(np.log(sizes), np.log(gaps), 1)
    cos = float(1 - np.exp(icept + slope * np.log(n)))
    return cos, {"sizes": sizes, "nn_cosines": [round(1 - g, 4) for g in gaps], "alpha": round(float(-slope), 3)}


def synthesize(real: np.ndarray, n: int, seed: int = 0, chunk: int = 65536) -> tuple[np.ndarray, dict]:
    """(n, D) float32 unit vectors around the real ones (module docstring, step 2), and how."""
    rng = np.random.default_rng(seed)
    centred = real - real.mean(0)  # (N, D)
    lam, U = np.linalg.eigh(np.cov(centred, rowvar=False))  # (D,), (D, D)
    lam = np.clip(lam, 0, None)
    c, fit = nn_cosine_at(real, n, seed)
    # |x| = 1 and noise g with E|g|^2 = tr(cov) nearly orthogonal to x: cos(x, x + s g) = 1 / sqrt(1 + s^2 tr),
    # and two such vectors (independent noise) meet at 1 / (1 + s^2 tr) = c
    s = float(np.sqrt(max(1 / c - 1, 0) / lam.sum()))
    out = np.empty((n, real.shape[1]), np.float32)  # (n, D)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        anchors = real[rng.integers(0, len(real), size=m)]  # (m, D)
        g = (rng.standard_normal((m, len(lam))) * np.sqrt(lam)) @ U.T  # (m, D) ~ N(0, cov)
        v = anchors + s * g
        out[start:start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out, {"nn_cosine": round(c, 4), "noise_scale": round(s, 4), **fit,
                 "measured_nn_cosine": round(nearest_neighbour_cosine(out, sample=500, seed=seed), 4)}


def lift(vectors: np.ndarray, dim: int, noise_energy: float, seed: int = 1, chunk: int = 65536) -> np.ndarray:
    """(n, dim) vectors: a fixed random isometry of (n, d) ones into `dim` dimensions, plus
    isotropic noise holding `noise_energy` of each vector's squared norm; L2-normalised."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((dim, vectors.shape[1])))  # (dim, d), orthonormal columns
    out = np.empty((len(vectors), dim), np.float32)  # (n, dim)
    for start in range(0, len(vectors), chunk):
        v = vectors[start:start + chunk] @ Q.T  # (m, dim), norms kept
        if noise_energy:
            v = v + rng.standard_normal(v.shape) * np.sqrt(noise_energy / dim)
        out[start:start + chunk] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact top-k found in its approximate top-k: (B, k) ids each."""
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist())]))


def measure(vectors: np.ndarray, queries: np.ndarray, configs=CONFIGS, k: int = 5,
            say: Callable[[str], None] = print, workdir: Path | None = None) -> list[dict]:
    """Build each config's index over `vectors`, search one query at a time, compare with exact."""
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(queries, k)  # (Q, k)
    del exact
    mmap_path = Path(workdir or ".") / f"scale_vectors_{vectors.shape[1]}.npy"
    np.save(mmap_path, vectors)  # what the re-rank reads, memory-mapped
    rows, built = [], {}  # an index is built once and searched with and without the re-rank
    try:
        for label, s in configs:
            # search-time settings (re-rank, nprobe, efSearch) do not change the index built
            key = dataclasses.replace(s, rerank=0, nprobe=AnnSettings.nprobe, hnsw_ef_search=AnnSettings.hnsw_ef_search)
            if key not in built:
                built.clear()  # one index in memory at a time
                before = _rss()
                t0 = time.perf_counter()
                index = build(vectors, s)
                built[key] = (index, time.perf_counter() - t0, _rss() - before, len(faiss.serialize_index(index)))
            index, build_s, grown, size = built[key]
            searcher = Searcher(index, s, np.load(mmap_path, mmap_mode="r") if s.rerank else None)
            searcher.search(queries[:5], k)  # warm
            _, found = searcher.search(queries, k)  # (Q, k) recall over every query
            times = []
            for q in queries[:TIMED_QUERIES]:  # latency: one query at a time, as a user asks
                t = time.perf_counter()
                searcher.search(q[None], k)  # (1, k)
                times.append(time.perf_counter() - t)
            row = {
                "kind": label, "n": len(vectors), "dim": vectors.shape[1], "build_s": round(build_s, 1),
                "index_bytes": size, "rss_growth_bytes": grown, "bytes_per_vector": round(size / len(vectors), 1),
                "p50_ms": round(1000 * statistics.median(times), 3),
                "p95_ms": round(1000 * float(np.percentile(times, 95)), 3),
                "recall_at_5": round(recall_at(found, truth), 4), "expected": expected_recall(s),
                "settings": {f: getattr(s, f) for f in s.__dataclass_fields__},
            }
            if s.kind == "ivfpq":
                row["settings"]["nlist"] = index.nlist
                row["settings"]["pq_m"] = index.pq.M
            rows.append(row)
            say(f"{label} {vectors.shape[1]}-d: build {row['build_s']} s, {row['bytes_per_vector']} B/vector, "
                f"p50 {row['p50_ms']} ms, recall@5 {row['recall_at_5']}")
            del searcher
        built.clear()
    finally:
        mmap_path.unlink(missing_ok=True)
    return rows


def project(rows: list[dict], n: int = WIKI_DPR_PASSAGES) -> list[dict]:
    """Each measured kind's RAM at `n` passages: its bytes per vector (ann.bytes_per_vector) x n,
    plus the IVF centroids at about sqrt(n) cells; flat's exact is 4·D·n."""
    out = []
    for r in rows:
        s = AnnSettings(**{k: v for k, v in r["settings"].items() if k in AnnSettings.__dataclass_fields__})
        per = bytes_per_vector(s, r["dim"])
        fixed = default_nlist(n) * r["dim"] * 4 if s.kind == "ivfpq" else 0
        out.append({"kind": r["kind"], "dim": r["dim"], "passages": n, "ram_gb": round((per * n + fixed) / 1e9, 2),
                    "rerank_vectors_on_disk_gb": round(4 * r["dim"] * n / 1e9, 1) if s.rerank else None})
    return out


def format_scale(result: dict) -> str:
    lines = [f"### Index kinds at {result['n']:,} vectors ({result['cpu']}; load {result['load']})", "",
             f"Synthetic vectors: {result['how']}", "",
             "| kind | dim | build s | RAM / flat | bytes / vector | p50 / p95 ms | recall@5 vs exact |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    flat = {r["dim"]: r["index_bytes"] for r in result["rows"] if r["kind"] == "flat"}
    for r in result["rows"]:
        share = f"{100 * r['index_bytes'] / flat[r['dim']]:.1f}%" if r["dim"] in flat else "-"
        lines.append(f"| {r['kind']} | {r['dim']} | {r['build_s']} | {share} | {r['bytes_per_vector']} | "
                     f"{r['p50_ms']} / {r['p95_ms']} | {r['recall_at_5']:.3f} |")
    lines += ["", f"Projected to wiki_dpr's {WIKI_DPR_PASSAGES:,} passages (RAM of the index; same bytes per vector, "
              "IVF cells growing as sqrt(N)):", "", "| kind | dim | RAM | re-rank vectors on disk |", "|---|---:|---:|---:|"]
    for p in result["projection"]:
        disk = f"{p['rerank_vectors_on_disk_gb']} GB" if p["rerank_vectors_on_disk_gb"] else "-"
        lines.append(f"| {p['kind']} | {p['dim']} | {p['ram_gb']} GB | {disk} |")
    return "\n".join(lines)


def run_scale(n: int, dims: list[int], say: Callable[[str], None] = print, out: str | None = None,
              cache_dir: Path | None = None, configs=CONFIGS) -> dict:
    import platform
    import tempfile

    real, queries = real_vectors(cache_dir, say)
    t0 = time.perf_counter()
    base, how = synthesize(real, n)
    say(f"synthesized {n:,} x {real.shape[1]} in {time.perf_counter() - t0:.1f} s ({how})")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for dim in dims:
            if dim == real.shape[1]:
                vectors, q = base, queries
            else:
                vectors, q = lift(base, dim, 0.1), lift(queries, dim, 0.0)
            rows += measure(vectors, np.ascontiguousarray(q, dtype=np.float32), configs, say=say, workdir=Path(work))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result = {"n": n, "dims": dims, "rows": rows, "projection": project(rows), "queries": len(queries),
              "how": (f"{n:,} around the {len(real):,} real Vital Articles vectors, pairs meeting at cosine {how['nn_cosine']} "
                      f"(the median nearest-neighbour cosine fitted for {n:,} passages: "
                      f"{how['nn_cosines']} measured at {how['sizes']}, alpha {how['alpha']}; the set's own: "
                      f"{how['measured_nn_cosine']}); "
                      f"{len(queries)} real questions as queries; "
                      "768-d by a fixed isometry + 10% isotropic noise (rag_demo/measure/scale.py)"),
             "cpu": f"{cpu}, {os.cpu_count()} cores", "load": [round(x, 2) for x in os.getloadavg()]}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2))
    say(format_scale(result))
    return result
