"""Question–answer pairs to train on: real questions first, then pairs made from the corpus itself.

Real questions (`labelled_pairs`): the "train" split of the external QA files, only those a person
labelled answerable from one summary, each with the answer as that summary words it. A
string-matched question whose gold only happens to occur in a passage teaches the generator to
copy the wrong span. Corpus pairs, as unsupervised QA makes them (Lewis et al. 2019, "Unsupervised
Question Answering by Cloze Translation"), are optional (`train --corpus-pairs N`): a sentence with
a span blanked becomes a question whose answer is the span. Five rules, each a function
`(title, sentence, first) -> (question, answer) | None`:

  definition  "Canberra is the capital city of Australia."  -> "What is the capital city of Australia?"  Canberra
  relation    "Its capital is Fredville." (in Freedonia's)  -> "What is the capital of Freedonia?"        Fredville
  year        "The tower was completed in 1889."           -> "The tower was completed in what year?"  1889
  number      "Germany has 16 states."                     -> "Germany has how many states?"            16
  agent       "Hamlet was written by William Shakespeare." -> "Hamlet was written by whom?"             William Shakespeare

A sentence opening with a pronoun ("He was born in ...") gets its passage's title in its place, so
the question names what it asks about, as a visitor's does. Every pair says how it was made
(`kind`, and the passage it came from); `corpus_pairs` keeps only pairs whose answer is not in the
question. No pair is ever made from a question outside the train split (rag_demo/splits.py).
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from rag_demo.knowledge.chunking import split_sentences
from rag_demo.reader.text import normalize_answer

KINDS = ("definition", "relation", "year", "number", "agent", "external")

_PERSON = re.compile(
    r"\b(born|physicist|writer|painter|poet|composer|philosopher|politician|king|queen|emperor|empress|scientist|"
    r"mathematician|actor|actress|singer|songwriter|leader|president|general|explorer|inventor|engineer|artist|"
    r"novelist|playwright|pope|saint|prophet|economist|psychologist|chemist|biologist|astronomer|architect|"
    r"sculptor|dictator|revolutionary|statesman|theologian|monarch|pharaoh|prince|princess|director|musician|"
    r"rapper|footballer|athlete|activist|author|lawyer|businessman|entrepreneur|sultan|tsar|czar|khan|ruler|"
    r"conqueror|aviator|astronaut|admiral|soldier|priest|bishop|scholar|historian|sociologist|anthropologist|"
    r"geographer|botanist|naturalist|physician|nurse|dancer|comedian|filmmaker|photographer|man|woman)\b",
    re.IGNORECASE)
_PRONOUN_START = re.compile(r"^(He|She|It|They)\b")
_POSSESSIVE_START = re.compile(r"^(His|Her|Its|Their)\b")
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-2][0-9])\b")
_IN_YEAR = re.compile(r"\b([Ii]n) (1[0-9]{3}|20[0-2][0-9])\b(?! (?:BC|BCE|AD|CE)\b)")
# a count: digits (with thousands commas) and an optional magnitude, then a plural noun
_COUNT = re.compile(r"(?<![\w.,$£€-])(\d{1,3}(?:,\d{3})+|\d+)( (?:thousand|million|billion))? ([a-z]{3,}s)\b")
_NAME = r"[A-Z][\w'’.-]+(?: (?:of|de|da|von|van|the|del|la|le|du|bin|ibn|al-)?(?: ?[A-Z][\w'’.-]+))*"
# "by NAME" after a verb whose "by" names a person: "written by William Shakespeare"; the name ends
# the clause (punctuation, the sentence's end, or a preposition follows)
_AGENT_VERBS = ("written|painted|composed|directed|founded|co-founded|discovered|invented|designed|built|developed|"
                "proposed|led|published|isolated|coined|introduced|created|established|formulated|produced|"
                "sculpted|assassinated|killed|defeated|succeeded|elected|appointed|conquered|translated|"
                "illustrated|commissioned|murdered|captured|crowned|named|described|recorded|performed|sung|"
                "portrayed|authored|devised|pioneered|popularized|popularised|synthesized|patented|drafted")
_BY_NAME = re.compile(r"\b(?:" + _AGENT_VERBS + r")(?: [a-z]+ly)? (by) (" + _NAME + r")"
                      r"(?=[,.;:]|$| (?:in|on|at|for|from|with|to|and|during|after|before|while|as)\b)")
_RELATIONS = ("capital|capital city|largest city|official language|official languages|currency|national language|"
              "highest point|longest river|highest mountain|head of state|national animal|national flower|"
              "national sport|chemical symbol|atomic number|motto|national anthem|state religion")
_RELATION = re.compile(r"^(?:(?P<its>Its|Their)|The) (?P<rel>" + _RELATIONS + r")(?: and (?:largest|most populous) city)?"
                       r"(?: of (?P<of>[A-Z][^,]+?))? (?:is|was|are) (?:the )?(?P<ans>" + _NAME + r")")
_MONTHS = {"January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"}
_DEFINITION = re.compile(r"^(?:The |An |A )?(?P<subj>[^,()]+?)(?: \([^)]*\))?,?(?: [^,]*,)? "
                         r"(?P<verb>is|was|are|were) (?P<rest>(?:a|an|the|one of)\b.+)$")
MIN_WORDS, MAX_WORDS = 5, 25  # a question's length in words


@dataclass(frozen=True)
class Pair:
    """One training example: a question, its answers (the first is the target), how it was made."""

    question: str
    answers: list[str]
    kind: str  # one of KINDS
    source: str  # the passage id it was made from, or the QA file's question id
    meta: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


def bare_title(title: str) -> str:
    """A title without its disambiguation: "Translation (biology)" -> "Translation"."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()


def named(title: str, sentence: str) -> str:
    """The sentence with an opening pronoun replaced by the title ("He was ..." -> "Title was ...")."""
    t = bare_title(title)
    if _PRONOUN_START.match(sentence):
        return _PRONOUN_START.sub(t, sentence, count=1)
    if _POSSESSIVE_START.match(sentence):
        return _POSSESSIVE_START.sub(t + "'s", sentence, count=1)
    return sentence


def _question(text: str) -> str | None:
    q = text.strip().rstrip(".;:!") + "?"
    return q if MIN_WORDS <= len(q.split()) <= MAX_WORDS else None


def definition(title: str, sentence: str, first: bool) -> tuple[str, str] | None:
    """The first sentence of an article, "X is a/the ...", inverted: "What is a/the ...?" -> X."""
    if not first:
        return None
    m = _DEFINITION.match(sentence.rstrip("."))
    if not m:
        return None
    subj, t = m["subj"].strip(), bare_title(title)
    if normalize_answer(subj) != normalize_answer(t):
        return None
    rest = re.split(r",|;| which | who | that | whose ", m["rest"])[0].strip()
    wh = "Who" if _PERSON.search(rest) else "What"
    q = _question(f"{wh} {m['verb']} {rest}")
    return (q, t) if q else None


def relation(title: str, sentence: str, first: bool) -> tuple[str, str] | None:
    """"Its capital is Y" (or "The capital of X is Y") in X's passage: "What is the capital of X?" -> Y."""
    m = _RELATION.match(sentence)
    if not m or (m["its"] is None and m["of"] is None):
        return None
    of = m["of"] or bare_title(title)
    q = _question(f"What is the {m['rel']} of {of}")
    answer = m["ans"].rstrip(".'’")
    return (q, answer) if q and answer not in _MONTHS else None


def year(title: str, sentence: str, first: bool) -> tuple[str, str] | None:
    """A sentence with one year, "in 1889", asked as "in what year"."""
    s = named(title, sentence)
    years = _YEAR.findall(s)
    m = _IN_YEAR.search(s)
    if len(years) != 1 or not m:
        return None
    q = _question(s[: m.start()] + f"{m[1]} what year" + s[m.end():])
    return (q, m[2]) if q else None


def number(title: str, sentence: str, first: bool) -> tuple[str, str] | None:
    """A sentence with one count of things, "16 states", asked as "how many states"."""
    s = named(title, sentence)
    found = [m for m in _COUNT.finditer(s) if not _YEAR.fullmatch(m[1])]
    if len(found) != 1:
        return None
    m = found[0]
    answer = m[1] + (m[2] or "")
    q = _question(s[: m.start()] + f"how many{m[2] or ''} {m[3]}" + s[m.end():])
    return (q, answer) if q else None


def agent(title: str, sentence: str, first: bool) -> tuple[str, str] | None:
    """A sentence naming who did something, "by William Shakespeare", asked as "by whom"."""
    s = named(title, sentence)
    found = list(_BY_NAME.finditer(s))
    if len(found) != 1:
        return None
    m = found[0]
    name = m[2].rstrip(".'’")
    if name in _MONTHS or len(name.split()) > 5 or normalize_answer(name) == normalize_answer(bare_title(title)):
        return None
    q = _question(s[: m.start(1)] + "by whom" + s[m.start(2) + len(name):])
    return (q, name) if q else None


RULES = {"definition": definition, "relation": relation, "year": year, "number": number, "agent": agent}


def corpus_pairs(passages: Iterable, kinds: Iterable[str] = tuple(RULES)) -> dict[str, list[Pair]]:
    """Every pair the rules make from the passages (id, title, text), by kind, in corpus order.
    A pair whose answer's words are all in its question is left out (nothing to find)."""
    out: dict[str, list[Pair]] = {k: [] for k in kinds}
    for p in passages:
        first_passage = p.id.endswith("#0")
        for i, sentence in enumerate(split_sentences(p.text)):
            for kind in kinds:
                made = RULES[kind](p.title, sentence, first_passage and i == 0)
                if made is None:
                    continue
                q, a = made
                if set(normalize_answer(a).split()) <= set(normalize_answer(q).split()):
                    continue
                out[kind].append(Pair(q, [a], kind, p.id))
    return out


def labelled_pairs(qa_paths: Iterable[str | Path]) -> list[Pair]:
    """The questions of each QA file's train split that a person labelled answerable from one summary
    (questions.answerable_ids), in file order. The target comes first among the answers: the
    answer as the gold summary words it (`answer_in_summary`) where the file gives it, so the
    generator learns to copy what the passage says; then the file's gold answers."""
    from rag_demo.questions import answerable_ids, load_qa
    from rag_demo.splits import split_of

    out: list[Pair] = []
    for path in qa_paths:
        labels = answerable_ids(path)
        if labels is None:
            raise ValueError(f"{path} has no answerable labels (inline or in {Path(path).stem}_labels.jsonl): "
                             "train on labelled files only.")
        for it in load_qa(path):
            ident = str(it.meta["id"])
            if split_of(ident) != "train" or not labels.get(ident):
                continue
            first = it.meta.get("answer_in_summary")
            answers = [first] + [a for a in it.answers if a != first] if first else list(it.answers)
            out.append(Pair(it.question, answers, "external", ident))
    return out


def dedupe(pairs: Iterable[Pair]) -> list[Pair]:
    """Each question once, and no question asked with two different answers: "What is a chemical
    element?" made from eight passages would teach eight answers to one question. Order kept."""
    answers: dict[str, set[str]] = {}
    for p in pairs:
        answers.setdefault(normalize_answer(p.question), set()).add(normalize_answer(p.answers[0]))
    seen: set[str] = set()
    out = []
    for p in pairs:
        q = normalize_answer(p.question)
        if len(answers[q]) == 1 and q not in seen:
            seen.add(q)
            out.append(p)
    return out


def sample_pairs(by_kind: dict[str, list[Pair]], counts: dict[str, int], seed: int) -> list[Pair]:
    """A deterministic sample of `counts[kind]` pairs of each kind (all of a kind with fewer),
    at most one pair per passage and kind, no question twice or with two answers (`dedupe`), in a
    shuffled order."""
    rng = random.Random(seed)
    picked: list[Pair] = []
    for kind, n in counts.items():
        one_each = dedupe({p.source: p for p in by_kind.get(kind, [])}.values())
        picked += rng.sample(one_each, min(n, len(one_each)))
    rng.shuffle(picked)
    return picked


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
