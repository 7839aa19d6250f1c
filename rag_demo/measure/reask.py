"""`bench` 7: a question asked again with another retrieval temperature, a passage taken away or the
other preset, against the first ask: time to first token, each answer's time, the passage cache.
"""

from __future__ import annotations

import time
from typing import Callable

from rag_demo.config import RagSettings
from rag_demo.measure.latency import (
    forget_passages,
    load_avg,
    passage_caches,
    percentile,
)

# 7: a question asked again with another setting (each a target of its own)
REASKS = {"temperature": "another retrieval temperature", "without": "one passage taken away",
          "preset": "the other preset"}


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


def reask_rows(r: dict) -> dict:
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
