"""How the question tower generalises: the retriever stage's map trained on four fifths of its
examples, its recall@1/5/20 over the whole index measured each epoch on the fifth it never saw (all
from the train split: no calibrate or report question is read). Reads the stage's scored pools
(runs/train/pool_scores.pt, written by `python -m rag_demo train --retriever-only`).

    python experiments/question_tower.py [--epochs 20] [--lr 1e-3] [--wd 0.0] [--pool 20] [--batch 16]
"""
from __future__ import annotations

import argparse
import random

import numpy as np
import torch

import _shared  # noqa: F401 - puts the repository on the path
from rag_demo.models.stack_spec import StackSpec
from rag_demo.knowledge.corpus import load_vital_articles
from rag_demo.knowledge.index import load_or_build_index
from rag_demo.measure.metrics import first_hit, passage_text
from rag_demo.models.encoders import MiniLMEncoder
from rag_demo.models.stacks import MINILM_SCORE_SCALE, resolve_dtype
from rag_demo.models.trained import QuestionMap
from rag_demo.rag.marginalize import rag_nll
from rag_demo.splits import hash_fraction
from rag_demo.training.examples import make_examples
from rag_demo.training.run import informative, read_pairs
from rag_demo.training.steps import retrieve


def recall(qmap, examples, qvecs, index, ks=(1, 5, 20)) -> list[int]:
    with torch.no_grad():
        mapped = qmap(torch.as_tensor(qvecs)).numpy()
    _, rows = index.search_rows(mapped, max(ks))
    ranks = [first_hit([passage_text(index.corpus.passages[int(r)]) for r in row], [e.target]) for row, e in
             zip(rows, examples)]
    return [sum(r is not None and r <= k for r in ranks) for k in ks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--pool", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    spec = StackSpec()
    corpus = load_vital_articles(cache_dir=spec.cache_dir)
    enc = MiniLMEncoder(passage_dtype=resolve_dtype(spec.passage_dtype))
    index, _ = load_or_build_index(corpus, enc, spec.cache_dir)
    examples = informative(make_examples(read_pairs("runs/train/pairs.jsonl"), enc, index, 20), 0)
    lp = torch.load("runs/train/pool_scores.pt")["lp"]
    held = [e for e in examples if hash_fraction("tower|" + e.question) < 0.2]
    train = [e for e in examples if hash_fraction("tower|" + e.question) >= 0.2]
    E = torch.tensor(np.asarray(index.embeddings))
    qmap = QuestionMap(E.shape[1])
    opt = torch.optim.AdamW(qmap.parameters(), lr=a.lr, weight_decay=a.wd)
    hq = np.stack([e.qvec for e in held])
    ext = [i for i, e in enumerate(held) if e.kind == "external"]
    print(f"{len(train)} training, {len(held)} held out ({len(ext)} external)")
    for epoch in range(a.epochs + 1):
        r_all = recall(qmap, held, hq, index)
        r_ext = recall(qmap, [held[i] for i in ext], hq[ext], index)
        print(f"epoch {epoch:2d}: held-out recall@1/5/20 all {r_all}, external {r_ext}, |A| {qmap.A.norm():.3f}")
        if epoch == a.epochs:
            break
        order = list(train)
        random.Random(epoch).shuffle(order)
        for b in range(0, len(order), a.batch):
            opt.zero_grad()
            loss = 0.0
            for e in order[b: b + a.batch]:
                pool = torch.tensor(e.pool[: a.pool])
                rows, prior = retrieve(qmap, torch.as_tensor(e.qvec), E, len(pool), MINILM_SCORE_SCALE, pool)
                where = {int(r): i for i, r in enumerate(pool)}
                loss = loss + rag_nll(lp[e.question][[where[int(r)] for r in rows]], prior, loss="both")
            (loss / a.batch).backward()
            opt.step()


if __name__ == "__main__":
    main()
