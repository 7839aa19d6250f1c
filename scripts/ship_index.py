"""Make the shipped indexes (rag_demo/knowledge/shipped.py): the passage vectors of the built-in
corpora by the offline stack's passage encoder, read from the index cache or embedded now, stored in
float16 under assets/indexes/ with what made them. A corpus's earlier shipped index is replaced.

    .venv/bin/python scripts/ship_index.py [--corpora vital,factbook] [--passage-dtype auto] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from the checkout

from rag_demo.models.stack_spec import StackSpec
from rag_demo.knowledge.corpus import load_vital_articles
from rag_demo.knowledge.factbook import load_factbook
from rag_demo.knowledge.index import load_or_build_index
from rag_demo.knowledge.shipped import SHIPPED_DIR, write_shipped
from rag_demo.models.encoders import MiniLMEncoder
from rag_demo.models.machine import cpu_name
from rag_demo.models.stacks import resolve_dtype

CORPORA = {"vital": load_vital_articles, "factbook": load_factbook}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", default="vital,factbook", help=f"comma-separated: {', '.join(CORPORA)}")
    ap.add_argument("--passage-dtype", default="auto", help="float32, bfloat16 or auto (bfloat16 where native)")
    ap.add_argument("--out", type=Path, default=SHIPPED_DIR)
    a = ap.parse_args()
    spec = StackSpec()
    encoder = MiniLMEncoder(passage_dtype=resolve_dtype(a.passage_dtype))
    for name in a.corpora.split(","):
        if name not in CORPORA:
            raise SystemExit(f"unknown corpus {name!r}: use one of {', '.join(CORPORA)}")
        corpus = CORPORA[name]()
        index, info = load_or_build_index(corpus, encoder, spec.cache_dir, shipped_dir=None)
        for old in a.out.glob("*/meta.json"):  # this corpus's earlier shipped index goes
            if json.loads(old.read_text(encoding="utf-8")).get("corpus") == corpus.name:
                shutil.rmtree(old.parent)
        folder = write_shipped(corpus, encoder, index.embeddings, a.out, about={
            "command": "python scripts/ship_index.py " + " ".join(sys.argv[1:]), "cpu": cpu_name(),
            "torch": torch.__version__, "date": datetime.date.today().isoformat(), "vectors_from": info.source})
        size = (folder / "embeddings.npy").stat().st_size
        print(f"{corpus.name}: {len(corpus):,} passages -> {folder} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
