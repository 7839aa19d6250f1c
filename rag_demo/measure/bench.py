"""Benchmarks behind `python -m rag_demo bench`: a script that measures and prints, not a test.

Owns the speed and memory numbers of the demo, printed as markdown tables and saved as JSON:

1. latency per stage (encode, retrieve, generate, attribute) and end to end, p50 / p95 over
   N questions of the dev set, per mode, on the loaded stack (offline by default), once per
   generator precision (`--generator-dtypes`: float32, and bfloat16 where the CPU has it natively;
   the index and retriever are shared, the generator is loaded again);
2. RAG-Token's decoding overhead: its generate stage over `model.generate` of the same K
   left-padded prompts for the same number of tokens (greedy, min = max new tokens);
3. memory: resident set size after loading, warm (after answering), and peak;
4. index build throughput (passages/s) on a 1,000-passage subset of the corpus;
5. the reference side by side (`reference.compare_with_transformers`): our engine vs
   transformers' `RagTokenForGeneration.generate` and `RagSequenceForGeneration.generate` on
   the same random weights (tiny, and "base": BERT-base DPR + BART-base, realistic depth), fed
   the same context ids, mask and doc scores; outputs must be equal token for token;
6. cold start to first answer, in a fresh process: with the cached index, and without one
   (a fresh cache folder, so all passages are embedded; `--skip-cold-build` skips it): the CLI,
   which embeds every passage before it answers, and the app (`app.py`), which answers with BM25
   while it builds the dense index: from launch to the first answer over HTTP (whichever
   retriever, as the answer labels it) and to the dense index complete, with the generator in
   float32 and, where the CPU has native bfloat16, in bfloat16 (`--cold-only` runs only these).
7. re-asking: each question asked in all modes with no passage kept, then asked again with
   another retrieval temperature, with one passage taken away and with the other preset: time to
   first token, each answer's time, and the generator's passage cache (hits, misses, bytes); per
   generator precision, as 1.

The first precision listed (by default the app's own, `auto`) is the one 2-4 run on.

The latency runs (1-2) empty the passage caches before every answer: they time a question whose
passages the generator has not read before (the prompt's opening stays kept, as on a live server).

Every timing is wall clock on a shared machine: the load average is printed next to them.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from rag_demo.config import GENERATOR_DTYPES, KNOBS, MODES, RagSettings
from rag_demo.models.generators import pad_rows
from rag_demo.measure.reference import compare_with_transformers, reference_cases

STAGES = ("encode", "retrieve", "generate", "attribute", "total")
THROUGHPUT_PASSAGES = 1000

# latency bars per generator precision: native bfloat16 keeps its bars; float32 (a CPU without
# native bfloat16, or any CPU with --generator-dtypes float32) has looser ones of its own
LATENCY_TARGETS = {
    "bfloat16": {"RAG-Token p50": 1.5,
                 "RAG-Sequence p50": 2.5,  # thorough decoding's bar: bench --decoding thorough
                 "RAG-Token time to first token p50": 0.8},
    "float32": {"RAG-Token p50": 2.5, "RAG-Sequence p50": 2.5, "RAG-Token time to first token p50": 1.0},
}
TARGETS = {  # name -> (limit, unit, direction): "max" passes when measured <= limit, "min" when >= limit
    **{f"{name} ({dtype} generator)": (limit, "s", "max")
       for dtype, bars in LATENCY_TARGETS.items() for name, limit in bars.items()},
    "RAG-Token streamed / quiet generate p50": (1.05, "x", "max"),  # streaming costs <= 5%
    "retrieval p50": (0.050, "s", "max"),
    "warm app RSS": (3.0, "GB", "max"),
    "index build throughput": (150.0, "passages/s", "min"),
    "cold start without a cache": (120.0, "s", "max"),
    "app cold start: first answer (float32 generator)": (60.0, "s", "max"),
    "app cold start: dense index complete (float32 generator)": (120.0, "s", "max"),
    "app cold start: dense index complete (bfloat16 generator)": (60.0, "s", "max"),
    "RAG-Token / plain batched generate": (1.15, "x", "max"),
    "engine / transformers RAG (base)": (1.0, "x", "max"),
}
# 7: a question asked again with another setting (each a target of its own)
REASKS = {"temperature": "another retrieval temperature", "without": "one passage taken away",
          "preset": "the other preset"}
for _k, _what in REASKS.items():
    TARGETS[f"re-ask, {_what}: time to first token p50"] = (0.3, "s", "max")
    TARGETS[f"re-ask, {_what}: slowest answer's speed-up p50"] = (2.0, "x", "min")


# ---------------------------------------------------------------- small helpers


def streamed_ratio(rec: dict) -> float:
    """Median over questions of a mode's generate time with a streaming listener / without."""
    return statistics.median(b / a for a, b in zip(rec["generate"], rec["generate_streamed"]) if a > 0)


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (q in [0, 100]), as numpy's default."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rss_bytes() -> int:
    """Current resident set size of this process (psutil, else /proc/self/statm)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _ms(s: float) -> str:
    return f"{1000 * s:.0f}"


# ---------------------------------------------------------------- 1-2 latency per stage


def passage_caches(pipe, kind: str = "passages") -> list:
    """The caches the stack's generators keep for later questions, each once: `kind` "passages"
    (their keys and values) or "hidden_states" (`Generator.kept_caches`); BART keeps none."""
    caches = {}
    for mm in pipe.stack.modes.values():
        cache = mm.generator.kept_caches().get(kind)
        if cache is not None:
            caches[id(cache)] = cache
    return list(caches.values())


def generator_dtypes(listed: str | None, single: str | None, stack: str, native: bool) -> list[str]:
    """The generator precisions to measure, concrete names, each once, in order: `--generator-dtypes`
    (comma-separated auto / float32 / bfloat16), else `--generator-dtype` alone when given, else the
    app's own (auto) and float32. The paper stack's BART has one precision: float32."""
    if stack != "offline":
        return ["float32"]
    names = [x.strip() for x in listed.split(",") if x.strip()] if listed else [single] if single else ["auto", "float32"]
    out: list[str] = []
    for name in names:
        if name not in GENERATOR_DTYPES:
            raise ValueError(f"--generator-dtypes {listed!r}: {name!r} is unknown: use {', '.join(GENERATOR_DTYPES)}.")
        concrete = ("bfloat16" if native else "float32") if name == "auto" else name
        if concrete not in out:
            out.append(concrete)
    return out


def with_generator_dtype(pipe, dtype: str, load_generator=None):
    """The same retriever and index with the offline generator loaded again in `dtype`
    (`load_generator(spec)`, SmolLM2's loader by default)."""
    from rag_demo.models.stacks import LoadedStack, load_smollm

    spec = replace(pipe.stack.spec, generator_dtype=dtype)
    gen = (load_generator or load_smollm)(spec)
    modes = {m: replace(mm, generator=gen) for m, mm in pipe.stack.modes.items()}
    return type(pipe)(LoadedStack(spec, pipe.stack.ctx_encoder, modes, pipe.stack.load_seconds), pipe.index,
                      pipe.settings, pipe.index_info)


def per_generator_dtype(pipe, dtypes: list[str], questions: list[str], modes: list[str], settings: RagSettings,
                        r: dict, say: Callable[[str], None], reask: bool = True, on_first=None,
                        load=with_generator_dtype):
    """1 and 7 once per generator precision, into r["latency"][dtype], r["reask"][dtype] and
    r["generators"][dtype]: the first on `pipe` as loaded, then `on_first(pipe)`, each other on
    `load(pipe, dtype)` (the same index, the generator loaded again). -> the last pipeline."""
    for key in ("latency", "reask", "generators"):
        r.setdefault(key, {})
    for i, dtype in enumerate(dtypes):
        if i:
            say(f"Loading the generator again in {dtype} ...")
            pipe = in_own_thread(load, pipe, dtype)
        r["generators"][dtype] = pipe.stack.describe()
        say(f"Latency, generator in {dtype} ...")
        r["latency"][dtype] = latency(pipe, questions, modes, settings, say)
        if reask and passage_caches(pipe):
            r["reask"][dtype] = reasks(pipe, questions, [m for m in MODES if m in modes], settings, say)  # page's order
        if i == 0 and on_first is not None:
            in_own_thread(on_first, pipe)
    return pipe


def forget_passages(pipe) -> None:
    """Empty every passage cache and every kept hidden state: the next question runs as if its
    passages were never read."""
    for mm in pipe.stack.modes.values():
        for cache in mm.generator.kept_caches().values():
            cache.clear()


def in_own_thread(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs) in a thread that ends with it; its result, or its error raised here.
    torch's OpenMP ops run several times slower in a thread started while another thread keeps
    its own OpenMP pool (docs/results.md §3.9). The app never runs torch on a thread that stays:
    it loads in one that ends and answers each question in one of its own. The bench does the
    same, so that its quiet and streamed answers run as the app's do."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-torch") as one:  # its thread ends on exit
        return one.submit(fn, *args, **kwargs).result()


def streamed(pipe, question: str, mode: str, settings: RagSettings) -> tuple[float | None, object]:
    """Answer with its partial answers streamed (answer_modes with partials); -> (seconds from the
    call to the first partial answer holding a token, or None if none came; the Answer)."""
    first, answer = None, None
    t0 = time.perf_counter()
    for e in pipe.answer_modes(question, [mode], settings, partials=True):
        if e.final:
            answer = e.answer
        elif first is None and (e.answer["token_ids"] or any(x["text"] for x in e.answer["drafts"])):
            first = time.perf_counter() - t0
    return first, answer


def latency(pipe, questions: list[str], modes: list[str], settings: RagSettings,
            say: Callable[[str], None]) -> dict:
    """{mode: {stage: [seconds per question]}, "tokens": [...], "ttft": [...], "generate_streamed":
    [...]}; one warm-up answer per mode first. Each question is answered twice in a row, quietly
    (the stage timings) and streamed (time to first token, and the generate time with a listener:
    the cost of streaming, paired question by question)."""
    out = {}
    for mode in modes:
        in_own_thread(pipe.answer, questions[0], mode, settings)  # warm-up: first-call allocations, lazy inits
        rec = {s: [] for s in STAGES}
        rec.update(tokens=[], ttft=[], generate_streamed=[])
        for i, q in enumerate(questions, 1):
            forget_passages(pipe)  # a question whose passages were never read (7 times re-asks)
            a = in_own_thread(pipe.answer, q, mode, settings)
            for s in STAGES:
                rec[s].append(a.timings.get(s, 0.0))
            rec["tokens"].append(len(a.token_ids))
            forget_passages(pipe)
            ttft, b = streamed(pipe, q, mode, settings)
            rec["ttft"].append(ttft if ttft is not None else b.timings["total"])
            rec["generate_streamed"].append(b.timings["generate"])
            say(f"{mode}: {i}/{len(questions)}  total {a.timings['total']:.1f} s, {len(a.token_ids)} tokens, "
                f"first token {rec['ttft'][-1]:.2f} s  (load {load_avg()})")
        out[mode] = rec
    return out


@torch.inference_mode()
def plain_generate(gen, prompts: list[list[int]], n_tokens: int) -> float:
    """Seconds for `model.generate` of the prompts as one batch, exactly `n_tokens` new tokens, greedy.
    Decoder-only prompts are left-padded, encoder-decoder ones right-padded (as the engine does)."""
    ids, mask = pad_rows(prompts, gen.pad_token_id, left=gen.kind == "decoder-only")  # (K, S)
    t0 = time.perf_counter()
    gen.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                       do_sample=False, num_beams=1, pad_token_id=gen.pad_token_id)
    return time.perf_counter() - t0


def token_overhead(pipe, questions: list[str], settings: RagSettings, say: Callable[[str], None]) -> dict:
    """RAG-Token generate time vs plain batched generation of the same K prompts, same length."""
    from rag_demo.rag.engine import rag_token
    from rag_demo.rag.hooks import PAPER
    from rag_demo.reader.aided import AidedReader, prompt

    mm = pipe.stack.modes["token"]
    gen = mm.generator
    rows = []
    for i, q in enumerate(questions):
        r = pipe.retrieve(q, "token", settings.decoding.k)
        docs, scores = r.passages, r.scores
        prompts = [prompt(gen, q, p, settings.decoding, settings.aids) for p in docs]
        reader = AidedReader(settings.aids, settings.decoding, gen, q, docs, prompts) if settings.aids_on() else PAPER
        forget_passages(pipe)  # both sides prefill every passage
        g = rag_token(gen, prompts, scores * mm.score_scale, settings.decoding, reader)
        n = len(g.tokens)
        plain = plain_generate(gen, prompts, n)
        if i == 0:  # the first pair warms both paths up; measure again
            forget_passages(pipe)
            g = rag_token(gen, prompts, scores * mm.score_scale, settings.decoding, reader)
            plain = plain_generate(gen, prompts, n)
        rows.append({"tokens": n, "rag_generate": g.timings["generate"], "rag_attribute": g.timings["attribute"],
                     "plain": plain})
        say(f"token vs plain generate: {i + 1}/{len(questions)}  {g.timings['generate']:.2f} s vs {plain:.2f} s "
            f"({n} tokens)")
    ratio = [r["rag_generate"] / r["plain"] for r in rows]
    ratio_all = [(r["rag_generate"] + r["rag_attribute"]) / r["plain"] for r in rows]
    return {"rows": rows, "ratio_p50": statistics.median(ratio), "ratio_with_attribution_p50": statistics.median(ratio_all)}


# ---------------------------------------------------------------- 7 re-asking


def asked(pipe, question: str, modes: list[str], settings: RagSettings) -> dict:
    """One request of `modes` with its partial answers streamed, as the page asks: seconds to the
    first partial answer holding a token (any mode), to the end, each mode's own answer time,
    and what the passage caches did meanwhile."""
    caches = {kind: passage_caches(pipe, kind) for kind in ("passages", "hidden_states")}
    before = {kind: [c.stats() for c in cs] for kind, cs in caches.items()}
    first, answers = None, {}
    t0 = time.perf_counter()
    for e in pipe.answer_modes(question, modes, settings, partials=True):
        if e.final:
            answers[e.mode] = e.answer
        elif first is None and (e.answer["token_ids"] or any(x["text"] for x in e.answer["drafts"])):
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    after = {kind: [c.stats() for c in cs] for kind, cs in caches.items()}

    def counted(kind: str, what: str) -> int:
        return sum(getattr(a, what) - getattr(b, what) for a, b in zip(after[kind], before[kind]))

    return {"ttft": first if first is not None else total, "total": total,
            "modes": {m: a.timings["total"] for m, a in answers.items()},
            "answers": {m: a.text for m, a in answers.items()},
            "hits": counted("passages", "hits"), "misses": counted("passages", "misses"),
            "cache_bytes": sum(a.bytes for a in after["passages"]),
            "hidden_hits": counted("hidden_states", "hits"), "hidden_misses": counted("hidden_states", "misses"),
            "hidden_bytes": sum(a.bytes for a in after["hidden_states"])}


def reasks(pipe, questions: list[str], modes: list[str], settings: RagSettings, say: Callable[[str], None]) -> dict:
    """Each question asked with no passage kept ("cold"), then again: with another retrieval
    temperature, with one passage taken away (K-1: the lowest-ranked one) and with the other
    preset (K and max new tokens kept), each right after a cold ask of its own. {variant:
    [asked(...) per question]} plus the caches' bound; an answer's speed-up is its cold time over
    its re-asked time, and "same" says whether each re-asked answer equals the answer of the same
    setting asked once more with nothing kept."""
    other = "paper" if settings.preset == "aided" else "aided"
    t = settings.decoding.prior_temperature
    variants = {"temperature": settings.merged(prior_temperature=2.0 if t != 2.0 else 1.0),
                "preset": settings.merged(preset=other, k=settings.decoding.k,  # K and answer length kept
                                          max_new_tokens=settings.decoding.max_new_tokens)}
    if settings.decoding.k > 1:
        variants["without"] = settings.merged(k=settings.decoding.k - 1)
    out: dict = {"cold": [], **{v: [] for v in variants}}
    asked(pipe, questions[0], modes, settings)  # warm-up: the prompts' openings of both presets kept, as on a server
    asked(pipe, questions[0], modes, variants["preset"])
    for i, q in enumerate(questions, 1):
        for name, s in variants.items():
            forget_passages(pipe)
            cold = asked(pipe, q, modes, settings)
            out["cold"].append(cold)
            again = asked(pipe, q, modes, s)
            again["speedup"] = {m: cold["modes"][m] / secs for m, secs in again["modes"].items() if secs > 0}
            forget_passages(pipe)  # the same setting asked with nothing kept: the answers it must equal
            fresh = asked(pipe, q, modes, s)["answers"]
            again["same"] = {m: text == fresh.get(m) for m, text in again["answers"].items()}
            out[name].append(again)
            say(f"re-ask {i}/{len(questions)}, {REASKS[name]}: first token {cold['ttft']:.2f} -> "
                f"{again['ttft']:.2f} s, total {cold['total']:.2f} -> {again['total']:.2f} s, {again['hits']} passages "
                f"kept, {again['misses']} run (load {load_avg()})")
    out["max_bytes"] = sum(c.max_bytes for c in passage_caches(pipe))
    out["hidden_max_bytes"] = sum(c.max_bytes for c in passage_caches(pipe, "hidden_states"))
    return out


def _reask_rows(r: dict) -> dict:
    """{variant: (ttft p50, total p50, slowest answer's speed-up p50, {mode: speed-up p50}, passage
    hits, misses, peak bytes, hidden-state hits, misses, peak bytes, (answers the same as asked
    with nothing kept, answers))}; the speed-ups and the sameness are None for the cold asks."""
    rows = {}
    for name in ("cold", *REASKS):
        xs = r.get(name) or []
        if not xs:
            continue
        ups = [x["speedup"] for x in xs if x.get("speedup")]
        per_mode = {m: percentile([u[m] for u in ups if m in u], 50) for m in (ups[0] if ups else {})}
        rows[name] = (percentile([x["ttft"] for x in xs], 50), percentile([x["total"] for x in xs], 50),
                      percentile([min(u.values()) for u in ups], 50) if ups else None, per_mode,
                      *(f(x.get(k, 0) for x in xs) for f, k in ((sum, "hits"), (sum, "misses"), (max, "cache_bytes"),
                                                              (sum, "hidden_hits"), (sum, "hidden_misses"),
                                                              (max, "hidden_bytes"))),
                      (sum(sum(x["same"].values()) for x in xs), sum(len(x["same"]) for x in xs))
                      if all("same" in x for x in xs) else None)
    return rows


# ---------------------------------------------------------------- 4 index throughput


def index_throughput(pipe, n: int = THROUGHPUT_PASSAGES) -> dict:
    """Embed + index the first n passages of the pipeline's corpus (no cache): passages/s."""
    from rag_demo.knowledge.corpus import Corpus
    from rag_demo.knowledge.index import build_index

    sub = Corpus(f"first {n}", pipe.index.corpus.passages[:n])
    t0 = time.perf_counter()
    build_index(sub, pipe.stack.ctx_encoder)
    dt = time.perf_counter() - t0
    return {"passages": len(sub), "seconds": dt, "passages_per_s": len(sub) / dt,
            "encoder": pipe.stack.ctx_encoder.name}


# ---------------------------------------------------------------- 6 cold start


def cold_start(question: str, cache_dir: Path | None, extra: list[str], timeout: float = 3600) -> dict:
    """Wall seconds for a fresh `python -m rag_demo ask QUESTION --mode token --json` to print its answer."""
    cmd = [sys.executable, "-m", "rag_demo", "ask", question, "--mode", "token", "--json", *extra]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[2])
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"cold start failed ({proc.returncode}): {proc.stderr[-2000:]}")
    answer = json.loads(proc.stdout)["token"]["text"]
    return {"seconds": dt, "answer": answer, "load_avg_after": load_avg()}


DENSE_READY_LINE = "The dense index of the"  # what the app's pool logs when the swap is done


def cold_start_app(question: str, cache_dir: Path, generator_dtype: str, timeout: float = 1800) -> dict:
    """A fresh `python app.py` over `cache_dir` (empty: nothing cached): wall seconds from launch
    to the first answer of `/ask` (asked as soon as the page is served; it waits for the stack to
    be ready) and the retriever that answer names, then to the log line saying the dense index is
    complete (None if it was complete before, i.e. cached), then the retriever of a second answer."""
    import socket
    import threading
    import urllib.request

    from gradio_client import Client

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "RAG_DEMO_CACHE": str(cache_dir)}
    cmd = [sys.executable, "app.py", "--port", str(port), "--generator-dtype", generator_dtype]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen: dict[str, float] = {}
    log: list[str] = []

    def read() -> None:  # the app's log, each line timed as it comes
        for line in proc.stdout:  # type: ignore[union-attr]
            log.append(line.rstrip())
            if DENSE_READY_LINE in line and "complete" in line:
                seen.setdefault("dense", time.perf_counter() - t0)
            elif "stack is ready" in line:
                seen.setdefault("ready", time.perf_counter() - t0)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}/"

    def answer() -> dict:
        r = Client(url, verbose=False).predict(question, api_name="/ask")
        return json.loads(r) if isinstance(r, str) else r

    try:
        while True:
            if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"app.py did not serve {url}: " + "\n".join(log[-30:]))
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        first = answer()
        t_first = time.perf_counter() - t0
        while "dense" not in seen and time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError("app.py exited: " + "\n".join(log[-30:]))
            if first["answers"]["token"].get("retriever") == "dense":
                break  # dense from the start: nothing was built in the background
            time.sleep(0.2)
        second = answer()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"generator_dtype": generator_dtype, "first_answer_s": t_first, "ready_s": seen.get("ready"),
            "first_retriever": first["answers"]["token"].get("retriever"),
            "first_answer": first["answers"]["token"]["text"], "dense_complete_s": seen.get("dense"),
            "second_retriever": second["answers"]["token"].get("retriever"), "load_avg_after": load_avg()}


def run_cold_starts(question: str, spec, extra: list[str], say: Callable[[str], None]) -> dict:
    """Every cold start with an empty cache, one after another: the CLI's (`extra`: its stack
    flags; it embeds every passage, then answers) and, for the offline stack, the app's with the
    generator in float32 and, where the CPU has native bfloat16, in bfloat16."""
    from rag_demo.models.stacks import cpu_has_native_bf16

    out = {}
    say("Cold start of the CLI without a cache (embeds every passage, then answers; minutes) ...")
    with tempfile.TemporaryDirectory(prefix="rag-bench-cache-") as tmp:
        out["cold_uncached"] = cold_start(question, Path(tmp), extra)
    app_dtypes = ("float32", "bfloat16") if cpu_has_native_bf16() else ("float32",)
    for dtype in app_dtypes if spec.name == "offline" else ():
        say(f"Cold start of the app without a cache, generator in {dtype} (answers with BM25 while it builds) ...")
        with tempfile.TemporaryDirectory(prefix="rag-bench-cache-") as tmp:
            out[f"app_{dtype}"] = c = cold_start_app(question, Path(tmp), dtype)
        say(f"  first answer at {c['first_answer_s']:.1f} s ({c['first_retriever']}), dense index complete at "
            f"{c['dense_complete_s'] or float('nan'):.1f} s, then {c['second_retriever']}")
    return out


def format_cold_starts(cold: dict) -> list[str]:
    """The app's cold starts as a table (empty when none ran)."""
    rows = [(k.removeprefix("app_"), c) for k, c in cold.items() if k.startswith("app_")]
    if not rows:
        return []
    lines = ["", "### Cold start of the app with an empty cache (launch to ...)", "",
             "| generator | stack ready | first answer | its retriever | dense index complete | next answer's retriever |",
             "|---|---:|---:|---|---:|---|"]
    for dtype, c in rows:
        ready = f"{c['ready_s']:.1f} s" if c.get("ready_s") is not None else "-"
        dense = f"{c['dense_complete_s']:.1f} s" if c.get("dense_complete_s") is not None else "-"
        lines.append(f"| {dtype} | {ready} | {c['first_answer_s']:.1f} s | {c['first_retriever']} | {dense} "
                     f"| {c['second_retriever']} |")
    return lines


# ---------------------------------------------------------------- report


def _p(xs: list[float]) -> str:
    return f"{_ms(percentile(xs, 50))} / {_ms(percentile(xs, 95))}"


def latency_heading(r: dict) -> str:
    """The latency table's heading: questions, stack and the decoding the numbers ran with."""
    n = r["settings"].get("num_beams", 1)
    return (f"### Latency per stage, ms p50 / p95 over {r['n']} questions (stack {r['stack']}, "
            f"K={r['settings']['k']}, {'greedy' if n == 1 else f'{n} beams'}, "
            f"max {r['settings']['max_new_tokens']} new tokens)")


# the reference comparison always runs the paper's exact decodings (reference.compare_with_reference)
REFERENCE_TITLES = {"token": "RAG-Token", "sequence": "RAG-Sequence (thorough)"}


def format_results(r: dict) -> str:
    titles = {"closed-book": "Closed-book", "token": "RAG-Token",
              "sequence": f"RAG-Sequence ({r['settings'].get('sequence_decoding', 'thorough')})"}
    lat = r["latency"]  # {generator dtype: {mode: record}}
    rows = [(mode, dtype, lat[dtype][mode]) for mode in titles for dtype in lat if mode in lat[dtype]]
    lines = [latency_heading(r),
             "", "| mode | generator | encode | retrieve | generate | attribute | end to end | tokens/answer |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for mode, dtype, rec in rows:
        lines.append(f"| {titles[mode]} | {dtype} | " + " | ".join(_p(rec[s]) for s in STAGES)
                     + f" | {statistics.mean(rec['tokens']):.1f} |")
    if rows and all("ttft" in rec for _, _, rec in rows):
        lines += ["", "Streaming (each question answered again with a listener): time from the call to the first "
                      "partial answer holding a token, and the generate stage with the listener against without, "
                      "p50 of the per-question ratios.", "",
                  "| mode | generator | time to first token p50 / p95, ms | streamed / quiet generate p50 |",
                  "|---|---|---:|---:|"]
        for mode, dtype, rec in rows:
            lines.append(f"| {titles[mode]} | {dtype} | {_p(rec['ttft'])} | {streamed_ratio(rec):.3f}x |")
    if r.get("token_overhead"):
        t = r["token_overhead"]
        lines += ["", f"RAG-Token generate / plain batched `model.generate` of the same K prompts, same number of "
                      f"tokens (p50 over {len(t['rows'])} questions): **{t['ratio_p50']:.2f}x** "
                      f"({t['ratio_with_attribution_p50']:.2f}x with the attribution pass)."]
    if r.get("reask"):  # {generator dtype: reasks(...)}
        lines += ["", "### Asked again with another setting (all modes in one request, streamed)", "",
                  "Each question asked with no passage kept (cold), then at once again. p50 over questions; "
                  "speed-up: an answer's cold time over its re-asked time (slowest: the least of the modes'); "
                  "passages and hidden states kept (read) / run (not kept): summed over the questions.", "",
                  "| ask | generator | time to first token p50, ms | request p50, ms | speed-up p50, slowest answer "
                  "| speed-up p50 per mode | passages kept / run | passage cache, MB | hidden states kept / run "
                  "| hidden states, MB | answers the same as asked with nothing kept |",
                  "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
        names = {"cold": "first ask (cold)", **{k: f"again, {v}" for k, v in REASKS.items()}}
        by_dtype = {dtype: _reask_rows(x) for dtype, x in r["reask"].items()}
        for name in names:
            for dtype, table in by_dtype.items():
                if name not in table:
                    continue
                ttft, total, up, per_mode, hits, misses, peak, h_hits, h_misses, h_peak, same = table[name]
                modes = ", ".join(f"{m} {x:.2f}x" for m, x in per_mode.items()) or "-"
                lines.append(f"| {names[name]} | {dtype} | {_ms(ttft)} | {_ms(total)} "
                             f"| {'-' if up is None else f'{up:.2f}x'} | {modes} | {hits} / {misses} "
                             f"| {peak / 2**20:.1f} | {h_hits} / {h_misses} | {h_peak / 2**20:.1f} "
                             f"| {'-' if same is None else f'{same[0]} / {same[1]}'} |")
        bound = max(x["max_bytes"] for x in r["reask"].values())
        h_bound = max(x.get("hidden_max_bytes", 0) for x in r["reask"].values())
        lines.append(f"\nBounds per generator: passage cache {bound / 2**20:.0f} MB, hidden states {h_bound / 2**20:.0f} MB.")
    m = r["memory"]
    lines += ["", "### Memory and start-up", "", "| what | value |", "|---|---:|",
              f"| RSS after loading the stack and index | {_gb(m['rss_loaded'])} |",
              f"| warm app RSS (after the latency runs) | {_gb(m['rss_warm'])} |",
              f"| peak RSS (app) | {_gb(m['peak_warm'])} |",
              f"| peak RSS (whole bench, reference models included) | {_gb(m['peak_end'])} |"]
    if r.get("throughput"):
        t = r["throughput"]
        lines.append(f"| index build throughput ({t['encoder']}, first {t['passages']} passages only) "
                     f"| {t['passages_per_s']:.0f} passages/s |")
    for key, label in (("cold_cached", "cold start to first answer, cached index"),
                       ("cold_uncached", "cold start to first answer, no cache (embeds every passage)")):
        c = r.get("cold", {}).get(key)
        lines.append(f"| {label} | {c['seconds']:.1f} s |" if c else f"| {label} | skipped |")
    lines += format_cold_starts(r.get("cold", {}))
    if r.get("reference"):
        lines += ["", "### Our engine vs transformers' RAG classes, same weights and inputs", "",
                  "| checkpoint | mode | n_docs | questions | same outputs | ours s p50 | transformers s p50 "
                  "| ours/theirs, median of per-question ratios | same, our generate stage only |",
                  "|---|---|---:|---:|---|---:|---:|---:|---:|"]
        for size, modes in r["reference"].items():
            for mode, x in modes.items():
                lines.append(f"| random {size} | {REFERENCE_TITLES[mode]} | {x['n_docs']} | {x['n']} | "
                             f"{'yes' if x['same'] else 'no'} | {x['ours_s_p50']:.3f} | {x['transformers_s_p50']:.3f} "
                             f"| {x['ratio']:.2f} | {x['ratio_generate_only']:.2f} |")
        same = all(x["same"] for modes in r["reference"].values() for x in modes.values())
        lines.append(f"\nsame outputs: {'yes' if same else 'no'}")
    return "\n".join(lines + _targets_and_machine(r))


def format_cold_only(r: dict) -> str:
    """`bench --cold-only`: the cold starts, the targets they measure, the machine."""
    lines = ["### Cold starts with an empty cache", "", "| what | value |", "|---|---:|",
             f"| CLI `ask`, to the first answer (embeds every passage first) | {r['cold']['cold_uncached']['seconds']:.1f} s |"]
    lines += format_cold_starts(r["cold"])
    targets = {k: t for k, t in r["targets"].items() if "cold start" in k}
    return "\n".join(lines + _targets_and_machine({**r, "targets": targets}))


def _targets_and_machine(r: dict) -> list[str]:
    lines = ["", "### Targets", "", "| target | limit | measured | result |", "|---|---:|---:|---|"]
    for name, t in r["targets"].items():
        lines.append(f"| {name} | {t['bound']} {t['limit']:g} {t['unit']} | {t['measured']} | {t['result']} |")
    mc = r["machine"]
    lines += ["", f"Machine: {mc['processor']}, {mc['cpus']} CPUs, torch {mc['torch']} ({mc['threads']} threads). "
                  f"Load average at start {r['load_avg']['start']}, end {r['load_avg']['end']} "
                  f"(the bench's own {mc['threads']} threads count; well above {mc['threads']} means other jobs "
                  "shared the cores and the timings are upper bounds)."]
    return lines


def _targets(r: dict) -> dict:
    measured = {}
    by_dtype = r.get("latency", {})  # {generator dtype: {mode: record}}; the first is the app's own
    for dtype, lat in by_dtype.items():
        if "token" in lat:
            measured[f"RAG-Token p50 ({dtype} generator)"] = percentile(lat["token"]["total"], 50)
        if "sequence" in lat:
            measured[f"RAG-Sequence p50 ({dtype} generator)"] = percentile(lat["sequence"]["total"], 50)
        if lat.get("token", {}).get("ttft"):
            measured[f"RAG-Token time to first token p50 ({dtype} generator)"] = percentile(lat["token"]["ttft"], 50)
    lat = next(iter(by_dtype.values()), {})
    if lat.get("token", {}).get("ttft"):
        measured["RAG-Token streamed / quiet generate p50"] = streamed_ratio(lat["token"])
    rag = [m for m in lat if m != "closed-book"]
    if rag:
        measured["retrieval p50"] = percentile(lat[rag[0]]["retrieve"], 50)
    if r.get("memory"):
        measured["warm app RSS"] = r["memory"]["rss_warm"] / 1e9
    if r.get("throughput"):
        measured["index build throughput"] = r["throughput"]["passages_per_s"]
    if r.get("cold", {}).get("cold_uncached"):
        measured["cold start without a cache"] = r["cold"]["cold_uncached"]["seconds"]
    for dtype in ("float32", "bfloat16"):
        c = r.get("cold", {}).get(f"app_{dtype}")
        if c and dtype == "float32":
            measured["app cold start: first answer (float32 generator)"] = c["first_answer_s"]
        if c and c.get("dense_complete_s") is not None:
            measured[f"app cold start: dense index complete ({dtype} generator)"] = c["dense_complete_s"]
    if r.get("token_overhead"):
        measured["RAG-Token / plain batched generate"] = r["token_overhead"]["ratio_p50"]
    if r.get("reference", {}).get("base"):
        measured["engine / transformers RAG (base)"] = max(x["ratio"] for x in r["reference"]["base"].values())
    reask = next(iter((r.get("reask") or {}).values()), {})  # the app's own precision
    for name, (ttft, _, up, *_) in _reask_rows(reask).items():
        if name in REASKS:
            measured[f"re-ask, {REASKS[name]}: time to first token p50"] = ttft
            if up is not None:
                measured[f"re-ask, {REASKS[name]}: slowest answer's speed-up p50"] = up
    out = {}
    for name, (limit, unit, direction) in TARGETS.items():
        bound = "<=" if direction == "max" else ">="
        if name not in measured:
            out[name] = {"limit": limit, "unit": unit, "bound": bound, "measured": "not run", "result": "-"}
            continue
        v = measured[name]
        shown = f"{v * 1000:.0f} ms" if unit == "s" and limit < 1 else f"{v:.2f} {unit}"
        ok = v <= limit if direction == "max" else v >= limit
        out[name] = {"limit": limit, "unit": unit, "bound": bound, "measured": shown, "value": v,
                     "result": "PASS" if ok else "FAIL"}
    return out


def run_bench(args, spec, say: Callable[[str], None]) -> int:
    """The `bench` command: see the module docstring for what runs, in that order."""
    from rag_demo.knowledge.bm25 import BM25Retriever
    from rag_demo.measure.evaluate import load_qa, machine_info, parse_modes
    from rag_demo.pipeline import RagPipeline
    from rag_demo.models.random_models import make_random_rag_checkpoints
    from rag_demo.models.stacks import cpu_has_native_bf16

    if args.n < 1:
        raise ValueError(f"--n {args.n} is out of range: use 1 or more questions.")
    questions = [it.question for it in load_qa(args.qa)][: args.n]
    modes = parse_modes(args.modes)
    settings = RagSettings.for_stack(spec.name, preset=getattr(args, "preset", None),
                                     **{n: getattr(args, n, None) for n in KNOBS})
    r: dict = {"n": len(questions), "settings": settings.to_dict(),
               "load_avg": {"start": load_avg()}, "machine": machine_info()}
    extra = ["--stack", spec.name, "--generator-dtype", spec.generator_dtype, "--passage-dtype", spec.passage_dtype,
             "--passage-cache-mb", str(spec.passage_cache_mb)]
    if spec.name == "paper":
        extra += ["--rag-token", spec.rag_token, "--rag-sequence", spec.rag_sequence, "--ctx-encoder", spec.ctx_encoder]
    if getattr(args, "cold_only", False):
        r["stack"] = spec.name
        r["cold"] = run_cold_starts(questions[0], spec, extra, say)
        r["load_avg"]["end"] = load_avg()
        r["targets"] = _targets(r)
        print(format_cold_only(r))
        return _save(r, args.out, say)
    dtypes = generator_dtypes(getattr(args, "generator_dtypes", None), getattr(args, "generator_dtype", None),
                              spec.name, cpu_has_native_bf16())
    pipe = in_own_thread(RagPipeline.load, replace(spec, generator_dtype=dtypes[0]) if spec.name == "offline" else spec,
                         settings=settings, progress=lambda frac, msg: say(msg))
    r["stack"] = pipe.stack.describe()
    r["memory"] = {"rss_loaded": rss_bytes()}

    def on_first(p) -> None:  # 2-3 on the first precision's generator, before another is loaded
        if "token" in modes and not args.skip_reference:
            r["token_overhead"] = token_overhead(p, questions[: max(1, min(len(questions), args.reference_n))],
                                                 settings, say)
        r["memory"].update(rss_warm=rss_bytes(), peak_warm=peak_rss_bytes())

    pipe = per_generator_dtype(pipe, dtypes, questions, modes, settings, r, say,
                               reask=not getattr(args, "skip_reask", False), on_first=on_first)
    say("Index build throughput ...")
    r["throughput"] = in_own_thread(index_throughput, pipe)
    if not args.skip_reference:
        bm25 = BM25Retriever(pipe.index.corpus)
        r["reference"] = {}
        with tempfile.TemporaryDirectory(prefix="rag-bench-ckpt-") as root:
            for size, n_docs in (("tiny", 3), ("base", settings.decoding.k)):
                say(f"Reference comparison on random {size} checkpoints (n_docs={n_docs}) ...")
                paths = make_random_rag_checkpoints(Path(root), size=size, n_docs=n_docs)
                cases = reference_cases(questions[: args.reference_n], n_docs, bm25)
                res = in_own_thread(compare_with_transformers, paths, cases, settings.decoding.max_new_tokens,
                                    reps=5 if size == "tiny" else 3, say=say)
                for x in res.values():
                    x["rows"] = [{k: v for k, v in row.items() if k not in ("ours", "transformers")} | {
                        "tokens": len(row["ours"])} for row in x["rows"]]
                r["reference"][size] = res
    r["memory"]["peak_end"] = peak_rss_bytes()
    del pipe
    r["cold"] = {}
    say("Cold start with the cached index ...")
    r["cold"]["cold_cached"] = cold_start(questions[0], Path(spec.cache_dir), extra)
    if not args.skip_cold_build:
        r["cold"].update(run_cold_starts(questions[0], spec, extra, say))
    r["load_avg"]["end"] = load_avg()
    r["targets"] = _targets(r)
    print(format_results(r))
    return _save(r, args.out, say)


def _save(r: dict, path: str, say: Callable[[str], None]) -> int:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1, default=str), encoding="utf-8")
    say(f"Saved {out}")
    return 0
