"""Markdown tables from experiments/reader_variants.py's per-question JSONL files, over the questions
every file answered.

    python experiments/reader_variants_table.py "short=runs/short.jsonl" "label*=runs/label.jsonl"

A label ending in '*' also gets RAG-Token and closed-book re-scored with the text cut at the first
'. ' (and ','), which is what greedy decoding with those stop tokens would give; not RAG-Sequence,
whose rescoring would change.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import _shared  # noqa: F401 - puts the repository on sys.path

CUTS = ("as generated", "cut at '. '", "cut at '. ' or ','")


def cut(text: str, how: str) -> str:
    if how == "as generated":
        return text
    t = text.split("\n")[0]
    m = re.search(r"\.(\s|$)", t)
    t = t[: m.start()] if m else t
    if how == CUTS[2]:  # (an earlier version never cut at ',': it tested for "comma")
        t = t.split(",")[0]
    return t


def pct(v: float) -> str:
    return "-" if v != v else f"{100 * v:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 epilog="A label ending in '*' also gets the simulated cuts (see the module's docstring).")
    ap.add_argument("files", nargs="+", metavar="LABEL=FILE.jsonl", help="reader_variants.py's OUT.jsonl files")
    args = ap.parse_args(argv)
    from rag_demo.measure import evaluate as ev

    files = []
    for arg in args.files:
        label, _, path = arg.rpartition("=")
        if not label or not path:
            ap.error(f"{arg!r}: give LABEL=FILE.jsonl")
        files.append((label, path))
    data, common = {}, None
    for label, path in files:
        with open(path, encoding="utf-8") as fh:
            data[label] = {(r.get("file", "ext"), r["question"]): r for r in map(json.loads, filter(str.strip, fh))}
        common = set(data[label]) if common is None else common & set(data[label])
    print(f"Questions every variant answered: {len(common)}\n")
    print("| variant | file | mode | n | EM | F1 | contains | n given | EM | F1 | contains | tokens/answer |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, _ in files:
        for how in CUTS if label.endswith("*") else CUTS[:1]:
            for fname in ("ext", "dev"):
                qs = [data[label][key] for key in sorted(common) if key[0] == fname]
                if not qs:
                    continue
                for mode in ("closed-book", "sequence", "token"):
                    if mode not in qs[0]["rows"] or (how != "as generated" and mode == "sequence"):
                        continue  # not run, or not exact for RAG-Sequence
                    res = []
                    for r in qs:
                        x = r["rows"][mode]
                        t = cut(x["text"], how)
                        res.append({"em": ev.exact_match(t, r["answers"]), "f1": ev.f1_score(t, r["answers"]),
                                    "contains": ev.contains_answer(t, r["answers"]), "hit": r["hit"],
                                    "tok": x["n_tokens"]})
                    al, gv = ev.answer_scores(res), ev.given_retrieval(res)
                    name = label.rstrip("*") + ("" if how == "as generated" else f" ({how}, simulated)")
                    print(f"| {name} | {fname} | {mode} | {al['n']} | {pct(al['em'])} | {pct(al['f1'])} "
                          f"| {pct(al['contains'])} | {gv['n']} | {pct(gv['em'])} | {pct(gv['f1'])} "
                          f"| {pct(gv['contains'])} | {sum(x['tok'] for x in res) / len(res):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
