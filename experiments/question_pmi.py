"""Does the question make the answer likelier? A probe for the "probably wrong" cue (docs/results.md §8).

The confidence cannot see a copy of the wrong span from the right passage: such an answer has a
high log p(y|x), one passage carrying it and its words in that passage. One more number might:
how much the question itself raises the answer's likelihood under the top passage,

    PMI = log p(y | question, z_1) - log p(y | "What does the passage say?", z_1)

(y teacher-forced under the aided preset's prompt, z_1 the top dense passage). An answer the
reader copies because the passage makes it salient, whatever was asked, would have a low PMI.
This prints the AUROC, right against wrong, of log p(y | question, z_1) and of PMI over the
answers of a sweep file (`eval --sweep` rows, RAG-Token at K = --k, `contains` as right).

    python experiments/question_pmi.py assets/results/qa_train_vital.jsonl ../shared/data/qa_train_vital.jsonl
    python experiments/question_pmi.py --tiny     # smoke run on the fixture passages
"""
from __future__ import annotations

import argparse
import sys

from _shared import TINY_HELP, TINY_QA, tiny_pipeline

GENERIC = "What does the passage say?"


def log_likelihood(gen, question: str, passage, answer: str) -> float:
    """log p(answer | the aided prompt of question and passage), teacher-forced."""
    from rag_demo.config import RagSettings
    from rag_demo.rag.decoding import score_candidates
    from rag_demo.reader.reading import prompt

    s = RagSettings(preset="aided")
    ids = gen.tokenizer.encode(" " + answer.strip(), add_special_tokens=False)
    first, state = gen.prefill([prompt(gen, question, passage, s.decoding, s.aids)])  # (1, V)
    lp, _ = score_candidates(gen, state, first, [ids], gen.pad_token_id)  # (1, 1, T)
    return float(lp[0, 0, : len(ids)].sum())


def probe(pipe, items: list[tuple[str, str, float]]) -> list[dict]:
    """items: (question, answer, right 0/1) -> each with log p(y|q,z1), log p(y|generic,z1), PMI."""
    gen = pipe.stack.modes["token"].generator
    out = []
    for question, answer, right in items:
        top = pipe.retrieve(question, "token", k=1).passages[0]
        lp_q, lp_0 = log_likelihood(gen, question, top, answer), log_likelihood(gen, GENERIC, top, answer)
        out.append({"right": right, "lp_q": lp_q, "lp_0": lp_0, "pmi": lp_q - lp_0})
    return out


def report(rows: list[dict]) -> None:
    import numpy as np

    from rag_demo.measure.calibration import auroc

    right = np.array([r["right"] for r in rows])
    print(f"{len(rows)} answers, {int(right.sum())} right")
    print("| signal | AUROC, right against wrong |\n|---|---:|")
    for name in ("lp_q", "pmi"):
        print(f"| {name} | {auroc(np.array([r[name] for r in rows]), right):.3f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", nargs="?", help="an eval --sweep rows file (JSON Lines)")
    ap.add_argument("qa", nargs="?", help="the QA file its question ids come from")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP)
    args = ap.parse_args(argv)
    if args.tiny:
        pipe = tiny_pipeline()
        items = [(q, a[0] if i == 0 else "Paris", float(i == 0 or a[0] == "Paris")) for i, (q, a) in enumerate(TINY_QA)]
    else:
        if not (args.rows and args.qa):
            ap.error("give a rows file and its QA file (or --tiny)")
        import pandas as pd

        from rag_demo.questions import load_qa
        from rag_demo.measure.sweep import question_id
        from rag_demo.pipeline import RagPipeline

        questions = {question_id(item): item.question for item in load_qa(args.qa)}
        rows = pd.read_json(args.rows, lines=True)
        rows = rows[(rows["mode"] == "token") & (rows["k"] == args.k) & rows["answer"].notna()]
        pipe = RagPipeline.load()
        items = [(questions[r.question_id], r.answer, float(r.contains > 0)) for r in rows.itertuples()]
    report(probe(pipe, items))
    return 0


if __name__ == "__main__":
    sys.exit(main())
