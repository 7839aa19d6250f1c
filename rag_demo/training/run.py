"""`python -m rag_demo train`: the pairs made (or read back), the models loaded, one stage trained,
and what ships written with its meta (the command, the data's hash, the seed, the CPU, the wall
time) and its training curve. Checkpoints and the pair file stay in the work folder (not shipped).
"""
from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from rag_demo.config import StackSpec
from rag_demo.measure.evaluate import cpu_name
from rag_demo.measure.qa_files import load_qa
from rag_demo.models.trained import MAP_FILE, META_FILE, QuestionMap, sha256_file, shipped_files
from rag_demo.splits import in_split
from rag_demo.training.examples import make_examples
from rag_demo.training.loop import Trainer, TrainSettings, write_curve
from rag_demo.training.pairs import Pair, corpus_pairs, file_hash, sample_pairs

# corpus pairs per rule (every one of a rule with fewer): the definitions are plentiful and all
# answer with a title, so they are held to a share like the others
PAIR_COUNTS = {"definition": 400, "relation": 1000, "year": 400, "number": 300, "agent": 1000}


def make_pair_file(path: Path, qa_path: Path, passages, seed: int) -> dict:
    """Write the pairs (the QA file's train split, then the corpus rules' sample) to `path` and
    their meta beside it (`path`.meta.json: how each kind was made, how many); -> the meta."""
    external = [Pair(it.question, it.answers, "external", str(it.meta["id"]))
                for it in in_split(load_qa(qa_path), "train")]
    made = corpus_pairs(passages)
    pairs = external + sample_pairs(made, PAIR_COUNTS, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.to_json() + "\n" for p in pairs), encoding="utf-8")
    meta = {
        "what": "question-answer pairs for `python -m rag_demo train` (rag_demo/training/pairs.py)",
        "qa": {"file": str(qa_path), "sha256": file_hash(qa_path), "split": "train", "pairs": len(external)},
        "corpus_rules": {k: {"made": len(v), "sampled": min(PAIR_COUNTS[k], len({p.source for p in v}))}
                         for k, v in made.items()},
        "seed": seed, "pairs": len(pairs), "sha256": file_hash(path),
        "how": {"external": "the train split of the QA file (rag_demo/splits.py), its gold answers",
                "definition": "an article's first sentence 'X is a ...' asked as 'What is a ...?', answer X",
                "relation": "'Its capital is Y' in X's passage asked as 'What is the capital of X?', answer Y",
                "year": "a sentence with one year 'in 1889' asked with 'in what year'",
                "number": "a sentence with one count '16 states' asked with 'how many states'",
                "agent": "a sentence 'written by NAME' asked with 'by whom'"},
    }
    Path(str(path) + ".meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


def informative(examples: list, seed: int) -> list:
    """The retriever stage's examples: every external one, every corpus pair the frozen retriever
    does not already rank first, and half as many it does (drawn by the seed) so the tower keeps what
    it gets right. A corpus question made from its passage's own sentence is nearly always found
    first: scoring all of them would cost most of the stage and teach it little."""
    import random

    hard = [e for e in examples if e.kind == "external" or e.hit > 1]
    easy = [e for e in examples if e.kind != "external" and e.hit == 1]
    keep = set(id(e) for e in hard + random.Random(seed).sample(easy, min(len(easy), len(hard) // 2)))
    return [e for e in examples if id(e) in keep]


def read_pairs(path: Path) -> list[Pair]:
    return [Pair(**json.loads(line)) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def train_stage(settings: TrainSettings, out: Path, work: Path, qa_path: Path, command: str,
                spec: StackSpec | None = None, say: Callable[[str], None] = print) -> dict:
    """Train one stage and write what ships into `out`; -> this stage's meta entry."""
    from rag_demo.knowledge.corpus import load_vital_articles
    from rag_demo.knowledge.index import load_or_build_index
    from rag_demo.models.decoder_only import DecoderOnlyGenerator
    from rag_demo.models.encoders import MiniLMEncoder
    from rag_demo.models.stacks import MINILM_SCORE_SCALE, load_smollm, resolve_dtype, smollm_weights

    spec = spec or StackSpec()
    out, work = Path(out), Path(work)
    t0 = time.time()
    say("Loading the corpus, the retriever and its index ...")
    corpus = load_vital_articles(cache_dir=spec.cache_dir)
    encoder = MiniLMEncoder(passage_dtype=resolve_dtype(spec.passage_dtype))  # the app's index on this CPU
    index, _ = load_or_build_index(corpus, encoder, spec.cache_dir)
    pairs_path = work / "pairs.jsonl"
    meta_path = Path(str(pairs_path) + ".meta.json")
    old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if (not pairs_path.is_file() or old.get("seed") != settings.seed
            or old.get("qa", {}).get("sha256") != file_hash(qa_path) or old.get("sha256") != file_hash(pairs_path)):
        say("Making question-answer pairs from the corpus and the QA file's train split ...")
        make_pair_file(pairs_path, qa_path, corpus.passages, settings.seed)
    pair_meta = json.loads(meta_path.read_text())
    pairs = read_pairs(pairs_path)
    qmap = QuestionMap.load(out / MAP_FILE) if settings.stage == "reader" and (out / MAP_FILE).is_file() else None
    depth = settings.pool if settings.stage == "retriever" else settings.k
    say(f"Retrieving the top {depth} passages of {len(pairs):,} pairs ...")
    examples = make_examples(pairs, encoder, index, depth, qmap)
    if settings.stage == "retriever":
        examples = informative(examples, settings.seed)
    if settings.stage == "reader":
        say("Loading SmolLM2 in float32 (the weights the adapters train on) ...")
        tok, model = smollm_weights(spec)
        gen = DecoderOnlyGenerator(model, tok, name="SmolLM2-135M-Instruct (float32)", passage_cache_bytes=0,
                                   hidden_cache_bytes=0)
    else:
        say("Loading SmolLM2 as the demo answers with it (its scores of each pool are the frozen generator's) ...")
        # nothing kept between questions: pools seldom share a passage, and the kept states only grew
        gen = load_smollm(dataclasses.replace(spec, passage_cache_mb=0, hidden_cache_mb=0))
    trainer = Trainer(gen, index.embeddings, corpus.passages, examples, settings, work, MINILM_SCORE_SCALE, qmap,
                      data_hash=pair_meta["sha256"])
    resumed = trainer.resume()
    say(f"{'Resuming at step ' + str(trainer.step) if resumed else 'Starting'}: {len(trainer.train):,} examples "
        f"({len(trainer.held)} held out), {trainer.total:,} optimizer steps")
    curve = trainer.run()
    trainer.export(out)
    write_curve(curve.rows, out / "curve.jsonl", settings.stage)
    entry = {
        "stage": settings.stage, "command": command, "settings": asdict(settings),
        "data": {"pairs": str(pairs_path), "sha256": pair_meta["sha256"], "pairs_meta": pair_meta,
                 "examples": dict(Counter(e.kind for e in examples)), "trained_on": len(trainer.train),
                 "heldout": len(trainer.held)},
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "precision": "bfloat16 autocast" if settings.bf16 else "float32",
        "train_seconds": round(trainer.elapsed, 1), "wall_seconds": round(time.time() - t0, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M"),
        "heldout_loss": {"first": curve.rows[0]["heldout_loss"], "last": curve.rows[-1]["heldout_loss"]},
    }
    if settings.stage == "retriever":  # the map that ships: the evaluation with the best held-out recall@5
        best = max(curve.rows, key=lambda r: (r["heldout_recall@5"], -r["step"]))
        entry["heldout_recall@5"] = {"frozen": curve.rows[0]["heldout_recall@5"], "shipped": best["heldout_recall@5"],
                                     "shipped_step": best["step"]}
    write_meta(out, entry)
    return entry


def write_meta(out: Path, entry: dict) -> dict:
    """meta.json: each stage's entry (this one replacing an older of the same stage) and the sha256 of
    every file that ships, which loading checks (models.trained.read_meta)."""
    path = Path(out) / META_FILE
    meta = json.loads(path.read_text()) if path.is_file() else {"what": "trained weights of rag-demo (docs/DESIGN.md §12)"}
    meta["stages"] = {**meta.get("stages", {}), entry["stage"]: entry}
    meta["files"] = {str(p.relative_to(out)): sha256_file(p) for p in shipped_files(out)}
    path.write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def command_line() -> str:
    return "python -m rag_demo " + " ".join(sys.argv[1:])
