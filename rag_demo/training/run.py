"""`python -m rag_demo train`: the pairs made (or read back), the models loaded, one stage trained,
and what ships written with its meta (the command, the data's hash, the seed, the machine, the
time spent) and its training curve. Checkpoints, the pair file and the prepared examples stay in
the work folder (not shipped).

The reader stage runs in two halves that can be on two machines: `--prepare-only` retrieves
every pair's passages and writes the token ids a step reads (work/prepared.pt; needs the corpus,
the retriever and its index), and `--prepared FILE --device cuda` trains from that file alone
(needs only the generator's weights).
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
from typing import Callable, Sequence

import torch

from rag_demo.models.stack_spec import StackSpec
from rag_demo.models.machine import device_name
from rag_demo.models.trained import MAP_FILE, META_FILE, QuestionMap, sha256_file, shipped_files
from rag_demo.training.examples import Prepared, make_examples, prepare
from rag_demo.training.loop import ReaderTrainer, RetrieverTrainer, TrainSettings, write_curve
from rag_demo.training.pairs import Pair, corpus_pairs, dedupe, file_hash, labelled_pairs, sample_pairs

# the share of each rule among `--corpus-pairs N` (the definitions are plentiful and all answer with
# a title, so they are held to a share like the others)
PAIR_SHARES = {"definition": 0.13, "relation": 0.32, "year": 0.13, "number": 0.10, "agent": 0.32}
PREPARED = "prepared.pt"


def make_pair_file(path: Path, qa_paths: Sequence[Path], passages, seed: int, n_corpus: int) -> dict:
    """Write the pairs (the labelled files' answerable train questions, then about `n_corpus` pairs
    made from the corpus, none asking a real question again) to `path` and their meta beside it
    (`path`.meta.json); -> the meta."""
    real = labelled_pairs(qa_paths)
    made = corpus_pairs(passages) if n_corpus else {}
    counts = {k: round(n_corpus * share) for k, share in PAIR_SHARES.items()} if n_corpus else {}
    pairs = dedupe(real + sample_pairs(made, counts, seed))  # a corpus pair never overrides a real question
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.to_json() + "\n" for p in pairs), encoding="utf-8")
    meta = {
        "what": "question-answer pairs for `python -m rag_demo train` (rag_demo/training/pairs.py)",
        "qa": [{"file": str(q), "sha256": file_hash(q), "split": "train", "labelled answerable": True,
                "pairs": sum(p.kind == "external" and p.source in _ids_of(str(q)) for p in pairs)} for q in qa_paths],
        "corpus_rules": {k: {"made": len(v), "sampled": sum(p.kind == k for p in pairs)} for k, v in made.items()},
        "seed": seed, "n_corpus": n_corpus, "pairs": len(pairs), "sha256": file_hash(path),
        "how": {"external": "the answerable questions of each file's train split (rag_demo/splits.py), the answer as "
                            "the gold summary words it first",
                "definition": "an article's first sentence 'X is a ...' asked as 'What is a ...?', answer X",
                "relation": "'Its capital is Y' in X's passage asked as 'What is the capital of X?', answer Y",
                "year": "a sentence with one year 'in 1889' asked with 'in what year'",
                "number": "a sentence with one count '16 states' asked with 'how many states'",
                "agent": "a sentence 'written by NAME' asked with 'by whom'",
                "dedupe": "each question once; a question made with two different answers is dropped"},
    }
    Path(str(path) + ".meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


_IDS: dict[str, set[str]] = {}


def _ids_of(qa_path: str) -> set[str]:
    """The question ids of a QA file."""
    if qa_path not in _IDS:
        _IDS[qa_path] = {str(json.loads(x).get("id")) for x in Path(qa_path).read_text(encoding="utf-8").splitlines()
                         if x.strip()}
    return _IDS[qa_path]


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


def save_prepared(path: Path, prepared: list[Prepared], key: dict) -> None:
    torch.save({"key": key, "examples": [asdict(p) for p in prepared]}, path)


def load_prepared(path: Path) -> tuple[list[Prepared], dict]:
    """The examples `--prepare-only` wrote, and the key saying what made them (data hash, K, ...)."""
    if not Path(path).is_file():
        raise ValueError(f"prepared examples {path} not found: run `python -m rag_demo train --prepare-only` first.")
    saved = torch.load(path, weights_only=False)
    return [Prepared(**e) for e in saved["examples"]], saved["key"]


def _pairs(work: Path, qa_paths: Sequence[Path], passages, seed: int, n_corpus: int, say) -> tuple[list[Pair], dict]:
    pairs_path = work / "pairs.jsonl"
    meta_path = Path(str(pairs_path) + ".meta.json")
    old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    want = [file_hash(q) for q in qa_paths]
    made = (pairs_path.is_file() and old.get("seed") == seed and old.get("n_corpus") == n_corpus
            and [q.get("sha256") for q in old.get("qa", [])] == want and old.get("sha256") == file_hash(pairs_path))
    if not made:
        say("Making question-answer pairs from the labelled files' train split" + (" and the corpus" if n_corpus else "")
            + " ...")
        make_pair_file(pairs_path, qa_paths, passages, seed, n_corpus)
    return read_pairs(pairs_path), json.loads(meta_path.read_text())


def train_stage(settings: TrainSettings, out: Path, work: Path, qa_paths: Sequence[Path], command: str,
                spec: StackSpec | None = None, say: Callable[[str], None] = print, corpus_pairs_n: int = 0,
                device: str = "cpu", prepared_path: Path | None = None, prepare_only: bool = False) -> dict:
    """Train one stage and write what ships into `out`; -> this stage's meta entry (with
    prepare_only: the prepared examples' key, nothing trained)."""
    from rag_demo.models.decoder_only import DecoderOnlyGenerator
    from rag_demo.models.stacks import MINILM_SCORE_SCALE, load_smollm, smollm_weights

    spec = spec or StackSpec()
    out, work = Path(out), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if settings.stage == "reader" and prepared_path is not None:
        prepared, key = load_prepared(prepared_path)
        say(f"Read {len(prepared):,} prepared examples from {prepared_path}.")
    else:
        from rag_demo.knowledge.corpus import load_vital_articles
        from rag_demo.knowledge.index import load_or_build_index
        from rag_demo.models.encoders import MiniLMEncoder
        from rag_demo.models.stacks import resolve_dtype

        say("Loading the corpus, the retriever and its index ...")
        corpus = load_vital_articles(cache_dir=spec.cache_dir)
        encoder = MiniLMEncoder(passage_dtype=resolve_dtype(spec.passage_dtype))  # the app's index on this CPU
        index, _ = load_or_build_index(corpus, encoder, spec.cache_dir)
        pairs, pair_meta = _pairs(work, qa_paths, corpus.passages, settings.seed, corpus_pairs_n, say)
        # the reader trains on the passages the retriever that ships finds: the map's, when one ships
        qmap = QuestionMap.load(out / MAP_FILE) if settings.stage == "reader" and (out / MAP_FILE).is_file() else None
        depth = settings.pool if settings.stage == "retriever" else settings.k
        say(f"Retrieving the top {depth} passages of {len(pairs):,} pairs ...")
        examples = make_examples(pairs, encoder, index, depth, qmap)
        if settings.stage == "retriever":
            examples = informative(examples, settings.seed)
            say("Loading SmolLM2 as the demo answers with it (its scores of each pool are the frozen generator's) ...")
            # nothing kept between questions: pools seldom share a passage, and the kept states only grew
            gen = load_smollm(dataclasses.replace(spec, passage_cache_mb=0, hidden_cache_mb=0))
            trainer = RetrieverTrainer(gen, index.embeddings, corpus.passages, examples, settings, work,
                                       MINILM_SCORE_SCALE, gen.tokenizer.eos_token_id, data_hash=pair_meta["sha256"])
            return _finish(trainer, settings, out, command, pair_meta, examples, "cpu", t0, say)
        tok, model = smollm_weights(spec)
        gen = DecoderOnlyGenerator(model, tok, name="SmolLM2-135M-Instruct (float32)", passage_cache_bytes=0,
                                   hidden_cache_bytes=0)
        say(f"Writing {len(examples):,} examples as the generator reads them ...")
        prepared = prepare(examples, gen, corpus.passages, index.embeddings, settings.k, MINILM_SCORE_SCALE,
                           tok.eos_token_id, qmap)
        key = {"data": pair_meta["sha256"], "k": settings.k, "question_map": sha256_file(out / MAP_FILE) if qmap else None,
               "generator": gen.name, "pairs_meta": pair_meta, "command": command, "machine": device_name("cpu")}
        save_prepared(work / PREPARED, prepared, key)
        if prepare_only:
            say(f"Wrote {work / PREPARED}: train from it with --prepared (any device).")
            return {"prepared": str(work / PREPARED), "examples": len(prepared), "key": {k: v for k, v in key.items()
                                                                                         if k != "pairs_meta"}}
    if prepared_path is not None or "model" not in locals():
        tok, model = smollm_weights(spec)
    if key["k"] != settings.k:
        raise ValueError(f"the prepared examples read K={key['k']} passages, not k={settings.k}: prepare them again "
                         "with this k, or train with theirs.")
    trainer = ReaderTrainer(model, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, prepared,
                            settings, work, data_hash=key["data"], device=device)
    entry = _finish(trainer, settings, out, command, key["pairs_meta"], prepared, device, t0, say,
                    prepared={"command": key.get("command"), "machine": key.get("machine")})
    return entry


def _finish(trainer, settings: TrainSettings, out: Path, command: str, pair_meta: dict, examples: list, device: str,
            t0: float, say, prepared: dict | None = None) -> dict:
    resumed = trainer.resume()
    say(f"{'Resuming at step ' + str(trainer.step) if resumed else 'Starting'}: {len(trainer.train):,} examples "
        f"({len(trainer.held)} held out), {trainer.total:,} optimizer steps")
    curve = trainer.run()
    stored = trainer.export(out)
    write_curve(curve.rows, out / "curve.jsonl", settings.stage)
    entry = {
        "stage": settings.stage, "command": command, "settings": asdict(settings),
        "data": {"sha256": pair_meta["sha256"], "pairs_meta": pair_meta,
                 "examples": dict(Counter(e.kind for e in examples)), "trained_on": len(trainer.train),
                 "heldout": len(trainer.held)},
        "device": device_name(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "precision": "bfloat16 autocast" if settings.bf16 else "float32",
        # seconds of optimizer steps summed over every process that resumed this run; and this
        # process's own time from start to finish (loading, held-out losses, export included)
        "seconds_training_all_processes": round(trainer.elapsed, 1),
        "seconds_last_process": round(time.time() - t0, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M"),
        "heldout_loss": {"first": curve.rows[0]["heldout_loss"], "last": curve.rows[-1]["heldout_loss"]},
        "stored": stored,
    }
    if prepared:  # the reader stage's examples were retrieved by an earlier command, perhaps elsewhere
        entry["prepared_by"] = prepared
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
