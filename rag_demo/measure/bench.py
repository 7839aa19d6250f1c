"""Benchmarks behind `python -m rag_demo bench`: a script that measures and prints, not a test.

Owns the speed and memory numbers of the demo, printed as markdown tables and saved as JSON:

1. latency per stage (encode, retrieve, generate, attribute) and end to end, p50 / p95 over
   N questions of the dev set, per mode, on the loaded stack (offline by default), once per
   generator precision (`--generator-dtypes`: float32, and bfloat16 where the CPU has it natively;
   the index and retriever are shared, the generator is loaded again);
2. RAG-Token's decoding overhead: its generate stage over `model.generate` of the same K
   left-padded prompts for the same number of tokens (greedy, min = max new tokens);
3. memory: resident set size with the libraries imported, after loading, warm (warmed up as the
   app is and trimmed as it is after each request), after the latency questions, and peak; by
   part (measure/resident.py);
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
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

from rag_demo.config import KNOBS, MODES, RagSettings
from rag_demo.measure.bench_report import format_cold_only, format_results, targets
from rag_demo.measure.cold_start import cold_start, index_throughput, run_cold_starts
from rag_demo.measure.latency import (
    generator_dtypes,
    in_own_thread,
    latency,
    load_avg,
    passage_caches,
    peak_rss_bytes,
    rss_bytes,
    token_overhead,
    with_generator_dtype,
)
from rag_demo.measure.bound import PEAK_SIDE, machine_peak, rates
from rag_demo.measure.reask import reasks
from rag_demo.measure.resident import mapped, memory_parts
from rag_demo.serving.memory import trim
from rag_demo.measure.reference import compare_with_transformers, reference_cases


def bound_summary(lat: dict) -> dict:
    """Per mode: the measured generation time (all but encode and retrieve) and the bound, p50 and
    p95 over the questions, and the multiples measured / bound per question (p50 and p95); the time
    to first token against the prefill's bound likewise."""
    from rag_demo.measure.latency import percentile

    out = {}
    for mode, rec in lat.items():
        if not rec.get("bound"):
            continue
        work = [t - e - r for t, e, r in zip(rec["total"], rec["encode"], rec["retrieve"])]
        mult = [w / b for w, b in zip(work, rec["bound"]) if b > 0]
        peak = [w / b for w, b in zip(work, rec.get("bound_peak") or []) if b > 0]
        first = [t / b for t, b in zip(rec["ttft"], rec["bound_prefill"]) if b > 0]
        out[mode] = {"p50": percentile(work, 50), "p95": percentile(work, 95), "bound_p50": percentile(rec["bound"], 50),
                     "multiple_p50": percentile(mult, 50), "multiple_p95": percentile(mult, 95),
                     "ttft_p50": percentile(rec["ttft"], 50), "prefill_bound_p50": percentile(rec["bound_prefill"], 50),
                     "ttft_multiple_p50": percentile(first, 50), "ttft_multiple_p95": percentile(first, 95)}
        if peak:  # the same times against the machine's own peak (bound.machine_peak)
            out[mode].update(peak_bound_p50=percentile(rec["bound_peak"], 50), peak_multiple_p50=percentile(peak, 50),
                             peak_multiple_p95=percentile(peak, 95))
    return out


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
        model = pipe.stack.modes["token"].generator.model
        rate = peak = None
        if getattr(model.config, "is_encoder_decoder", False):
            say("No bound for an encoder-decoder generator: measure/bound.py counts a decoder-only model's calls.")
        else:
            say(f"This CPU's rates in {dtype} (matrix multiplies at the generator's shapes, weight reads) ...")
            rate = in_own_thread(rates, model)
            r.setdefault("rates", {})[dtype] = rate.to_dict()
            say(f"The machine's own peak in {dtype} (a {PEAK_SIDE}-square matrix product, a streaming read) ...")
            peak = in_own_thread(machine_peak, next(model.parameters()).dtype)
            r.setdefault("peak", {})[dtype] = peak.to_dict()
        say(f"Latency, generator in {dtype} ...")
        r["latency"][dtype] = latency(pipe, questions, modes, settings, say, rate, peak)
        r.setdefault("bound", {})[dtype] = bound_summary(r["latency"][dtype])
        if reask and passage_caches(pipe):
            r["reask"][dtype] = reasks(pipe, questions, [m for m in MODES if m in modes], settings, say)  # page's order
        if i == 0 and on_first is not None:
            in_own_thread(on_first, pipe)
    return pipe


def run_bench(args, spec, say: Callable[[str], None]) -> int:
    """The `bench` command: see the module docstring for what runs, in that order."""
    from rag_demo.knowledge.bm25 import BM25Retriever
    from rag_demo.measure.evaluate import machine_info
    from rag_demo.questions import load_qa, parse_modes
    from rag_demo.models.random_models import make_random_rag_checkpoints
    from rag_demo.models.stacks import cpu_has_native_bf16
    from rag_demo.pipeline import RagPipeline

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
        r["targets"] = targets(r)
        print(format_cold_only(r))
        return save(r, args.out, say)
    dtypes = generator_dtypes(getattr(args, "generator_dtypes", None), getattr(args, "generator_dtype", None),
                              spec.name, cpu_has_native_bf16())
    before = mapped()  # the interpreter and the libraries imported so far, nothing loaded
    pipe = in_own_thread(RagPipeline.load, replace(spec, generator_dtype=dtypes[0]) if spec.name == "offline" else spec,
                         settings=settings, progress=lambda frac, msg: say(msg))
    r["stack"] = pipe.stack.describe()
    r["memory"] = {"rss_imports": sum(before.values()) or None, "rss_loaded": rss_bytes()}
    say("Warming up as the app does ...")
    in_own_thread(pipe.warm_up)
    trim()  # as the app after every request: what it holds idle, not the allocator's free lists
    warm = rss_bytes()
    r["memory"].update(rss_warm=warm, peak_warm=peak_rss_bytes(), parts_warm=memory_parts(pipe, before, warm))

    def on_first(p) -> None:  # 2-3 on the first precision's generator, before another is loaded
        if "token" in modes and not args.skip_reference:
            r["token_overhead"] = token_overhead(p, questions[: max(1, min(len(questions), args.reference_n))],
                                                 settings, say)
        trim()
        after = rss_bytes()  # after every question of the latency runs, trimmed like the app
        r["memory"].update(rss_after_questions=after, parts_after_questions=memory_parts(p, before, after))

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
    r["targets"] = targets(r)
    print(format_results(r))
    return save(r, args.out, say)


def save(r: dict, path: str, say: Callable[[str], None]) -> int:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1, default=str), encoding="utf-8")
    say(f"Saved {out}")
    return 0
