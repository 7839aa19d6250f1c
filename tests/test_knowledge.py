"""transformers' RAG knowledge format, both ways (rag_demo/knowledge/hf_format.py), against transformers'
own `RagRetriever(index_name="custom")` on the tiny random DPR+BART checkpoints.

Retrieval is compared as RAG uses it: the retriever's doc ids (rows) in rank order, and the doc
scores RagModel computes from what it returns (question vector · retrieved `embeddings` rows).

Score tolerance, everywhere below: 1e-5 relative and absolute. Both sides take inner products of
the same float32 vectors (ours inside FAISS, transformers' in numpy here): only the summation
order can differ: measured max differences 8.3e-7 (our export) and 1.4e-6 (the script's dataset)
on scores from -3.4 to 6.0 (the tiny 32-d DPR; 8 query vectors, top 4). A re-embedded passage
moves its vector by 3.3e-2 here (the script embeds without an attention mask), a wrong row by more.
"""
from __future__ import annotations

import json
from functools import partial

import faiss
import numpy as np
import pytest

from rag_demo.knowledge.corpus import Passage, corpus_from_documents
from rag_demo.models.encoders import DPRPassageEncoder
from rag_demo.knowledge.index import PassageIndex, build_index
from rag_demo.knowledge.hf_format import DATASET_DIR, INDEX_FILE, export_knowledge, knowledge_paths, load_knowledge
from rag_demo.models.random_models import fixture_passages
from rag_demo.models.stacks import load_rag_checkpoint

K = 4
QUESTIONS = ["who painted the starry night", "what is the capital of france", "when did apollo 11 land on the moon",
             "which river flows through paris"]
TOL = dict(rtol=1e-5, atol=1e-5)  # see the module docstring


@pytest.fixture(scope="module")
def ctx(tiny_ckpts):
    return DPRPassageEncoder.from_pretrained(tiny_ckpts["ctx_encoder"])


@pytest.fixture(scope="module")
def question_vectors(tiny_ckpts):
    """The tiny random question encoder's vectors of QUESTIONS (which all rank the passages alike:
    random DPR vectors share one dominant direction), plus 4 Gaussian vectors that rank them
    differently: the search is compared, whatever asks it."""
    qenc, _ = load_rag_checkpoint(str(tiny_ckpts["rag_token"]), "token")
    qv = qenc.encode_questions(QUESTIONS)  # (4, D)
    return np.concatenate([qv, np.random.default_rng(0).standard_normal((4, qv.shape[1]), dtype=np.float32)])


@pytest.fixture(scope="module")
def our_index(ctx):
    """The 3 fixture documents cut into ~12-word passages (17 of them): enough rows for a ranking."""
    corpus = corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()], words=12)
    assert len(corpus) >= 8
    return build_index(corpus, ctx)


def _transformers_retriever(tiny_ckpts, passages_path, index_path):
    from transformers import RagRetriever

    return RagRetriever.from_pretrained(str(tiny_ckpts["rag_token"]), index_name="custom",
                                        passages_path=str(passages_path), index_path=str(index_path))


def _assert_same_retrieval(index: PassageIndex, retriever, qv: np.ndarray) -> float:
    """Our top-K == transformers' (rows in order, titles, texts, scores); -> max score difference."""
    scores, passages = index.search(qv, K)  # (B, K), B x K
    embeds, doc_ids, docs = retriever.retrieve(qv, K)  # (B, K, D), (B, K), B dicts
    theirs = np.einsum("bd,bkd->bk", qv, embeds)  # RagModel: bmm(question_hidden_states, retrieved_doc_embeds)
    for b in range(len(qv)):
        assert [index.corpus.position(p.id) for p in passages[b]] == doc_ids[b].tolist()
        assert [p.title for p in passages[b]] == list(docs[b]["title"])
        assert [p.text for p in passages[b]] == list(docs[b]["text"])
    np.testing.assert_allclose(scores, theirs, **TOL)
    assert len({tuple(r) for r in doc_ids.tolist()}) > 1  # the questions really rank differently
    return float(np.abs(scores - theirs).max())


# ---------------------------------------------------------------- export -> transformers


def test_transformers_retriever_on_our_export_retrieves_what_we_do(tiny_ckpts, our_index, question_vectors, tmp_path):
    passages_path, index_path = export_knowledge(our_index, tmp_path / "export")
    assert (passages_path, index_path) == (tmp_path / "export" / DATASET_DIR, tmp_path / "export" / INDEX_FILE)
    retriever = _transformers_retriever(tiny_ckpts, passages_path, index_path)
    assert sorted(retriever.index.dataset.column_names) == ["embeddings", "text", "title"]
    _assert_same_retrieval(our_index, retriever, question_vectors)


def test_export_round_trips_through_our_loader(our_index, tmp_path):
    """Our export read back: same passages (ids too: one title per document), same vectors, bit for bit."""
    k = load_knowledge(*export_knowledge(our_index, tmp_path / "export"))
    assert k.index.corpus.passages == [Passage(p.id, p.title, p.text) for p in our_index.corpus.passages]
    np.testing.assert_array_equal(k.index.embeddings, our_index.embeddings)
    assert k.index.index.metric_type == faiss.METRIC_INNER_PRODUCT


def test_export_refuses_a_folder_with_other_files_and_replaces_an_earlier_export(our_index, tmp_path):
    out = tmp_path / "export"
    export_knowledge(our_index, out)
    export_knowledge(our_index, out)  # an earlier export is replaced
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"already holds notes\.txt: give a new or empty folder"):
        export_knowledge(our_index, out)
    assert (out / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- transformers' script -> us


def _split_text(text: str, n: int) -> list[str]:
    words = text.split(" ")
    return [" ".join(words[i:i + n]).strip() for i in range(0, len(words), n)]


def _split_documents(documents: dict, n: int) -> dict:
    titles, texts = [], []
    for title, text in zip(documents["title"], documents["text"]):
        if text is not None:
            for passage in _split_text(text, n):
                titles.append(title if title is not None else "")
                texts.append(passage)
    return {"title": titles, "text": texts}


def _embed(documents: dict, ctx_encoder, ctx_tokenizer) -> dict:
    import torch

    with torch.no_grad():  # input ids only, padded to the longest: as the script does
        ids = ctx_tokenizer(documents["title"], documents["text"], truncation=True, padding="longest",
                            return_tensors="pt")["input_ids"]
        return {"embeddings": ctx_encoder(ids, return_dict=True).pooler_output.numpy()}


def make_script_knowledge(ctx_path, out, words: int = 15):
    """A knowledge dataset made the way transformers' examples/research_projects/rag/
    use_own_knowledge_dataset.py makes one: tab-separated (title, text) documents, load_dataset("csv"),
    passages of `words` words (the script's 100 would leave one passage per fixture document),
    DPR embeddings with Features(text, title, embeddings float32), save_to_disk, then an
    inner-product IndexHNSWFlat(d, 128) added with add_faiss_index and saved with get_index().save.
    -> (passages_path, index_path)."""
    from datasets import Features, Sequence, Value, load_dataset
    from transformers import DPRContextEncoder, DPRContextEncoderTokenizerFast

    out.mkdir()
    tsv = out / "docs.tsv"
    tsv.write_text("".join(f"{t}\t{x}\n" for t, x in fixture_passages()), encoding="utf-8")
    dataset = load_dataset("csv", data_files=[str(tsv)], split="train", delimiter="\t", column_names=["title", "text"],
                           cache_dir=str(out / "hf_cache"))
    dataset = dataset.map(partial(_split_documents, n=words), batched=True)
    ctx_encoder = DPRContextEncoder.from_pretrained(ctx_path).eval()
    ctx_tokenizer = DPRContextEncoderTokenizerFast.from_pretrained(ctx_path)
    features = Features({"text": Value("string"), "title": Value("string"), "embeddings": Sequence(Value("float32"))})
    dataset = dataset.map(partial(_embed, ctx_encoder=ctx_encoder, ctx_tokenizer=ctx_tokenizer), batched=True,
                          batch_size=16, features=features)
    passages_path = out / "my_knowledge_dataset"
    dataset.save_to_disk(str(passages_path))
    index = faiss.IndexHNSWFlat(ctx_encoder.config.projection_dim or ctx_encoder.config.hidden_size, 128,
                                faiss.METRIC_INNER_PRODUCT)
    dataset.add_faiss_index("embeddings", custom_index=index)
    index_path = out / "my_knowledge_dataset_hnsw_index.faiss"
    dataset.get_index("embeddings").save(str(index_path))
    return passages_path, index_path, dataset


@pytest.fixture(scope="module")
def script_knowledge(tiny_ckpts, tmp_path_factory):
    return make_script_knowledge(tiny_ckpts["ctx_encoder"], tmp_path_factory.mktemp("script") / "out")


def test_our_loader_on_the_scripts_dataset_retrieves_what_transformers_does(tiny_ckpts, script_knowledge,
                                                                             question_vectors):
    passages_path, index_path, dataset = script_knowledge
    k = load_knowledge(passages_path, index_path)
    assert len(k.index) == len(dataset) >= 8
    # the stored vectors, not re-embedded (the script embeds without an attention mask; we never would)
    np.testing.assert_array_equal(k.index.embeddings, np.asarray(dataset.with_format("numpy")[:]["embeddings"]))
    assert type(k.index.index).__name__ == "IndexHNSWFlat"  # its own index, searched as transformers searches it
    titles = [t for t, _ in fixture_passages()]
    assert {p.id for p in k.index.corpus.passages} >= {f"{t}#0" for t in titles} | {f"{titles[0]}#1"}
    retriever = _transformers_retriever(tiny_ckpts, passages_path, index_path)
    _assert_same_retrieval(k.index, retriever, question_vectors)


def test_pipeline_answers_from_a_loaded_knowledge_dataset(tiny_ckpts, script_knowledge, tmp_path):
    """RagPipeline.load(knowledge=...) retrieves from it as loaded (same passages and scores as the
    loader's index), and answers over those passages."""
    from rag_demo.config import RagSettings
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.pipeline import RagPipeline

    passages_path, index_path, _ = script_knowledge
    k = load_knowledge(passages_path, index_path)
    spec = StackSpec(name="paper", rag_token=str(tiny_ckpts["rag_token"]), rag_sequence=str(tiny_ckpts["rag_sequence"]),
                     ctx_encoder=str(tiny_ckpts["ctx_encoder"]), cache_dir=tmp_path / "cache")
    pipe = RagPipeline.load(spec, settings=RagSettings(preset="aided", k=3, max_new_tokens=2), knowledge=k)
    assert pipe.index is k.index and pipe.index_info.source == "knowledge dataset"
    assert not (tmp_path / "cache" / "indexes").exists()  # nothing embedded or cached
    r = pipe.retrieve(QUESTIONS[0], "token", 3)
    qv = pipe.stack.modes["token"].question_encoder.encode_questions([QUESTIONS[0]])
    scores, passages = k.index.search(qv, 3)
    assert r.passages == passages[0]
    np.testing.assert_allclose(r.scores.numpy(), scores[0], **TOL)
    a = pipe.answer(QUESTIONS[0], "token")
    assert [d.id for d in a.docs] == [p.id for p in passages[0]]


def test_cli_exports_then_answers_from_the_export(tiny_ckpts, tmp_path, capsys):
    """`index --export DIR` then `ask --knowledge-dataset DIR/hf_dataset --knowledge-index ...`:
    the answer's passages are our retriever's top K over the exported corpus."""
    from rag_demo.cli import main

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in fixture_passages()))
    paper = ["--stack", "paper", "--rag-token", str(tiny_ckpts["rag_token"]), "--rag-sequence",
             str(tiny_ckpts["rag_sequence"]), "--ctx-encoder", str(tiny_ckpts["ctx_encoder"]),
             "--cache-dir", str(tmp_path / "cache")]
    assert main(["index", *paper, "--corpus-file", str(docs), "--export", str(tmp_path / "export")]) == 0
    out = capsys.readouterr().out
    assert f"passages_path={tmp_path / 'export' / DATASET_DIR}" in out and f"index_path={tmp_path / 'export' / INDEX_FILE}" in out
    knowledge = ["--knowledge-dataset", str(tmp_path / "export" / DATASET_DIR),
                 "--knowledge-index", str(tmp_path / "export" / INDEX_FILE)]
    assert main(["ask", QUESTIONS[1], "--mode", "token", "--k", "2", "--max-new-tokens", "2", "--json",
                 *paper, *knowledge]) == 0
    answer = json.loads(capsys.readouterr().out)["token"]
    k = load_knowledge(tmp_path / "export" / DATASET_DIR, tmp_path / "export" / INDEX_FILE)
    qenc, _ = load_rag_checkpoint(str(tiny_ckpts["rag_token"]), "token")
    scores, passages = k.index.search(qenc.encode_questions([QUESTIONS[1]]), 2)
    assert [d["id"] for d in answer["docs"]] == [p.id for p in passages[0]]
    np.testing.assert_allclose([d["score"] for d in answer["docs"]], scores[0], **TOL)


# ---------------------------------------------------------------- bad inputs


def test_wrong_dimension_is_a_clear_error(our_index, ctx, tiny_ckpts, tmp_path, capsys):
    """Vectors of another size than the stack's passage encoder: refused, by the library and the CLI."""
    from rag_demo.cli import main

    d = our_index.dim + 3
    other = PassageIndex(our_index.corpus, np.random.default_rng(0).standard_normal((len(our_index), d)))
    paths = export_knowledge(other, tmp_path / "export")
    k = load_knowledge(*paths)
    with pytest.raises(ValueError, match=rf"holds {d}-d embeddings, but the paper stack's passage encoder .* makes "
                                         rf"{ctx.dim}-d vectors: load it with the stack whose passage encoder embedded it"):
        k.check_encoder(ctx, "paper")
    paper = ["--stack", "paper", "--rag-token", str(tiny_ckpts["rag_token"]), "--rag-sequence",
             str(tiny_ckpts["rag_sequence"]), "--ctx-encoder", str(tiny_ckpts["ctx_encoder"]),
             "--cache-dir", str(tmp_path / "cache")]
    assert main(["ask", "who?", "--mode", "token", *paper, "--knowledge-dataset", str(paths[0]),
                 "--knowledge-index", str(paths[1])]) == 2
    assert f"holds {d}-d embeddings" in capsys.readouterr().err


def _without_embeddings(src, dst):
    from datasets import load_from_disk

    load_from_disk(str(src[0])).remove_columns("embeddings").save_to_disk(str(dst / "ds"))
    return dst / "ds", src[1]


def _l2_index(src, dst):
    from datasets import load_from_disk

    ds = load_from_disk(str(src[0]))
    ds.add_faiss_index("embeddings", custom_index=faiss.IndexFlatL2(len(ds[0]["embeddings"])))
    ds.get_index("embeddings").save(str(dst / "l2.faiss"))
    return src[0], dst / "l2.faiss"


def _index_of_fewer_rows(src, dst):
    from datasets import load_from_disk

    ds = load_from_disk(str(src[0])).select(range(3))
    ds.add_faiss_index("embeddings", custom_index=faiss.IndexFlatIP(len(ds[0]["embeddings"])))
    ds.get_index("embeddings").save(str(dst / "small.faiss"))
    return src[0], dst / "small.faiss"


def _ragged(src, dst):
    from datasets import Dataset

    Dataset.from_dict({"title": ["a", "b"], "text": ["x", "y"], "embeddings": [[1.0, 2.0], [1.0]]}).save_to_disk(
        str(dst / "ds"))
    return dst / "ds", src[1]


def _not_a_faiss_file(src, dst):
    (dst / "junk.faiss").write_bytes(b"not an index")
    return src[0], dst / "junk.faiss"


BAD = {
    "missing embeddings column": (_without_embeddings, r"has no 'embeddings' column \(it has title, text\): RAG needs"),
    "missing index file": (lambda src, dst: (src[0], dst / "nowhere.faiss"),
                           r"the knowledge index .*nowhere\.faiss does not exist: give the file written by"),
    "missing dataset folder": (lambda src, dst: (dst / "nowhere", src[1]), r"nowhere is not a folder: give the folder"),
    "not a saved dataset": (lambda src, dst: (dst, src[1]), r"is not a dataset saved with datasets' save_to_disk\(\)"),
    "not inner product": (_l2_index, r"ranks by metric 1, not inner product \(0\): RAG scores passages by"),
    "index of another dataset": (_index_of_fewer_rows, r"holds 3 x \d+ vectors but .* has \d+ passages"),
    "ragged vectors": (_ragged, r"rows 0-1 of .* are not all vectors of one size"),
    "not a FAISS file": (_not_a_faiss_file, r"junk\.faiss is not a FAISS index file"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_knowledge_is_a_clear_error(our_index, tmp_path, case):
    make, message = BAD[case]
    good = export_knowledge(our_index, tmp_path / "export")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(ValueError, match=message):
        load_knowledge(*make(good, bad))


def test_knowledge_flags_come_in_pairs(tmp_path):
    assert knowledge_paths(None, None) is None
    with pytest.raises(ValueError, match="--knowledge-dataset was given without --knowledge-index: give both"):
        knowledge_paths(tmp_path, None)
    with pytest.raises(ValueError, match="--knowledge-index was given without --knowledge-dataset: give both"):
        knowledge_paths(None, tmp_path / "x.faiss")
