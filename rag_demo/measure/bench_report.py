"""`bench`'s report: the markdown tables printed and the targets each number is held to.
"""

from __future__ import annotations

import statistics

from rag_demo.measure.cold_start import format_cold_starts
from rag_demo.measure.latency import STAGES, gb, ms, percentile, streamed_ratio
from rag_demo.measure.reask import REASKS, reask_rows

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
for _k, _what in REASKS.items():
    TARGETS[f"re-ask, {_what}: time to first token p50"] = (0.3, "s", "max")
    TARGETS[f"re-ask, {_what}: slowest answer's speed-up p50"] = (2.0, "x", "min")


# ---------------------------------------------------------------- report


def p50_p95(xs: list[float]) -> str:
    return f"{ms(percentile(xs, 50))} / {ms(percentile(xs, 95))}"


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
        lines.append(f"| {titles[mode]} | {dtype} | " + " | ".join(p50_p95(rec[s]) for s in STAGES)
                     + f" | {statistics.mean(rec['tokens']):.1f} |")
    if rows and all("ttft" in rec for _, _, rec in rows):
        lines += ["", "Streaming (each question answered again with a listener): time from the call to the first "
                      "partial answer holding a token, and the generate stage with the listener against without, "
                      "p50 of the per-question ratios.", "",
                  "| mode | generator | time to first token p50 / p95, ms | streamed / quiet generate p50 |",
                  "|---|---|---:|---:|"]
        for mode, dtype, rec in rows:
            lines.append(f"| {titles[mode]} | {dtype} | {p50_p95(rec['ttft'])} | {streamed_ratio(rec):.3f}x |")
    if r.get("bound"):
        lines += ["", f"Against this CPU's own limit ({r['machine'].get('processor')}): each answer's generation time "
                      "(all but encode and retrieve) over the least time its model calls could take at the rates "
                      "measured here (measure/bound.py), p50 and p95 of the per-answer multiples; first token against "
                      "the prefill's bound.", "",
                  "| mode | generator | rates: prefill / decode GFLOP/s, read GB/s | generation p50 / p95 s "
                  "| bound p50 s | multiple p50 / p95 | first token / prefill bound p50 / p95 |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for dtype, modes in r["bound"].items():
            rt = r["rates"][dtype]
            for mode, b in modes.items():
                lines.append(f"| {titles.get(mode, mode)} | {dtype} | {rt['prefill_gflops']:.0f} / {rt['decode_gflops']:.0f}"
                             f", {rt['read_gbs']:.1f} | {b['p50']:.2f} / {b['p95']:.2f} | {b['bound_p50']:.2f} "
                             f"| {b['multiple_p50']:.2f}x / {b['multiple_p95']:.2f}x "
                             f"| {b['ttft_multiple_p50']:.2f}x / {b['ttft_multiple_p95']:.2f}x |")
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
        by_dtype = {dtype: reask_rows(x) for dtype, x in r["reask"].items()}
        for name in names:
            for dtype, table in by_dtype.items():
                if name not in table:
                    continue
                ttft, total, up, per_mode, hits, misses, peak, h_hits, h_misses, h_peak, same = table[name]
                modes = ", ".join(f"{m} {x:.2f}x" for m, x in per_mode.items()) or "-"
                lines.append(f"| {names[name]} | {dtype} | {ms(ttft)} | {ms(total)} "
                             f"| {'-' if up is None else f'{up:.2f}x'} | {modes} | {hits} / {misses} "
                             f"| {peak / 2**20:.1f} | {h_hits} / {h_misses} | {h_peak / 2**20:.1f} "
                             f"| {'-' if same is None else f'{same[0]} / {same[1]}'} |")
        bound = max(x["max_bytes"] for x in r["reask"].values())
        h_bound = max(x.get("hidden_max_bytes", 0) for x in r["reask"].values())
        lines.append(f"\nBounds per generator: passage cache {bound / 2**20:.0f} MB, hidden states {h_bound / 2**20:.0f} MB.")
    m = r["memory"]
    lines += ["", "### Memory and start-up", "", "| what | value |", "|---|---:|",
              *([f"| RSS with the libraries imported, nothing loaded | {gb(m['rss_imports'])} |"]
                if m.get("rss_imports") else []),
              f"| RSS after loading the stack and index | {gb(m['rss_loaded'])} |",
              f"| warm app RSS (warmed up as the app is, freed memory given back) | {gb(m['rss_warm'])} |",
              *(f"| of which {name} | {gb(n)} |" for name, n in (m.get("parts_warm") or {}).items()),
              *([f"| RSS after the latency questions (freed memory given back) | {gb(m['rss_after_questions'])} |",
                 *(f"| of which {name} | {gb(n)} |" for name, n in m["parts_after_questions"].items())]
                if m.get("rss_after_questions") else []),
              f"| peak RSS by the end of the warm-up | {gb(m['peak_warm'])} |",
              f"| peak RSS (whole bench, reference models included) | {gb(m['peak_end'])} |"]
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
    return "\n".join(lines + targets_and_machine(r))


def format_cold_only(r: dict) -> str:
    """`bench --cold-only`: the cold starts, the targets they measure, the machine."""
    lines = ["### Cold starts with an empty cache", "", "| what | value |", "|---|---:|",
             f"| CLI `ask`, to the first answer (embeds every passage first) | {r['cold']['cold_uncached']['seconds']:.1f} s |"]
    lines += format_cold_starts(r["cold"])
    targets = {k: t for k, t in r["targets"].items() if "cold start" in k}
    return "\n".join(lines + targets_and_machine({**r, "targets": targets}))


def targets_and_machine(r: dict) -> list[str]:
    lines = ["", "### Targets", "", "| target | limit | measured | result |", "|---|---:|---:|---|"]
    for name, t in r["targets"].items():
        lines.append(f"| {name} | {t['bound']} {t['limit']:g} {t['unit']} | {t['measured']} | {t['result']} |")
    mc = r["machine"]
    lines += ["", f"Machine: {mc['processor']}, {mc['cpus']} CPUs, torch {mc['torch']} ({mc['threads']} threads). "
                  f"Load average at start {r['load_avg']['start']}, end {r['load_avg']['end']} "
                  f"(the bench's own {mc['threads']} threads count; well above {mc['threads']} means other jobs "
                  "shared the cores and the timings are upper bounds)."]
    return lines


def targets(r: dict) -> dict:
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
    for name, (ttft, _, up, *_) in reask_rows(reask).items():
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
