"""Evaluation: answer a QA file with every mode and score answers and retrieval.

Owns the metrics (SQuAD normalisation, exact match, token F1, DPR-style has_answer and
recall@k), the QA file format and its loader, the evaluation loop behind
`python -m rag_demo eval`, and its report (markdown tables on stdout, JSON on disk).

QA file: JSON Lines, one object per line, `{"question": str, "answers": [str, ...]}`; other
fields (type, topic, source) are kept and used to break results down by question type and by
source.

Reader accuracy given retrieval: each row's EM / F1 / contains also over only the questions
whose K passages that row read hold a gold answer (has_answer on title + text), with their
count n. It measures the generator apart from the retriever: an answer the passages do not hold
is not the reader's fault. Closed-book reads no passages; its given-retrieval numbers are over
the questions whose dense top K hold an answer, for comparison with the dense RAG rows.

Three retrievers are scored the same way: the stack's dense retriever (FAISS over the
passage encoder's vectors), BM25 (bm25.py) and their reciprocal rank fusion (hybrid,
knowledge/retrievers.py). For RAG answers from BM25's or the fusion's passages the doc prior
p(z|x) is the dense question encoder's softmax over those K passages, so the rows differ only
in which passages the generator sees.
"""
from __future__ import annotations

import json
import logging
import math
import platform
import statistics
import sys
from pathlib import Path
from typing import Callable

from rag_demo.config import RagSettings
from rag_demo.knowledge.retrievers import RETRIEVERS  # recall is scored for all three
from rag_demo.measure.metrics import (
    contains_answer,
    exact_match,
    f1_score,
    first_hit,
    has_answer,
    passage_text,
    precision_recall,
    recall_at_k,
)
from rag_demo.questions import QAItem
from rag_demo.models.machine import cpu_flags, cpu_name  # noqa: F401 - cpu_name: where eval's callers have always found it

log = logging.getLogger(__name__)

RECALL_KS = (1, 5, 20)
# The by-source table is printed when sources group the questions (the external file has 3);
# more distinct values than this (the dev set's per-question article title) stay in the JSON.
MAX_SOURCES_SHOWN = 12

# ---------------------------------------------------------------- the run


def machine_info() -> dict:
    import os

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "platform": platform.platform(), "processor": cpu_name(), "cpu_flags": cpu_flags()}
    try:
        info["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def evaluate(
    pipe,
    items: list[QAItem],
    modes: list[str],
    settings: RagSettings,
    retrievers: list[str] = ("dense", "bm25"),
    progress: bool = True,
    say: Callable[[str], None] | None = None,
    partial_path: str | Path | None = None,
) -> dict:
    """Answer every question in every mode (RAG modes once per retriever in `retrievers`),
    score recall@1/5/20 of the three retrievers, EM / F1 / contains per (mode, retriever).
    With `partial_path`, the report of the questions done so far is rewritten after each one
    (a long run stopped early still leaves its numbers).

    Returns the report dict that `format_report` prints and the CLI saves as JSON.
    """
    from tqdm import tqdm

    if not items:
        raise ValueError("no questions to evaluate: pass a QA file with at least one question.")
    n_pass = len(pipe.index)
    if settings.decoding.k > n_pass:
        raise ValueError(f"k={settings.decoding.k} is more than the {n_pass} passages of the corpus: "
                         f"choose k from 1 to {n_pass}.")
    if say:
        say(f"Building the BM25 index of {n_pass} passages ...")
    pipe.indexes.bm25()  # made once here, not inside the first question's timing
    depth = min(max(max(RECALL_KS), settings.decoding.k), n_pass)
    rag_modes = [m for m in modes if m != "closed-book"]
    enc_mode = rag_modes[0] if rag_modes else "token"  # whose question encoder the recall of "dense" uses
    by_encoder = pipe.modes_by_encoder(rag_modes)  # modes that share retrieval (the paper stack has two groups)
    dense_name = f"dense ({pipe.stack.modes[enc_mode].question_encoder.name})"
    ret_names = {"dense": dense_name, "bm25": "BM25 (bm25s, k1=1.5, b=0.75)",
                 "hybrid": "hybrid (dense + BM25, reciprocal rank fusion)"}
    rows = [("closed-book", "-")] if "closed-book" in modes else []
    rows += [(m, r) for r in retrievers for m in rag_modes]
    records = []
    hits: dict[str, list] = {r: [] for r in RETRIEVERS}
    ret_ms: dict[str, list] = {r: [] for r in RETRIEVERS}
    bar = tqdm(items, desc="eval", unit="q", file=sys.stderr, disable=not progress)
    f1_running: dict[str, list] = {}
    for item in bar:
        q = item.question
        rec = {"question": q, "answers": item.answers, **item.meta, "retrieval": {}, "answers_by_row": {}}
        read_hit: dict[str, bool] = {}  # retriever -> do its top K hold an answer
        # retrieval, every retriever, to depth 20
        ranked = {}
        for r in RETRIEVERS:
            got = pipe.retrieve(q, enc_mode, depth, r)
            ret_ms[r].append(1000 * (got.timings["encode"] + got.timings["retrieve"]))
            ranked[r] = got
        for r, got in ranked.items():
            rank = first_hit([passage_text(p) for p in got.passages], item.answers)
            hits[r].append(rank)
            rec["retrieval"][r] = {"first_hit": rank, "top": [p.id for p in got.passages[: settings.decoding.k]]}
            read_hit[r] = rank is not None and rank <= settings.decoding.k
        # generation: the RAG modes of one retriever share its K passages (and one prefill)
        answers = {}
        if "closed-book" in modes:
            answers[("closed-book", "-")] = pipe.answer(q, "closed-book", settings)
        for r in retrievers:
            for group in by_encoder:
                if group[0] == enc_mode:  # the depth-20 search's top K = retrieve(q, mode, K, r)
                    passages, scores = ranked[r].passages[: settings.decoding.k], ranked[r].scores[: settings.decoding.k]
                else:
                    got = pipe.retrieve(q, group[0], settings.decoding.k, r)
                    passages, scores = got.passages, got.scores
                for mode, a in pipe.answer_from_modes(q, group, passages, scores, settings).items():
                    answers[(mode, r)] = a
        for mode, r in rows:
            a = answers[(mode, r)]
            key = f"{mode}|{r}"
            rec["answers_by_row"][key] = {
                "text": a.text, "em": exact_match(a.text, item.answers), "f1": f1_score(a.text, item.answers),
                "contains": contains_answer(a.text, item.answers), "seconds": a.timings["total"],
                "n_tokens": len(a.token_ids), "logprob": a.sequence_logprob,
                # do the passages this row read hold an answer (closed-book: the dense top K's)
                "hit": reader_hit(a.docs, item.answers) if a.docs else read_hit.get("dense"),
                "docs": [{"id": d.id, "title": d.title, "prior": d.prior, "posterior": post}
                         for d, post in zip(a.docs, a.doc_posterior or [None] * len(a.docs))],
                "cues": [c["kind"] for c in a.cues],  # what the page told the reader beside this answer
                "confidence": a.confidence, "signals": a.signals,  # rag_demo/confidence.py
                **({"candidates": a.candidates} if a.candidates else {}),
                **({"drops": a.passage_drop} if a.passage_drop else {}),
            }
            f1_running.setdefault(key, []).append(rec["answers_by_row"][key]["f1"])
        records.append(rec)
        if partial_path is not None:
            done = len(records)
            part = _summarise(pipe, items[:done], modes, retrievers, settings, rows, records,
                              {r: h[:done] for r, h in hits.items()}, ret_ms, ret_names, depth)
            save_report({**part, "partial": f"{done} of {len(items)} questions"}, partial_path)
        short = {k: k.split("|")[0][:3] + ("" if k.endswith(("|dense", "|-")) else "/" + k.split("|")[1]) for k in f1_running}
        bar.set_postfix({short[k]: f"{sum(v) / len(v):.2f}" for k, v in f1_running.items()}, refresh=False)
    bar.close()
    return _summarise(pipe, items, modes, retrievers, settings, rows, records, hits, ret_ms, ret_names, depth)


def reader_hit(docs, golds: list[str]) -> bool:
    """True when one of the passages a mode read (title + text) holds a gold answer."""
    return any(has_answer(passage_text(d), golds) for d in docs)


def answer_scores(res: list[dict]) -> dict:
    """n, EM, F1, contains (means) of per-question answer records."""
    return {"n": len(res), "em": _mean(x["em"] for x in res), "f1": _mean(x["f1"] for x in res),
            "contains": _mean(x["contains"] for x in res)}


def given_retrieval(res: list[dict]) -> dict:
    """Reader accuracy given retrieval: EM / F1 / contains over the records whose passages hold
    an answer (`hit`), and their count n.

    >>> r = [{"em": 1, "f1": 1, "contains": 1, "hit": True}, {"em": 0, "f1": 0.5, "contains": 1, "hit": True},
    ...      {"em": 0, "f1": 0, "contains": 0, "hit": False}]
    >>> given_retrieval(r)
    {'n': 2, 'em': 0.5, 'f1': 0.75, 'contains': 1.0}
    """
    return answer_scores([x for x in res if x.get("hit")])


def faithfulness(res: list[dict]) -> dict:
    """How faithful the attributions are (Cohen-Wang et al. 2024, "ContextCite": the top-k drop
    test at k = 1, and leave-one-out agreement), over answer records carrying "drops" (per
    passage: log p(y|x) minus log p(y|x) without it, `Answer.passage_drop`) and the passages'
    attribution "posterior" (RAG-Token: mean token posterior; RAG-Sequence: p(z|x,y)).

    top_drop: mean drop when the top-attributed passage is taken away; other_drop: mean over
    answers of the mean drop when one of the other passages is; agree: how often the
    top-attributed passage is the one whose removal drops log p(y|x) most. n: answers with at
    least 2 passages. A faithful attribution has top_drop well above other_drop, agree near 1.

    >>> docs = lambda *p: [{"posterior": x} for x in p]
    >>> faithfulness([{"drops": [2.0, 0.5, 0.0], "docs": docs(.7, .2, .1)},
    ...               {"drops": [0.1, 1.0, None], "docs": docs(.6, .3, .1)}])
    {'n': 2, 'top_drop': 1.05, 'other_drop': 0.625, 'agree': 0.5}
    """
    tops, others, agree = [], [], []
    for x in res:
        drops, post = x.get("drops") or [], [d.get("posterior") for d in x.get("docs", [])]
        if len(drops) < 2 or len(post) != len(drops) or any(p is None for p in post):
            continue
        top = max(range(len(post)), key=post.__getitem__)
        if drops[top] is None:
            continue
        rest = [d for z, d in enumerate(drops) if z != top and d is not None]
        tops.append(drops[top])
        others.append(_mean(rest))
        agree.append(float(max(range(len(drops)), key=lambda z: -math.inf if drops[z] is None else drops[z]) == top))
    return {"n": len(tops), "top_drop": _mean(tops), "other_drop": _mean(others), "agree": _mean(agree)}


def cue_quality(res: list[dict]) -> dict:
    """How well the cues beside an answer tell the truth. "the passages may not hold the answer"
    against records whose passages lack a gold answer ("hit" False): flagged, precision = P(lack |
    flagged), recall = P(flagged | lack); "no passage contains these words": how many, and how many
    of them are wrong (no gold answer in the answer, "contains" 0); how many got the not-English cue.

    >>> cue_quality([{"hit": False, "contains": 0, "cues": ["may_lack_answer", "not_in_passages"]},
    ...              {"hit": True, "contains": 1, "cues": ["may_lack_answer"]},
    ...              {"hit": False, "contains": 1, "cues": ["not_in_passages"]},
    ...              {"hit": True, "contains": 1, "cues": ["not_english"]}])
    {'n': 4, 'lacking': 2, 'flagged': 2, 'precision': 0.5, 'recall': 0.5, 'unread': 2, 'unread_wrong': 0.5, 'not_english': 1}
    """
    res = [x for x in res if "cues" in x]
    flagged = [x for x in res if "may_lack_answer" in x["cues"]]
    lacking = [x for x in res if not x.get("hit")]
    unread = [x for x in res if "not_in_passages" in x["cues"]]
    precision, recall = precision_recall(("may_lack_answer" in x["cues"] for x in res), (not x.get("hit") for x in res))
    return {"n": len(res), "lacking": len(lacking), "flagged": len(flagged), "precision": precision, "recall": recall,
            "unread": len(unread), "unread_wrong": _mean(float(not x.get("contains")) for x in unread),
            "not_english": sum("not_english" in x["cues"] for x in res)}


def confidence_quality(res: list[dict]) -> dict:
    """How honest each card's confidence is (rag_demo/confidence.py), measure/calibration.quality over
    the answers that carry one: the "probably wrong" cue against the wrong answers (no gold answer
    contained), its precision = P(wrong | flagged) and recall = P(flagged | wrong), AUROC, Brier, and
    the reliability bins of equal count (mean confidence and share right per bin).

    >>> q = confidence_quality([{"contains": 0, "confidence": 0.1, "cues": ["probably_wrong"]},
    ...                         {"contains": 1, "confidence": 0.9, "cues": []},
    ...                         {"contains": 0, "confidence": 0.7, "cues": []},
    ...                         {"contains": 1, "confidence": 0.15, "cues": ["probably_wrong"]}])
    >>> (q["answers"], q["wrong"], q["flagged"], q["precision"], q["recall"], q["bins"][0]["n"], q["bins"][0]["right"])
    (4, 2, 2, 0.5, 0.5, 1, 0.0)
    """
    from rag_demo.measure.calibration import quality

    res = [x for x in res if x.get("confidence") is not None]
    return quality((x["confidence"] for x in res), (x.get("contains") for x in res),
                   ("probably_wrong" in (x.get("cues") or []) for x in res))


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _summarise(pipe, items, modes, retrievers, settings, rows, records, hits, ret_ms, ret_names, depth) -> dict:
    retrieval = {
        ret_names[r]: {
            **{f"recall@{k}": recall_at_k(hits[r], min(k, depth)) for k in RECALL_KS},
            "ms_per_question_p50": statistics.median(ret_ms[r]),
        }
        for r in RETRIEVERS
    }
    generation = []
    types = sorted({it.type for it in items})
    sources = sorted({str(it.meta["source"]) for it in items if "source" in it.meta})
    for mode, r in rows:
        key = f"{mode}|{r}"
        res = [rec["answers_by_row"][key] for rec in records]
        row = {
            "mode": mode, "retriever": r if r == "-" else ret_names[r],
            "em": _mean(x["em"] for x in res), "f1": _mean(x["f1"] for x in res),
            "contains": _mean(x["contains"] for x in res), "n": len(res),
            "given_retrieval": given_retrieval(res),
            **({"faithfulness": faithfulness(res), "cues": cue_quality(res)} if mode != "closed-book" else {}),
            "confidence": confidence_quality(res),
            "seconds_p50": statistics.median(x["seconds"] for x in res),
            "tokens_mean": _mean(x["n_tokens"] for x in res),
            "by_type": {
                t: {"n": sum(rec.get("type", "?") == t for rec in records),
                    "f1": _mean(x["f1"] for x, rec in zip(res, records) if rec.get("type", "?") == t),
                    "contains": _mean(x["contains"] for x, rec in zip(res, records) if rec.get("type", "?") == t)}
                for t in types
            },
            "by_source": {
                src: {**answer_scores([x for x, rec in zip(res, records) if rec.get("source") == src]),
                      "given_retrieval": given_retrieval([x for x, rec in zip(res, records) if rec.get("source") == src]),
                      "cues": cue_quality([x for x, rec in zip(res, records) if rec.get("source") == src])}
                for src in sources
            },
        }
        generation.append(row)
    return {
        "n_questions": len(items),
        "stack": pipe.stack.describe(),
        "corpus": {"name": pipe.index.corpus.name, "passages": len(pipe.index)},
        "settings": {**settings.to_dict(), "modes": modes, "retrievers": list(retrievers)},
        "retrieval": retrieval,
        "generation": generation,
        "machine": machine_info(),
        "questions": records,
        "notes": [
            "recall@k: a gold answer's tokens occur contiguously in the title + text of a top-k passage "
            "(DPR has_answer; punctuation split off, articles dropped).",
            "EM/F1: SQuAD v1.1 normalisation, max over gold answers. contains: a gold answer's tokens occur "
            "in the prediction (lenient; for chatty generators).",
            "BM25 rows: BM25 picks the K passages; p(z|x) is the dense question encoder's softmax over them.",
            "given retrieval: over the n questions whose K passages that row read hold a gold answer "
            "(closed-book: the dense top K); measures the reader apart from the retriever.",
        ],
    }


# ---------------------------------------------------------------- report


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def format_report(report: dict) -> str:
    """Markdown: a retrieval table, an answer table, and answer F1 by question type."""
    s = report["settings"]
    c = report["corpus"]
    lines = [
        f"### Retrieval ({report['n_questions']} questions, {c['name']}, {c['passages']} passages)",
        "",
        "| retriever | recall@1 | recall@5 | recall@20 | retrieve p50 (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in report["retrieval"].items():
        lines.append(f"| {name} | {_pct(r['recall@1'])} | {_pct(r['recall@5'])} | {_pct(r['recall@20'])} "
                     f"| {r['ms_per_question_p50']:.0f} |")
    copy_floor = (f" (RAG-Token copying from passages with p(z|x) >= {s['copy_min_prior']:g})"
                  if s.get("extractive") and s.get("copy_min_prior") else "")
    lines += [
        "",
        f"### Answers (K={s['k']}, {'greedy' if s['num_beams'] == 1 else 'beam=' + str(s['num_beams'])}, "
        f"max {s['max_new_tokens']} new tokens, RAG-Sequence {s['sequence_decoding']}, "
        f"{s.get('answer_style', 'sentence')} answers, prior temperature {s.get('prior_temperature', 1.0):g}, "
        f"question weight {s.get('question_weight', 0.0):g}, {s.get('worked_examples', 0)} worked examples, "
        f"question {s.get('question_position', 'after')}, "
        f"{'whole passages' if not s.get('passage_sentences') else str(s['passage_sentences']) + ' sentences a passage'}"
        f"{', extractive' if s.get('extractive') else ''}"
        f"{copy_floor}"
        f"{', echoes retried ' + str(s['echo_retries']) + 'x' if s.get('echo_retries') else ''}"
        f"{' (and answers naming the question subject)' if s.get('echo_retries') and s.get('echo_subjects') else ''}"
        f"{', questions recased from the passages' if s.get('recase_question') else ''}"
        f"{', length penalty ' + format(s['length_penalty'], 'g') if s.get('length_penalty', 1.0) != 1.0 else ''}"
        f"{', context contrast ' + format(s['context_contrast'], 'g') if s.get('context_contrast') else ''})",
        "",
        "| mode | passages from | EM | F1 | contains | given retrieval: n | EM | F1 | contains "
        "| s/answer p50 | tokens/answer |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    titles = {"closed-book": "Closed-book", "sequence": "RAG-Sequence", "token": "RAG-Token"}
    for g in report["generation"]:
        gr = g.get("given_retrieval") or {"n": 0, "em": float("nan"), "f1": float("nan"), "contains": float("nan")}
        lines.append(f"| {titles[g['mode']]} | {g['retriever']} | {_pct(g['em'])} | {_pct(g['f1'])} "
                     f"| {_pct(g['contains'])} | {gr['n']} | {_pct(gr['em'])} | {_pct(gr['f1'])} | {_pct(gr['contains'])} "
                     f"| {g['seconds_p50']:.1f} | {g['tokens_mean']:.1f} |")
    gens = report["generation"]
    faithful = [g for g in gens if g.get("faithfulness", {}).get("n")]
    if faithful:
        lines += ["", "### Attribution faithfulness: take the top-attributed passage away (ContextCite top-1 drop)",
                  "", "| mode | passages from | n | drop in log p(y\\|x), top-attributed passage removed "
                  "| mean drop, another passage removed | top-attributed = largest drop |", "|---|---|---:|---:|---:|---:|"]
        for g in faithful:
            f = g["faithfulness"]
            lines.append(f"| {titles[g['mode']]} | {g['retriever']} | {f['n']} | {f['top_drop']:.2f} "
                         f"| {f['other_drop']:.2f} | {_pct(f['agree'])} |")
    cued = [g for g in gens if g.get("cues", {}).get("n")]
    if cued:
        lines += ["", "### Cues: \"the passages may not hold the answer\" against passages that lack a gold answer; "
                  "\"no passage contains these words\" and how often those answers are wrong", "",
                  "| mode | passages from | n | lacking | flagged | precision | recall | not in passages | of them wrong "
                  "| not English |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for g in cued:
            by = g.get("by_source") or {}
            parts = [("all", g["cues"])] + ([(src, b["cues"]) for src, b in by.items()]
                                            if 1 < len(by) <= MAX_SOURCES_SHOWN else [])
            for name, c in parts:
                lines.append(f"| {titles[g['mode']]} | {g['retriever']}{'' if name == 'all' else ', ' + name} | {c['n']} "
                             f"| {c['lacking']} | {c['flagged']} | {_pct(c['precision'])} | {_pct(c['recall'])} "
                             f"| {c['unread']} | {_pct(c['unread_wrong'])} | {c['not_english']} |")
    judged = [g for g in gens if g.get("confidence", {}).get("answers")]
    if judged:
        from rag_demo.measure.calibration import format_confidence

        lines += ["", "### The confidence: the \"probably wrong\" cue against the wrong answers (no gold answer "
                  "contained), and the reliability bins (equal count; answers: mean confidence / share right)", "",
                  format_confidence([{"label": titles[g["mode"]], "mode": g["retriever"], **g["confidence"]}
                                     for g in judged])]
    if gens:
        types = list(gens[0]["by_type"])
        counts = {t: gens[0]["by_type"][t]["n"] for t in types}
        lines += ["", "### F1 / contains by question type", "",
                  "| mode | passages from | " + " | ".join(f"{t} (n={counts[t]})" for t in types) + " |",
                  "|---|---|" + "---:|" * len(types)]
        for g in gens:
            cells = " | ".join(f"{_pct(g['by_type'][t]['f1'])} / {_pct(g['by_type'][t]['contains'])}" for t in types)
            lines.append(f"| {titles[g['mode']]} | {g['retriever']} | {cells} |")
        sources = list(gens[0].get("by_source") or {})
        if len(sources) > MAX_SOURCES_SHOWN:  # e.g. a per-question article title: no grouping to show
            lines += ["", f"(By source: {len(sources)} distinct sources, more than {MAX_SOURCES_SHOWN}; "
                          "the table is in the JSON report only.)"]
        elif sources:
            lines += ["", "### By source: EM / F1 / contains, overall and given retrieval (n)", "",
                      "| mode | passages from | source | n | EM | F1 | contains | n given | EM | F1 | contains |",
                      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for g in gens:
                for src in sources:
                    b = g["by_source"][src]
                    gr = b["given_retrieval"]
                    lines.append(f"| {titles[g['mode']]} | {g['retriever']} | {src} | {b['n']} | {_pct(b['em'])} "
                                 f"| {_pct(b['f1'])} | {_pct(b['contains'])} | {gr['n']} | {_pct(gr['em'])} "
                                 f"| {_pct(gr['f1'])} | {_pct(gr['contains'])} |")
    m = report["machine"]
    lines += ["", f"Machine: {m['processor']}, {m['cpus']} CPUs, torch {m['torch']} ({m['threads']} threads), "
              f"load average at the end {m.get('load_avg', '?')}. Scores in %."]
    lines += [f"- {n}" for n in report["notes"]]
    qa = report.get("qa_file")
    if qa and (qa["skipped"] or qa["dropped"]):
        lines += ["", f"QA file {qa['path']}: {len(qa['skipped'])} row(s) skipped (no usable answer), "
                      f"{len(qa['dropped'])} answer(s) dropped (empty after normalisation):"]
        lines += [f"- {m}" for m in qa["skipped"] + qa["dropped"]]
    return "\n".join(lines)


def save_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    return path
