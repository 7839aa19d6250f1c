"""Evaluation: the metrics on worked examples, the QA file checks, both retrievers on a
3-passage corpus, and one small end-to-end run on tiny random RAG checkpoints."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.measure import evaluate as ev  # noqa: E402
from rag_demo.measure import metrics  # noqa: E402
from rag_demo import questions as qa_files  # noqa: E402
from rag_demo.knowledge.corpus import corpus_from_documents  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- normalisation, EM, F1
# EM and recall@k are ratios of small integers: one correctly rounded IEEE division, the same on
# every CPU (plain Python floats, no vectorised kernels), so they are compared exactly, as are F1
# values of exactly 0 and 1 (2*1*1/(1+1)). Other F1 values go through 2PR/(P+R), several float64
# roundings (~1e-16 each), so they are compared with pytest.approx(rel=1e-9).


def test_docstring_examples_hold():
    """The worked examples in the metric docstrings are run, so they cannot drift."""
    import doctest

    from rag_demo.measure import calibration

    results = [doctest.testmod(m) for m in (ev, metrics, qa_files, calibration)]
    assert sum(r.attempted for r in results) >= 10 and sum(r.failed for r in results) == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Starry Night", "starry night"),  # lowercase, article dropped
        ("  A  Sunday\tAfternoon! ", "sunday afternoon"),  # whitespace collapsed, punctuation deleted
        ("Seurat's", "seurats"),  # SQuAD deletes punctuation (no space)
        ("299,792,458", "299792458"),
        ("Theatre and anthem", "theatre and anthem"),  # 'the'/'an' inside words stay
        ("an apple, the pear", "apple pear"),
    ],
)
def test_normalize_answer(text, expected):
    assert metrics.normalize_answer(text) == expected


def test_exact_match_is_max_over_golds():
    """EM("Seurat", ["Georges Seurat", "Seurat"]) = max(0, 1) = 1; "Georges" matches neither."""
    assert metrics.exact_match("Seurat.", ["Georges Seurat", "Seurat"]) == 1.0
    assert metrics.exact_match("the Seurat", ["Georges Seurat"]) == 0.0
    assert metrics.exact_match("Georges", ["Georges Seurat", "Seurat"]) == 0.0


def test_f1_worked_examples():
    """pred "by Georges Seurat" vs gold "Georges Seurat": common 2, P = 2/3, R = 2/2,
    F1 = 2*(2/3)*1/(2/3+1) = 0.8. Against gold "Seurat": common 1, P = 1/3, R = 1, F1 = 0.5.
    Max over golds = 0.8."""
    assert metrics.f1_score("by Georges Seurat", ["Georges Seurat"]) == pytest.approx(0.8, rel=1e-9)
    assert metrics.f1_score("by Georges Seurat", ["Seurat"]) == pytest.approx(0.5, rel=1e-9)
    assert metrics.f1_score("by Georges Seurat", ["Seurat", "Georges Seurat"]) == pytest.approx(0.8, rel=1e-9)


def test_f1_counts_repeated_tokens_once_per_match():
    """pred "paris paris" vs gold "paris": multiset overlap 1, P = 1/2, R = 1, F1 = 2/3."""
    assert metrics.f1_score("Paris Paris", ["Paris"]) == pytest.approx(2 / 3, rel=1e-9)


def test_f1_edge_cases():
    assert metrics.f1_score("", ["Paris"]) == 0.0
    assert metrics.f1_score("London", ["Paris"]) == 0.0
    assert metrics.f1_score("The Paris.", ["paris"]) == 1.0


# ---------------------------------------------------------------- has_answer, recall@k


def test_has_answer_is_token_sequence_match():
    assert metrics.has_answer("Georges Seurat's most famous work", ["Seurat"])  # punctuation split off
    assert metrics.has_answer("built on 13 August 1961 by the GDR", ["13 August 1961"])
    assert not metrics.has_answer("19612 people", ["1961"])  # no partial-token match
    assert not metrics.has_answer("a party in Paris", ["art"])
    assert not metrics.has_answer("August 13, 1961", ["13 August 1961"])  # order matters
    assert metrics.has_answer("The speed is 299,792,458 m/s", ["299,792,458"])


def test_recall_at_k_worked_example():
    """first hits at ranks [1, 3, None, 7]: recall@1 = 1/4, recall@5 = 2/4, recall@20 = 3/4."""
    ranks = [1, 3, None, 7]
    assert metrics.recall_at_k(ranks, 1) == 0.25
    assert metrics.recall_at_k(ranks, 5) == 0.5
    assert metrics.recall_at_k(ranks, 20) == 0.75
    with pytest.raises(ValueError, match="zero questions"):
        metrics.recall_at_k([], 5)


def test_first_hit():
    texts = ["Paris is in France.", "The Nile is long.", "Paris again."]
    assert metrics.first_hit(texts, ["Nile"]) == 2
    assert metrics.first_hit(texts, ["paris"]) == 1
    assert metrics.first_hit(texts, ["Seine"]) is None


# ---------------------------------------------------------------- QA files


def _write(tmp_path, lines: list[str]) -> Path:
    p = tmp_path / "qa.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_load_qa_keeps_extra_fields_and_skips_blank_lines(tmp_path):
    p = _write(tmp_path, ['{"question": "Q1?", "answers": ["a1"], "type": "who"}', "", '{"question": "Q2?", "answers": ["x", "y"]}'])
    items = qa_files.load_qa(p)
    assert [i.question for i in items] == ["Q1?", "Q2?"]
    assert items[0].type == "who" and items[1].answers == ["x", "y"]
    assert len(qa_files.load_qa(p, limit=1)) == 1


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "Q?", "answers": ["a"]', r"qa.jsonl line 2 is not valid JSON"),
        ('{"question": "Q?"}', r"line 2 is missing 'answers'"),
        ('{"answers": ["a"]}', r"line 2 is missing 'question'"),
        ('{"question": "Q?", "answers": "a"}', r"list of strings"),
        ('{"question": "Q?", "answers": []}', r"non-empty list"),
        ('["Q?", ["a"]]', r"not an object"),
    ],
)
def test_load_qa_errors_name_the_line_and_the_fix(tmp_path, line, message):
    p = _write(tmp_path, ['{"question": "ok?", "answers": ["ok"]}', line])
    with pytest.raises(ValueError, match=message):
        qa_files.load_qa(p)


def test_answers_empty_after_normalisation_are_dropped_and_their_rows_skipped(tmp_path):
    """An external file had an answer '*' (empty after normalisation: nothing can match it). It is
    dropped with a note naming the line; a row left with no answer is skipped and counted."""
    p = _write(tmp_path, ['{"question": "Q1?", "answers": ["*", "Paris"]}', '{"question": "Q2?", "answers": ["the", "*"]}',
                          '{"question": "Q3?", "answers": ["Rome"]}'])
    qa = qa_files.read_qa(p)
    assert [i.question for i in qa.items] == ["Q1?", "Q3?"] and qa.items[0].answers == ["Paris"]
    assert len(qa.skipped) == 1 and qa.skipped[0].startswith("qa.jsonl line 2:")
    assert len(qa.dropped) == 3 and qa.dropped[0].startswith("qa.jsonl line 1: answer '*'")
    assert [i.question for i in qa_files.load_qa(p)] == ["Q1?", "Q3?"]
    only_empty = _write(tmp_path, ['{"question": "Q?", "answers": ["*"]}'])
    with pytest.raises(ValueError, match="no usable questions"):
        qa_files.read_qa(only_empty)


def test_load_qa_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not found: pass --qa"):
        qa_files.load_qa(tmp_path / "nope.jsonl")


def test_parse_modes_and_retrievers():
    assert qa_files.parse_modes("closed-book, token") == ["closed-book", "token"]
    assert qa_files.parse_modes("all") == ["sequence", "token", "closed-book"]
    with pytest.raises(ValueError, match="unknown mode.*'tokens'.*closed-book"):
        qa_files.parse_modes("tokens")
    with pytest.raises(ValueError, match="unknown retriever"):
        qa_files.parse_retrievers("dense,tfidf")


def test_dev_set_is_well_formed_and_answerable_from_the_corpus():
    """assets/qa_dev.jsonl: >= 60 varied questions; each has an answer stated in its source article's summary."""
    from rag_demo.knowledge.corpus import vital_articles_path

    items = qa_files.load_qa(ROOT / "assets" / "qa_dev.jsonl")
    assert len(items) >= 60
    assert {"who", "when", "where", "what"} <= {i.type for i in items}
    assert len({i.meta["topic"] for i in items}) >= 5
    assert len({i.question for i in items}) == len(items)
    articles = json.loads(vital_articles_path().read_text(encoding="utf-8"))
    for i in items:
        assert metrics.has_answer(articles[i.meta["source"]]["extract"], i.answers), i.question


# ---------------------------------------------------------------- retrievers on a 3-passage corpus

DOCS = [
    ("The Starry Night", "The Starry Night is an oil painting by the Dutch painter Vincent van Gogh, painted in June 1889.", None),
    ("Paris", "Paris is the capital and largest city of France, on the river Seine.", None),
    ("Apollo 11", "Apollo 11 was the spaceflight that first landed humans on the Moon, on July 20, 1969.", None),
]
QUESTIONS = [
    qa_files.QAItem("Who painted The Starry Night?", ["Vincent van Gogh", "van Gogh"], {"type": "who"}),
    qa_files.QAItem("Which river flows through Paris?", ["Seine"], {"type": "what"}),
    qa_files.QAItem("When did Apollo 11 land on the Moon?", ["July 20, 1969", "1969"], {"type": "when"}),
]


def test_bm25_recall_at_k_on_three_passages():
    """BM25 ranks each question's own passage first: recall@1 = 3/3. A question whose answer is
    in no passage never counts."""
    from rag_demo.knowledge.bm25 import BM25Retriever

    corpus = corpus_from_documents("three", DOCS)
    bm25 = BM25Retriever(corpus)
    scores, passages = bm25.search([q.question for q in QUESTIONS], 3)
    assert scores.shape == (3, 3)
    assert [row[0].title for row in passages] == ["The Starry Night", "Paris", "Apollo 11"]
    ranks = [metrics.first_hit([metrics.passage_text(p) for p in row], q.answers) for row, q in zip(passages, QUESTIONS)]
    assert ranks == [1, 1, 1]
    assert metrics.recall_at_k(ranks, 1) == 1.0
    _, none = bm25.search(["Who wrote Hamlet?"], 3)
    assert metrics.first_hit([metrics.passage_text(p) for p in none[0]], ["Shakespeare"]) is None
    with pytest.raises(ValueError, match="k=4 is out of range"):
        bm25.search(["x"], 4)


def test_bm25_question_without_words_does_not_crash():
    from rag_demo.knowledge.bm25 import BM25Retriever

    bm25 = BM25Retriever(corpus_from_documents("three", DOCS))
    scores, passages = bm25.search(["?!", "xyzzy qwerty"], 2)
    assert scores.shape == (2, 2) and len(passages[1]) == 2


@pytest.fixture(scope="module")
def tiny_pipe(tiny_ckpts, tmp_path_factory):
    """The paper stack built from tiny random checkpoints (conftest), over the 3-passage corpus."""
    from rag_demo.config import RagSettings
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.pipeline import RagPipeline

    paths = tiny_ckpts
    spec = StackSpec(name="paper", rag_token=str(paths["rag_token"]), rag_sequence=str(paths["rag_sequence"]),
                     ctx_encoder=str(paths["ctx_encoder"]), cache_dir=tmp_path_factory.mktemp("evalcache"))
    settings = RagSettings(preset="aided", k=2, max_new_tokens=4)
    return RagPipeline.load(spec, corpus=corpus_from_documents("three", DOCS), settings=settings)


def test_dense_recall_at_k_on_three_passages(tiny_pipe):
    """With every passage retrieved (k = 3 = corpus size), recall is 1 whatever the (random)
    encoder ranks first; at k = 1 it is the fraction whose own passage came first."""
    qv = tiny_pipe.stack.modes["token"].question_encoder.encode_questions([q.question for q in QUESTIONS])
    _, passages = tiny_pipe.index.search(qv, 3)
    ranks = [metrics.first_hit([metrics.passage_text(p) for p in row], q.answers) for row, q in zip(passages, QUESTIONS)]
    assert all(r is not None for r in ranks)
    assert metrics.recall_at_k(ranks, 3) == 1.0
    assert metrics.recall_at_k(ranks, 1) == sum(row[0].title == d[0] for row, d in zip(passages, DOCS)) / 3


def test_evaluate_end_to_end_on_tiny_random_models(tiny_pipe, tmp_path):
    """Two questions, three modes, both retrievers: every row is scored, recall is right for
    the 3-passage corpus, and the report prints and round-trips through JSON."""
    from rag_demo.config import RagSettings

    settings = RagSettings(preset="aided", k=2, max_new_tokens=4)
    partial = tmp_path / "partial.json"
    report = ev.evaluate(tiny_pipe, QUESTIONS[:2], ["closed-book", "sequence", "token"], settings,
                         ["dense", "bm25"], progress=False, partial_path=partial)
    assert json.loads(partial.read_text())["partial"] == "2 of 2 questions"  # rewritten after each question
    rows = [(g["mode"], g["retriever"].split(" ")[0]) for g in report["generation"]]
    assert rows == [("closed-book", "-"), ("sequence", "dense"), ("token", "dense"), ("sequence", "BM25"), ("token", "BM25")]
    bm25 = next(v for k, v in report["retrieval"].items() if k.startswith("BM25"))
    assert bm25["recall@1"] == 1.0 and bm25["recall@20"] == 1.0  # depth is capped at the 3 passages
    dense = next(v for k, v in report["retrieval"].items() if k.startswith("dense"))
    assert dense["recall@20"] == 1.0
    for g in report["generation"]:  # means of per-question scores: 1e-9 slack for their rounding
        assert g["n"] == 2 and 0.0 <= g["em"] <= g["f1"] + 1e-9 <= 1.0 + 1e-9
    for rec in report["questions"]:
        assert len(rec["answers_by_row"]) == 5
        assert [d["id"] for d in rec["answers_by_row"]["token|bm25"]["docs"]] == rec["retrieval"]["bm25"]["top"]
    text = ev.format_report(report)
    assert "| RAG-Token | BM25" in text and "recall@20" in text
    assert all("confidence" in g for g in report["generation"])  # scored for every mode, the cue with it
    for g in report["generation"]:  # a fitted model's confidences: the cue's precision and recall, the bins
        g["confidence"] = ev.confidence_quality([{"contains": 0, "confidence": 0.1, "cues": ["probably_wrong"]},
                                                 {"contains": 1, "confidence": 0.9, "cues": []}])
    text = ev.format_report(report)
    assert "probably wrong" in text and "| Closed-book" in text.split("probably wrong")[1]
    row = next(line for line in text.split("probably wrong")[1].splitlines() if line.startswith("| RAG-Token | BM25"))
    # 2 answers, 1 wrong, 1 flagged; precision, recall, right ones flagged, AUROC; Brier; two bins of one; the largest gap
    assert row.endswith("| 2 | 1 | 1 | 1.00 | 1.00 | 0.00 | 1.00 | 0.010 | 1: 10% / 0% | 1: 90% / 100% | 0.10 |"), row
    saved = ev.save_report(report, tmp_path / "r.json")
    assert json.loads(saved.read_text())["n_questions"] == 2


# ---------------------------------------------------------------- reader accuracy given retrieval


def test_given_retrieval_worked_example():
    """Four answers, three whose passages hold a gold answer (hit). Overall: EM (1+0+0+0)/4 = 0.25,
    F1 (1+0.5+0+0.8)/4 = 0.575, contains (1+1+0+1)/4 = 0.75. Given retrieval, over the three hits
    only: EM 1/3, F1 (1+0.5+0)/3 = 0.5, contains 2/3, n = 3."""
    res = [
        {"em": 1.0, "f1": 1.0, "contains": 1.0, "hit": True},
        {"em": 0.0, "f1": 0.5, "contains": 1.0, "hit": True},
        {"em": 0.0, "f1": 0.0, "contains": 0.0, "hit": True},
        {"em": 0.0, "f1": 0.8, "contains": 1.0, "hit": False},  # right without the passages: not counted
    ]
    overall, given = ev.answer_scores(res), ev.given_retrieval(res)
    assert overall == pytest.approx({"n": 4, "em": 0.25, "f1": 0.575, "contains": 0.75})
    assert given == pytest.approx({"n": 3, "em": 1 / 3, "f1": 0.5, "contains": 2 / 3})
    assert ev.given_retrieval([{"em": 1.0, "f1": 1.0, "contains": 1.0, "hit": False}])["n"] == 0


def test_evaluate_reports_reader_accuracy_given_retrieval_and_by_source(tiny_pipe):
    """K=1 on the 3-passage corpus. BM25 puts each question's own passage first, so the two
    answerable questions are hits and "Who wrote Hamlet?" (no passage names Shakespeare) is not:
    the BM25 rows' given-retrieval n is 2 of 3, and their numbers are the means over those two.
    Each row's `hit` is has_answer over the passages that row read; each record keeps the
    passages' ids, titles, priors and posteriors; the report breaks results down by source."""
    from rag_demo.config import RagSettings

    qs = [qa_files.QAItem(q.question, q.answers, {**q.meta, "source": "A"}) for q in QUESTIONS[:2]]
    qs.append(qa_files.QAItem("Who wrote Hamlet?", ["Shakespeare"], {"type": "who", "source": "B"}))
    report = ev.evaluate(tiny_pipe, qs, ["closed-book", "sequence", "token"], RagSettings(preset="aided", k=1, max_new_tokens=3),
                         ["dense", "bm25"], progress=False)
    by_row = {(g["mode"], g["retriever"].split(" ")[0]): g for g in report["generation"]}
    for mode in ("sequence", "token"):
        g = by_row[(mode, "BM25")]
        res = [rec["answers_by_row"][f"{mode}|bm25"] for rec in report["questions"]]
        assert [x["hit"] for x in res] == [True, True, False]
        assert g["given_retrieval"]["n"] == 2
        assert g["given_retrieval"]["f1"] == pytest.approx((res[0]["f1"] + res[1]["f1"]) / 2)
        assert g["by_source"]["A"]["n"] == 2 and g["by_source"]["B"]["n"] == 1
        assert g["by_source"]["B"]["given_retrieval"]["n"] == 0
    for rec, item in zip(report["questions"], qs):
        for key, row in rec["answers_by_row"].items():
            if key.startswith("closed-book"):  # reads nothing: compared on the dense top K's hits
                assert row["docs"] == [] and row["hit"] == (rec["retrieval"]["dense"]["first_hit"] == 1)
                continue
            doc = tiny_pipe.index.corpus.passages[tiny_pipe.index.corpus.position(row["docs"][0]["id"])]
            assert row["hit"] == metrics.has_answer(metrics.passage_text(doc), item.answers)
            assert row["docs"][0]["title"] == doc.title and row["docs"][0]["prior"] == pytest.approx(1.0)
            assert row["docs"][0]["posterior"] in (None, pytest.approx(1.0))  # None: no shown token
    text = ev.format_report(report)
    assert "given retrieval" in text and "| RAG-Token | BM25 (bm25s, k1=1.5, b=0.75) | B | 1 |" in text
    assert report["settings"]["answer_style"] == RagSettings(preset="aided").decoding.answer_style


def test_sample_items_is_deterministic_and_validated():
    items = [qa_files.QAItem(f"q{i}?", ["a"]) for i in range(50)]
    a, b = qa_files.sample_items(items, 10, seed=3), qa_files.sample_items(items, 10, seed=3)
    assert [x.question for x in a] == [x.question for x in b]  # same seed, same questions
    assert [x.question for x in a] != [x.question for x in qa_files.sample_items(items, 10, seed=4)]
    assert [x.question for x in a] != [x.question for x in items[:10]]  # not the first N
    idx = [items.index(x) for x in a]
    assert idx == sorted(idx)  # file order kept
    with pytest.raises(ValueError, match="sample=51 is out of range: choose 1 to 50"):
        qa_files.sample_items(items, 51)


def test_keep_answerable_keeps_labelled_rows_and_names_bad_files(tmp_path):
    items = [qa_files.QAItem(f"q{i}?", ["a"], {"id": f"x{i}"}) for i in range(4)]
    labels = _write(tmp_path, ['{"id": "x1", "answerable": true}', '{"id": "x2", "answerable": false}',
                               '{"id": "x3", "answerable": true}', ""])
    assert [it.question for it in qa_files.keep_answerable(items, labels)] == ["q1?", "q3?"]  # file order, trues only
    for lines, msg in ((['{"id": "x1"}'], "line 1"), (['{"id": "x1", "answerable": "yes"}'], "true or false"),
                       (['{"id": "other", "answerable": true}'], "belong to another file"),
                       (['{"id": "x1", "answerable": false}'], "labels no question")):
        with pytest.raises(ValueError, match=msg):
            qa_files.keep_answerable(items, _write(tmp_path, lines))
    with pytest.raises(ValueError, match="not found"):
        qa_files.keep_answerable(items, tmp_path / "missing.jsonl")


def test_the_external_files_labels_hold_ids_only_and_match_it():
    """assets/qa_train_vital_labels.jsonl labels each row of ../shared/data/qa_train_vital.jsonl
    (read by hand: does a supporting summary state the answer?). It holds no question text."""
    import json

    rows = [json.loads(line) for line in (ROOT / "assets" / "qa_train_vital_labels.jsonl").read_text().splitlines()]
    assert all(set(r) == {"id", "answerable", "title"} for r in rows)
    assert all(isinstance(r["answerable"], bool) and (r["title"] is None) != r["answerable"] for r in rows)
    assert 100 <= sum(r["answerable"] for r in rows) <= 150 and len({r["id"] for r in rows}) == len(rows) == 600
    external = ROOT.parent / "shared" / "data" / "qa_train_vital.jsonl"
    if external.is_file():  # outside the repo: checked where it exists
        ids = [json.loads(line)["id"] for line in external.read_text().splitlines() if line.strip()]
        assert ids == [r["id"] for r in rows]
        assert len(qa_files.keep_answerable(qa_files.load_qa(external), ROOT / "assets" / "qa_train_vital_labels.jsonl")) == \
            sum(r["answerable"] for r in rows)


def test_cli_eval_rejects_bad_modes(tmp_path, capsys):
    from rag_demo.cli import main

    qa = _write(tmp_path, ['{"question": "Q?", "answers": ["x1"]}'])
    assert main(["eval", "--qa", str(qa), "--modes", "token,rag"]) == 2
    assert "unknown mode" in capsys.readouterr().err


def test_cli_eval_finishes_and_reports_skipped_rows(tiny_ckpts, tmp_path, capsys):
    """`eval --qa FILE` on a file with an answer that is empty after normalisation finishes
    (it used to refuse the whole file) and its report names the skipped row."""
    from rag_demo.cli import main

    qa = _write(tmp_path, ['{"question": "Where is the Eiffel Tower?", "answers": ["*", "Paris"]}',
                           '{"question": "What is it?", "answers": ["*"]}'])
    docs = tmp_path / "docs.md"
    docs.write_text("# Paris\n\nThe Eiffel Tower stands in Paris.\n\n# Rome\n\nThe Colosseum is in Rome.\n",
                    encoding="utf-8")
    out = tmp_path / "r.json"
    rc = main(["eval", "--qa", str(qa), "--stack", "paper", "--rag-token", str(tiny_ckpts["rag_token"]),
               "--rag-sequence", str(tiny_ckpts["rag_sequence"]), "--ctx-encoder", str(tiny_ckpts["ctx_encoder"]),
               "--cache-dir", str(tmp_path / "cache"), "--corpus-file", str(docs), "--k", "1",
               "--max-new-tokens", "2", "--modes", "token", "--retrievers", "dense", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "1 row(s) skipped" in printed and "qa.jsonl line 2" in printed
    report = json.loads(out.read_text())
    assert report["n_questions"] == 1 and report["qa_file"]["rows_used"] == 1
    assert report["qa_file"]["skipped"][0].startswith("qa.jsonl line 2")


def test_by_source_table_is_printed_only_when_sources_group_questions():
    """A source per question (the dev set's article titles) would print a row per question: the
    report says how many there are and leaves the table to the JSON."""
    gen = {"mode": "token", "retriever": "dense", "em": 0.0, "f1": 0.5, "contains": 1.0, "n": 20,
           "seconds_p50": 1.0, "tokens_mean": 3.0, "by_type": {},
           "by_source": {f"s{i}": {"n": 1, "em": 0.0, "f1": 0.5, "contains": 1.0, "given": {"n": 1, "em": 0.0,
                                                                                              "f1": 0.5, "contains": 1.0}}
                         for i in range(20)}}
    report = {"settings": {"k": 5, "num_beams": 1, "max_new_tokens": 32, "sequence_decoding": "thorough"},
              "corpus": {"name": "c", "passages": 3}, "n_questions": 20, "retrieval": {}, "generation": [gen],
              "machine": {"processor": "cpu", "cpus": 2, "torch": "x", "threads": 2}, "notes": []}
    text = ev.format_report(report)
    assert "20 distinct sources" in text and "| s3 |" not in text


def test_machine_info_names_the_cpu_family_and_its_bfloat16():
    """Every eval / bench report names its CPU: an "AMD EPYC" may be Zen 3 (float32 models) or
    Zen 5 (bfloat16), so the family / model numbers and native bfloat16 support are part of it."""
    from pathlib import Path

    from rag_demo.measure.evaluate import machine_info
    from rag_demo.models.stacks import cpu_has_native_bf16

    name = machine_info()["processor"]
    assert name.endswith(", native bfloat16" if cpu_has_native_bf16() else ", no native bfloat16"), name
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and "cpu family" in cpuinfo.read_text():
        family = next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("cpu family")).split(":")[1].strip()
        assert f"(family {family} model " in name, name
