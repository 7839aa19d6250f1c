"""Search error or model error? RAG-Token's misses, each gold answer scored by the model itself.

For every question of an `eval --out` run whose RAG-Token answer (dense passages) missed while
its passages held a gold answer, the question is answered again with the run's defaults and,
where RAG-Token ranks its candidates (engine.rank_by_rag_token), each gold answer written as a
short answer (" Gold.") is scored too, by the exact RAG-Token log p(y|x) under all K passages.
A gold answer that scores above the chosen one is a search error (the model prefers it, its
candidates did not hold it); below, the model itself prefers its wrong answer.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/token_misses.py runs/a.json

Prints one JSON line a miss, then the counts. Analysis only: it reads the gold answers, so
nothing it finds may be used on single questions.
"""
from __future__ import annotations

import json
import sys

import rag_demo.rag.engine as engine
from rag_demo.measure.evaluate import has_answer
from rag_demo.pipeline import RagPipeline


def main(path: str) -> None:
    run = json.load(open(path))
    pipe = RagPipeline.load()
    gen = pipe.stack.modes["token"].generator
    seen: dict = {}
    rank = engine.rank_by_rag_token

    def scored_rank(gen_, state0, first_lp, cands, prior, stop=None):
        golds = [gen.title_answer_ids(g) for g in seen["golds"]]
        every = cands + golds
        lp, _ = engine.score_candidates(gen_, state0, first_lp, every, gen_.pad_token_id)  # (K, C, T)
        seen["scores"] = [float(engine.rag_token_logprob(lp[:, c, : len(t)], prior)) if t else float("-inf")
                          for c, t in enumerate(every)]
        seen["texts"], seen["n"] = [gen.tokenizer.decode(t) for t in every], len(cands)
        return rank(gen_, state0, first_lp, cands, prior, stop)

    engine.rank_by_rag_token = scored_rank
    rows = []
    for q in run["questions"]:
        a = q["answers_by_row"].get("token|dense")
        if a is None or not a.get("hit") or a["contains"]:
            continue
        seen.clear()
        seen["golds"] = q["answers"]
        pipe.answer(q["question"], "token")
        if "scores" not in seen:  # the drafts were cut short: no ranking
            continue
        sc, n, texts = seen["scores"], seen["n"], seen["texts"]
        best = max(range(n), key=lambda c: sc[c])
        gold = max(range(n, len(sc)), key=lambda c: sc[c])
        row = dict(question=q["question"], chosen=texts[best], chosen_lp=round(sc[best], 3), gold=texts[gold],
                   gold_lp=round(sc[gold], 3), gold_in_candidates=any(has_answer(texts[c], q["answers"]) for c in range(n)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    above = [r for r in rows if r["gold_lp"] > r["chosen_lp"]]
    print(f"{len(rows)} misses ranked; a gold answer scores above the chosen one in {len(above)} "
          f"({sum(r['gold_in_candidates'] for r in above)} of them among the candidates); "
          f"a gold answer among the candidates in {sum(r['gold_in_candidates'] for r in rows)}")


if __name__ == "__main__":
    main(sys.argv[1])
