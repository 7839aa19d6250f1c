"""`bench` 1-3: latency per stage and end to end, per generator precision; RAG-Token's decoding overhead
over plain batched generation; and the small helpers (percentiles, memory) every part uses.
"""

from __future__ import annotations

import contextlib

import os
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from rag_demo.config import GENERATOR_DTYPES, RagSettings
from rag_demo.measure.bound import Dims, WorkCounter
from rag_demo.models.generators import pad_rows


def streamed_ratio(rec: dict) -> float:
    """Median over questions of a mode's generate time with a streaming listener / without."""
    return statistics.median(b / a for a, b in zip(rec["generate"], rec["generate_streamed"]) if a > 0)

STAGES = ("encode", "retrieve", "generate", "attribute", "total")


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


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def ms(s: float) -> str:
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


def forget_passages(pipe) -> None:
    """Empty every passage cache and every kept hidden state (of the base weights and, once loaded,
    the trained ones): the next question runs as if its passages were never read."""
    trained = getattr(pipe.stack, "_trained", None) or {}
    for mm in [*pipe.stack.modes.values(), *trained.values()]:
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
            say: Callable[[str], None], rates=None, peak=None) -> dict:
    """{mode: {stage: [seconds per question]}, "tokens": [...], "ttft": [...], "generate_streamed":
    [...], "bound": [...], "bound_prefill": [...]}; one warm-up answer per mode first. Each question
    is answered twice in a row, quietly (the stage timings, and with `rates` the least time its
    model calls could take: measure/bound.py; with `peak` too, that least time at the machine's own
    peak rates, "bound_peak") and streamed (time to first token, and the generate time with a
    listener: the cost of streaming, paired question by question)."""
    out = {}
    for mode in modes:
        in_own_thread(pipe.answer, questions[0], mode, settings)  # warm-up: first-call allocations, lazy inits
        rec = {s: [] for s in STAGES}
        rec.update(tokens=[], ttft=[], generate_streamed=[], bound=[], bound_prefill=[], bound_peak=[])
        model = pipe.stack.modes_for(settings.decoding.weights)[mode].generator.model  # the weights that answer
        for i, q in enumerate(questions, 1):
            forget_passages(pipe)  # a question whose passages were never read (7 times re-asks)
            work = WorkCounter(model) if rates is not None else contextlib.nullcontext()
            with work:  # the work this answer's model calls did (measure/bound.py)
                a = in_own_thread(pipe.answer, q, mode, settings)
            if rates is not None:
                total, prefill = work.bound(Dims.of(model), rates)
                rec["bound"].append(total)
                rec["bound_prefill"].append(prefill)
                if peak is not None:
                    rec["bound_peak"].append(work.bound(Dims.of(model), peak)[0])
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


