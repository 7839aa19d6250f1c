"""Benchmarks behind `python -m rag_demo bench`: a script that measures and prints, not a test.

Owns the speed and memory numbers of the demo, printed as markdown tables and saved as JSON:

1. latency per stage (encode, retrieve, generate, attribute) and end to end, p50 / p95 over
   N questions of the dev set, per mode, on the loaded stack (offline by default);
2. RAG-Token's decoding overhead: its generate stage over `model.generate` of the same K
   left-padded prompts for the same number of tokens (greedy, min = max new tokens);
3. memory: resident set size after loading, warm (after answering), and peak;
4. index build throughput (passages/s) on a 1,000-passage subset of the corpus;
5. the reference side by side: our engine vs transformers' `RagTokenForGeneration.generate`
   and `RagSequenceForGeneration.generate` on the same random weights (tiny, and "base":
   BERT-base DPR + BART-base, realistic depth), fed the same context ids, mask and doc
   scores; outputs must be equal token for token;
6. cold start to first answer, in a fresh process: with the cached index, and without one
   (a fresh cache folder, so all passages are embedded; `--skip-cold-build` skips it).

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
from pathlib import Path
from typing import Callable

import torch

from .config import RagSettings

STAGES = ("encode", "retrieve", "generate", "attribute", "total")
THROUGHPUT_PASSAGES = 1000

TARGETS = {  # name -> (limit, unit); a measurement passes when it is <= limit
    "RAG-Token p50": (2.5, "s"),
    "RAG-Sequence (thorough) p50": (3.0, "s"),
    "retrieval p50": (0.050, "s"),
    "warm app RSS": (3.0, "GB"),
    "RAG-Token / plain batched generate": (1.15, "x"),
    "engine / transformers RAG (base)": (1.0, "x"),
}


# ---------------------------------------------------------------- small helpers


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


def latency(pipe, questions: list[str], modes: list[str], settings: RagSettings,
            say: Callable[[str], None]) -> dict:
    """{mode: {stage: [seconds per question]}, "tokens": [...]}; one warm-up answer per mode first."""
    out = {}
    for mode in modes:
        pipe.answer(questions[0], mode, settings)  # warm-up: first-call allocations, lazy inits
        rec = {s: [] for s in STAGES}
        rec["tokens"] = []
        for i, q in enumerate(questions, 1):
            a = pipe.answer(q, mode, settings)
            for s in STAGES:
                rec[s].append(a.timings.get(s, 0.0))
            rec["tokens"].append(len(a.token_ids))
            say(f"{mode}: {i}/{len(questions)}  total {a.timings['total']:.1f} s, {len(a.token_ids)} tokens  "
                f"(load {load_avg()})")
        out[mode] = rec
    return out


@torch.inference_mode()
def plain_generate(gen, prompts: list[list[int]], n_tokens: int) -> float:
    """Seconds for `model.generate` of the prompts as one batch, exactly `n_tokens` new tokens, greedy.
    Decoder-only prompts are left-padded, encoder-decoder ones right-padded (as the engine does)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), gen.pad_token_id, dtype=torch.long)  # (K, S)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (K, S)
    left = gen.kind == "decoder-only"
    for r, p in enumerate(prompts):
        sl = slice(width - len(p), width) if left else slice(0, len(p))
        ids[r, sl], mask[r, sl] = torch.tensor(p), 1
    t0 = time.perf_counter()
    gen.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                       do_sample=False, num_beams=1, pad_token_id=gen.pad_token_id)
    return time.perf_counter() - t0


def token_overhead(pipe, questions: list[str], settings: RagSettings, say: Callable[[str], None]) -> dict:
    """RAG-Token generate time vs plain batched generation of the same K prompts, same length."""
    from .engine import rag_token

    mm = pipe.stack.modes["token"]
    gen = mm.generator
    rows = []
    for i, q in enumerate(questions):
        docs, scores, _ = pipe._retrieve(q, mm, settings.k)
        prompts = [gen.prompt(q, p, settings.max_doc_tokens) for p in docs]
        g = rag_token(gen, prompts, scores * mm.score_scale, settings)
        n = len(g.tokens)
        plain = plain_generate(gen, prompts, n)
        if i == 0:  # the first pair warms both paths up; measure again
            g = rag_token(gen, prompts, scores * mm.score_scale, settings)
            plain = plain_generate(gen, prompts, n)
        rows.append({"tokens": n, "rag_generate": g.timings["generate"], "rag_attribute": g.timings["attribute"],
                     "plain": plain})
        say(f"token vs plain generate: {i + 1}/{len(questions)}  {g.timings['generate']:.2f} s vs {plain:.2f} s "
            f"({n} tokens)")
    ratio = [r["rag_generate"] / r["plain"] for r in rows]
    ratio_all = [(r["rag_generate"] + r["rag_attribute"]) / r["plain"] for r in rows]
    return {"rows": rows, "ratio_p50": statistics.median(ratio), "ratio_with_attribution_p50": statistics.median(ratio_all)}


# ---------------------------------------------------------------- 4 index throughput


def index_throughput(pipe, n: int = THROUGHPUT_PASSAGES) -> dict:
    """Embed + index the first n passages of the pipeline's corpus (no cache): passages/s."""
    from .corpus import Corpus
    from .index import build_index

    sub = Corpus(f"first {n}", pipe.index.corpus.passages[:n])
    t0 = time.perf_counter()
    build_index(sub, pipe.stack.ctx_encoder)
    dt = time.perf_counter() - t0
    return {"passages": len(sub), "seconds": dt, "passages_per_s": len(sub) / dt,
            "encoder": pipe.stack.ctx_encoder.name}


# ---------------------------------------------------------------- 5 the reference side by side


def _ctx_tensors(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (n_docs, S) ids and mask: what RagRetriever hands to the generator."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
    return ids, mask


def _hf_tokens(out: torch.Tensor, pad: int, eos: int) -> list[int]:
    """transformers' output row -> our convention: no decoder start token, cut after EOS."""
    toks = out[0, 1:].tolist()
    if eos in toks:
        return toks[: toks.index(eos) + 1]
    while toks and toks[-1] == pad:
        toks.pop()
    return toks


@torch.inference_mode()
def _dpr_scores(q_model, q_tok, c_model, c_tok, question: str, passages: list) -> torch.Tensor:
    """(1, n_docs) DPR scores q(x)·d(z), inputs cut to the encoders' position limit (the tiny
    random DPR has 128 positions, fewer than encoders.MAX_TOKENS)."""
    n = min(256, q_model.config.max_position_embeddings, c_model.config.max_position_embeddings)
    qe = q_tok([question], truncation=True, max_length=n, return_tensors="pt")
    ce = c_tok([p.title for p in passages], [p.text for p in passages], truncation=True, max_length=n,
               padding=True, return_tensors="pt")
    return q_model(**qe).pooler_output @ c_model(**ce).pooler_output.T  # (1, n_docs)


def _paired_times(a, b, reps: int):
    """Median seconds of a() and b() over `reps` rounds, alternating which runs first (so cache
    warmth and clock drift do not favour one side); -> (t_a, result_a, t_b, result_b)."""
    times: dict = {a: [], b: []}
    results: dict = {}
    for i in range(reps):
        for fn in ((a, b) if i % 2 == 0 else (b, a)):
            t0 = time.perf_counter()
            results[fn] = fn()
            times[fn].append(time.perf_counter() - t0)
    return statistics.median(times[a]), results[a], statistics.median(times[b]), results[b]


def compare_with_transformers(paths: dict, cases: list[tuple[str, list]], max_new_tokens: int = 32,
                              reps: int = 1, say: Callable[[str], None] | None = None,
                              full_length: bool = True) -> dict:
    """Our engine vs transformers' RAG generate on the same checkpoint weights.

    paths: make_random_rag_checkpoints(...) folders; cases: (question, passages) with
    len(passages) == the checkpoint's n_docs. Doc scores are the checkpoint's DPR question
    vector · the DPR context vectors. Per mode: same outputs (token lists), median seconds.

    full_length: random BART puts its EOS first on most inputs, so both sides would stop after
    one token and only the prefill would be compared. We add -1e4 to EOS in the generator's
    `final_logits_bias` (one shared module, so both sides see it) and every answer runs to
    `max_new_tokens`.
    """
    from transformers import AutoTokenizer, DPRContextEncoder, RagSequenceForGeneration, RagTokenForGeneration, RagTokenizer

    from .engine import rag_sequence, rag_token
    from .generators import EncoderDecoderGenerator

    ctx = DPRContextEncoder.from_pretrained(str(paths["ctx_encoder"])).eval()
    ctx_tok = AutoTokenizer.from_pretrained(str(paths["ctx_encoder"]))
    result = {}
    for mode, cls, key, run in (("token", RagTokenForGeneration, "rag_token", rag_token),
                                ("sequence", RagSequenceForGeneration, "rag_sequence", rag_sequence)):
        model = cls.from_pretrained(str(paths[key])).eval()
        tok = RagTokenizer.from_pretrained(str(paths[key]))
        n_docs = model.config.n_docs
        gen = EncoderDecoderGenerator(model.rag.generator, tok.generator, max_input_tokens=model.config.max_combined_length)
        if full_length:
            with torch.no_grad():
                model.rag.generator.final_logits_bias[..., gen.eos_token_ids[0]] = -1e4
        # hf_compat_sequence_score: rank RAG-Sequence candidates with the reference's score
        s = RagSettings(k=n_docs, num_beams=1, max_new_tokens=max_new_tokens, hf_compat_sequence_score=True)
        rows = []
        for i, (q, passages) in enumerate(cases):
            if len(passages) != n_docs:
                raise ValueError(f"case {i} has {len(passages)} passages but the checkpoint's n_docs is {n_docs}: "
                                 f"pass exactly n_docs passages per question.")
            doc_scores = _dpr_scores(model.rag.question_encoder, tok.question_encoder, ctx, ctx_tok, q, passages)
            prompts = [gen.prompt(q, p, s.max_doc_tokens) for p in passages]
            ids, mask = _ctx_tensors(prompts, gen.pad_token_id)

            gen_times: list[float] = []  # our generate stage alone, per call

            def ours():
                g = run(gen, prompts, doc_scores[0], s)
                gen_times.append(g.timings["generate"])
                return g

            # RagTokenForGeneration.generate ignores max_new_tokens (it never converts it to a
            # max_length) and stops at max_length, the decoder start token included.
            length = {"max_length": max_new_tokens + 1} if mode == "token" else {"max_new_tokens": max_new_tokens}

            def theirs():
                with torch.inference_mode():
                    return model.generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=doc_scores,
                                          n_docs=n_docs, num_beams=1, do_sample=False, **length)

            if i == 0:  # warm both paths up
                ours(), theirs()
                gen_times.clear()
            t_ours, g, t_hf, out = _paired_times(ours, theirs, reps)
            ref = _hf_tokens(out, gen.pad_token_id, gen.eos_token_ids[0])
            rows.append({"question": q, "same": g.tokens == ref, "ours": g.tokens, "transformers": ref,
                         "ours_s": t_ours, "ours_generate_s": statistics.median(gen_times), "transformers_s": t_hf})
            if say:
                say(f"reference {mode} {i + 1}/{len(cases)}: ours {t_ours:.3f} s, transformers {t_hf:.3f} s, "
                    f"same={rows[-1]['same']}")
        result[mode] = {
            "n_docs": n_docs, "same": all(r["same"] for r in rows), "n": len(rows),
            "ours_s_p50": statistics.median(r["ours_s"] for r in rows),
            "ours_generate_s_p50": statistics.median(r["ours_generate_s"] for r in rows),
            "transformers_s_p50": statistics.median(r["transformers_s"] for r in rows),
            # median over questions of the paired ratio: one question slowed by a noisy
            # neighbour (both sides, same rounds) cannot swing it the way a ratio of sums can
            "ratio": statistics.median(r["ours_s"] / r["transformers_s"] for r in rows),
            "ratio_generate_only": statistics.median(r["ours_generate_s"] / r["transformers_s"] for r in rows),
            "tokens_mean": sum(len(r["ours"]) for r in rows) / len(rows),
            "rows": rows,
        }
    return result


def reference_cases(questions: list[str], n_docs: int, retriever) -> list[tuple[str, list]]:
    """(question, its top n_docs passages) pairs; passages from any retriever with .search(questions, k)."""
    _, passages = retriever.search(questions, n_docs)
    return list(zip(questions, passages))


# ---------------------------------------------------------------- 6 cold start


def cold_start(question: str, cache_dir: Path | None, extra: list[str], timeout: float = 3600) -> dict:
    """Wall seconds for a fresh `python -m rag_demo ask QUESTION --mode token --json` to print its answer."""
    cmd = [sys.executable, "-m", "rag_demo", "ask", question, "--mode", "token", "--json", *extra]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[1])
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"cold start failed ({proc.returncode}): {proc.stderr[-2000:]}")
    answer = json.loads(proc.stdout)["token"]["text"]
    return {"seconds": dt, "answer": answer, "load_avg_after": load_avg()}


# ---------------------------------------------------------------- report


def _p(xs: list[float]) -> str:
    return f"{_ms(percentile(xs, 50))} / {_ms(percentile(xs, 95))}"


def format_results(r: dict) -> str:
    titles = {"closed-book": "Closed-book", "sequence": "RAG-Sequence (thorough)", "token": "RAG-Token"}
    lines = [f"### Latency per stage, ms p50 / p95 over {r['n']} questions "
             f"(stack {r['stack']}, K={r['settings']['k']}, greedy, max {r['settings']['max_new_tokens']} new tokens)",
             "", "| mode | encode | retrieve | generate | attribute | end to end | tokens/answer |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, rec in r["latency"].items():
        lines.append(f"| {titles[mode]} | " + " | ".join(_p(rec[s]) for s in STAGES)
                     + f" | {statistics.mean(rec['tokens']):.1f} |")
    if r.get("token_overhead"):
        t = r["token_overhead"]
        lines += ["", f"RAG-Token generate / plain batched `model.generate` of the same K prompts, same number of "
                      f"tokens (p50 over {len(t['rows'])} questions): **{t['ratio_p50']:.2f}x** "
                      f"({t['ratio_with_attribution_p50']:.2f}x with the attribution pass)."]
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
    if r.get("reference"):
        lines += ["", "### Our engine vs transformers' RAG classes, same weights and inputs", "",
                  "| checkpoint | mode | n_docs | questions | same outputs | ours s p50 | transformers s p50 "
                  "| ours/theirs, median of per-question ratios | same, our generate stage only |",
                  "|---|---|---:|---:|---|---:|---:|---:|---:|"]
        for size, modes in r["reference"].items():
            for mode, x in modes.items():
                lines.append(f"| random {size} | {titles[mode]} | {x['n_docs']} | {x['n']} | "
                             f"{'yes' if x['same'] else 'no'} | {x['ours_s_p50']:.3f} | {x['transformers_s_p50']:.3f} "
                             f"| {x['ratio']:.2f} | {x['ratio_generate_only']:.2f} |")
        same = all(x["same"] for modes in r["reference"].values() for x in modes.values())
        lines.append(f"\nsame outputs: {'yes' if same else 'no'}")
    lines += ["", "### Targets", "", "| target | limit | measured | result |", "|---|---:|---:|---|"]
    for name, t in r["targets"].items():
        lines.append(f"| {name} | <= {t['limit']} {t['unit']} | {t['measured']} | {t['result']} |")
    mc = r["machine"]
    lines += ["", f"Machine: {mc['processor']}, {mc['cpus']} CPUs, torch {mc['torch']} ({mc['threads']} threads). "
                  f"Load average at start {r['load_avg']['start']}, end {r['load_avg']['end']} "
                  f"(the bench's own {mc['threads']} threads count; well above {mc['threads']} means other jobs "
                  "shared the cores and the timings are upper bounds)."]
    return "\n".join(lines)


def _targets(r: dict) -> dict:
    measured = {}
    lat = r["latency"]
    if "token" in lat:
        measured["RAG-Token p50"] = percentile(lat["token"]["total"], 50)
    if "sequence" in lat:
        measured["RAG-Sequence (thorough) p50"] = percentile(lat["sequence"]["total"], 50)
    rag = [m for m in lat if m != "closed-book"]
    if rag:
        measured["retrieval p50"] = percentile(lat[rag[0]]["retrieve"], 50)
    measured["warm app RSS"] = r["memory"]["rss_warm"] / 1e9
    if r.get("token_overhead"):
        measured["RAG-Token / plain batched generate"] = r["token_overhead"]["ratio_p50"]
    if r.get("reference", {}).get("base"):
        measured["engine / transformers RAG (base)"] = max(x["ratio"] for x in r["reference"]["base"].values())
    out = {}
    for name, (limit, unit) in TARGETS.items():
        if name not in measured:
            out[name] = {"limit": limit, "unit": unit, "measured": "not run", "result": "-"}
            continue
        v = measured[name]
        shown = f"{v * 1000:.0f} ms" if unit == "s" and limit < 1 else f"{v:.2f} {unit}"
        out[name] = {"limit": limit, "unit": unit, "measured": shown, "value": v,
                     "result": "PASS" if v <= limit else "FAIL"}
    return out


def run_bench(args, spec, say: Callable[[str], None]) -> int:
    """The `bench` command: see the module docstring for what runs, in that order."""
    from .bm25 import BM25Retriever
    from .evaluate import load_qa, machine_info, parse_modes
    from .pipeline import RagPipeline
    from .random_models import make_random_rag_checkpoints

    if args.n < 1:
        raise ValueError(f"--n {args.n} is out of range: use 1 or more questions.")
    questions = [it.question for it in load_qa(args.qa)][: args.n]
    modes = parse_modes(args.modes)
    settings = RagSettings()
    r: dict = {"n": len(questions), "settings": {"k": settings.k, "max_new_tokens": settings.max_new_tokens},
               "load_avg": {"start": load_avg()}, "machine": machine_info()}
    pipe = RagPipeline.load(spec, settings=settings, progress=say)
    r["stack"] = pipe.stack.describe()
    r["memory"] = {"rss_loaded": rss_bytes()}
    r["latency"] = latency(pipe, questions, modes, settings, say)
    if "token" in modes and not args.skip_reference:
        r["token_overhead"] = token_overhead(pipe, questions[: max(1, min(len(questions), args.reference_n))],
                                             settings, say)
    r["memory"].update(rss_warm=rss_bytes(), peak_warm=peak_rss_bytes())
    say("Index build throughput ...")
    r["throughput"] = index_throughput(pipe)
    if not args.skip_reference:
        bm25 = BM25Retriever(pipe.index.corpus)
        r["reference"] = {}
        with tempfile.TemporaryDirectory(prefix="rag-bench-ckpt-") as root:
            for size, n_docs in (("tiny", 3), ("base", settings.k)):
                say(f"Reference comparison on random {size} checkpoints (n_docs={n_docs}) ...")
                paths = make_random_rag_checkpoints(Path(root), size=size, n_docs=n_docs)
                cases = reference_cases(questions[: args.reference_n], n_docs, bm25)
                res = compare_with_transformers(paths, cases, settings.max_new_tokens,
                                                reps=5 if size == "tiny" else 3, say=say)
                for x in res.values():
                    x["rows"] = [{k: v for k, v in row.items() if k not in ("ours", "transformers")} | {
                        "tokens": len(row["ours"])} for row in x["rows"]]
                r["reference"][size] = res
    r["memory"]["peak_end"] = peak_rss_bytes()
    del pipe
    r["cold"] = {}
    extra = ["--stack", spec.name, "--generator-dtype", spec.generator_dtype]
    if spec.name == "paper":
        extra += ["--rag-token", spec.rag_token, "--rag-sequence", spec.rag_sequence, "--ctx-encoder", spec.ctx_encoder]
    say("Cold start with the cached index ...")
    r["cold"]["cold_cached"] = cold_start(questions[0], Path(spec.cache_dir), extra)
    if not args.skip_cold_build:
        say("Cold start without a cache (embeds every passage; minutes) ...")
        with tempfile.TemporaryDirectory(prefix="rag-bench-cache-") as tmp:
            r["cold"]["cold_uncached"] = cold_start(questions[0], Path(tmp), extra)
    r["load_avg"]["end"] = load_avg()
    r["targets"] = _targets(r)
    print(format_results(r))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1, default=str), encoding="utf-8")
    say(f"Saved {out}")
    return 0
