"""Settings, declared once: the paper's knobs, the reader aids and the presets. (What a deployment
runs, the stack's models and the cache folder, is models/stack_spec.StackSpec.)

Every per-question setting is one `knob(...)` line below: its type, range, default (the `paper`
preset's value: `Decoding()`, `ReaderAids()` and `RagSettings()` are the paper), the `aided`
preset's value, a label, one sentence of help and one of why. The
command line (`cli.add_settings`), the page's controls (`web/controls.py`), the API's parameters
(`web/api.py`) and the validation (pydantic, here) are all generated from these lines, so a
new knob is one line here plus its use.

Three presets name what runs:
  paper    the paper's RAG-Sequence and RAG-Token as written: the retriever's own prior, greedy
           decoding, thorough RAG-Sequence, every reader aid off;
  aided    the reader aids that help a small generator (SmolLM2-135M) read its passages;
  trained  the paper's algorithm as written, with weights fine-tuned by RAG's own loss as the paper
           trains (python -m rag_demo train; docs/DESIGN.md §12 says which parts ship).
The paper stack (BART, trained for the task) defaults to `paper`; the offline stack's default is
PRESET_OF_STACK's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MODES = ("sequence", "token", "closed-book")
# Why an answer was cut short (Answer.stopped): a cut answer's numbers describe a half-made answer,
# so it gets no confidence (confidence.judge) and the page says it was cut
CUT_STOPS = ("time_limit", "cancelled", "max_new_tokens")
MODE_TITLES = {"sequence": "RAG-Sequence", "token": "RAG-Token", "closed-book": "Closed-book (no retrieval)"}
# One colour per mode, the same on every answer card and every figure (dark enough for white text,
# and apart from the passages' light rank colours, web/render.PALETTE).
MODE_COLOURS = {"sequence": "#1b9e77", "token": "#7570b3", "closed-book": "#6b6b6b"}
STACKS = ("offline", "paper")
GENERATOR_DTYPES = ("auto", "float32", "bfloat16")
INDEX_KINDS = ("auto", "flat", "hnsw", "ivfpq")  # StackSpec.index_kind: auto + rag_demo.knowledge.ann.KINDS
MAX_QUESTION_CHARS = 1000  # a question is one sentence or two; 1000 chars is ~250 tokens

PRESETS = {"paper": "Plain RAG, as in the paper", "aided": "With reader aids for a small model",
           "trained": "Plain RAG, trained as in the paper"}
WEIGHTS = ("base", "trained")
PRESET_OF_STACK = {"offline": "aided", "paper": "paper"}  # each stack's default preset


# ---------------------------------------------------------------- declaring a knob

def knob(paper: Any, *, label: str, help: str, why: str, aided: Any = ..., trained: Any = ...,
         lo: float | None = None, hi: float | None = None, step: float | None = None, ends: tuple[str, str] = ("", ""),
         flag: str | None = None) -> Any:
    """One setting's declaration: `paper` is its value in the paper preset (the class default: a
    group built with no arguments is the paper, an aid's is its "off" value), `aided` and `trained`
    its values in those presets (left out: the paper's), lo..hi its range and `step` the page's
    slider step, `ends` what its two ends mean (said when a value is refused), `flag` its
    command-line flag (default --name-with-dashes)."""
    extra = {"label": label, "why": why, "aided": paper if aided is ... else aided,
             "trained": paper if trained is ... else trained, "step": step, "ends": list(ends), "flag": flag}
    return Field(paper, ge=lo, le=hi, description=help, json_schema_extra=extra)


@dataclass(frozen=True)
class KnobSpec:
    """A knob's declaration as the CLI, the page and the API read it."""

    name: str
    group: str  # "decoding" (the paper's knobs) or "aids" (the reader aids)
    kind: str  # "int", "float", "bool" or "choice"
    aided: Any
    paper: Any
    label: str
    help: str
    why: str
    lo: float | None = None
    hi: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()
    ends: tuple[str, str] = ("", "")
    flag: str = ""
    trained: Any = None

    def default(self, preset: str) -> Any:
        return {"paper": self.paper, "aided": self.aided, "trained": self.trained}[preset]

    def defaults_text(self) -> str:
        """Its value per preset, in words: "5", or "aided 2, paper 1" where they differ."""
        values = {p: self.default(p) for p in PRESETS}
        if len(set(map(repr, values.values()))) == 1:
            return f"{self.paper}"
        return ", ".join(f"{p} {v}" for p, v in values.items())


class _Knobs(BaseModel):
    """A validated group of knobs. Values arrive as the page, the CLI or JSON send them (sliders
    send 5.0, the CLI "5", a checkbox a bool): whole numbers, numbers and true/false are parsed,
    a bool is never a number, and anything refused is a ValueError naming the value and the fix."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ValueError(_message(e)) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info) -> Any:
        kind = _kind(cls.model_fields[info.field_name].annotation)
        if isinstance(v, bool) and kind in ("int", "float"):
            raise ValueError(f"{info.field_name}={v!r} is not a number: give a number.")
        return v


class Decoding(_Knobs):
    """The paper's knobs: how many passages, how the search runs, and the prompt every run needs.

    The prompt is not the algorithm (the paper's BART answers in a few words because it was
    fine-tuned to), but every generator needs one: `answer_style` and `max_doc_tokens` shape it."""

    k: int = knob(5, lo=1, hi=20, step=1, label="Passages K",
                  help="How many passages the retriever hands the generator.",
                  why="The paper reads 5 to 10 passages at test time; each one more is a generator row per step.")
    num_beams: int = knob(1, aided=2, lo=1, hi=8, step=1, flag="--beams", ends=("greedy", ""),
                          label="Beam size (1 = greedy)",
                          help="Hypotheses the search keeps at each step; 1 is greedy decoding.",
                          why="The paper decodes open-domain QA greedily; two beams find better answers for the "
                              "small reader (docs/results.md).")
    max_new_tokens: int = knob(32, lo=1, hi=256, step=1, label="Max new tokens",
                               help="The longest answer, in generated tokens.",
                               why="Factoid answers fit in 32 tokens; longer only costs time.")
    sequence_decoding: Literal["thorough", "fast"] = knob(
        "thorough", aided="fast", flag="--decoding", label="RAG-Sequence decoding",
        help="thorough: rescore every candidate under every passage; fast: count a candidate only under "
             "the passages whose search wrote it (paper §2.5).",
        why="The paper uses thorough decoding for short answers; fast ranked the small reader's candidates "
            "better and faster (docs/results.md).")
    length_penalty: float = knob(0.0, lo=0.0, hi=2.0, step=0.25, ends=("the summed log-prob: the paper's score",
                                                                       "longer answers favoured"),
                                 label="Length penalty",
                                 help="Beam search ranks finished answers by summed log-prob / length^L.",
                                 why="The paper's score has no length normalisation; 1 (transformers' default) "
                                     "favoured copied sentences.")
    prior_temperature: float = knob(1.0, lo=0.05, hi=20.0, step=0.05, ends=("sharper", "flatter"),
                                    label="Retrieval temperature",
                                    help="p(z|x) = softmax(score / T): above 1 spreads the answer over more "
                                         "passages, below 1 leans on the top one.",
                                    why="1 is the retriever's own p(z|x); the slider shows how the modes mix.")
    answer_style: Literal["short", "sentence"] = knob("short", label="Answer style",
        help="short: the prompt asks for the shortest phrase and the answer ends at its full stop; "
             "sentence: a full sentence (BART ignores it).",
        why="Exact match credits only short spans, the paper's answers are a few words, and the short "
            "prompt scored better with no aid on (docs/results.md).")
    max_doc_tokens: int = knob(192, lo=16, hi=1024, step=16, label="Passage tokens",
                               help="Tokens of each passage the generator reads; the question is never cut.",
                               why="~100-word passages are 130-150 tokens: 192 keeps them whole and bounds the "
                                   "worst case.")
    retriever: Literal["dense", "bm25", "hybrid"] = knob(
        "dense", label="Retriever",
        help="dense: the question encoder's nearest passages (the paper's); bm25: passages sharing the "
             "question's words; hybrid: both lists fused by reciprocal rank.",
        why="The paper retrieves densely (DPR); BM25 is its baseline, and hybrid shows what fusing the two buys "
            "(docs/results.md).")
    weights: Literal["base", "trained"] = knob(
        "base", trained="trained", label="Weights",
        help="base: the retriever and generator as published; trained: the generator fine-tuned with RAG's own "
             "loss on labelled questions (python -m rag_demo train; the question map ships only where it helps).",
        why="The paper trains its retriever's question side and its generator end to end (§2.4); the demo shows "
            "what that buys a small model (docs/results.md).")


class ReaderAids(_Knobs):
    """Aids that help a small generator read its passages; the paper preset turns every one off.

    Each attaches to the paper's algorithm as a named hook (rag_demo/reader/): it changes the
    prior, which candidates compete, which tokens the search may pick or which answer is kept,
    never how a kept answer is scored, so every log-probability stays the model's."""

    worked_examples: int = knob(0, aided=4, lo=0, hi=4, step=1, ends=("none", ""), label="Worked examples",
                                help="Invented passages answered in the answer style, shown before the question.",
                                why="They show the task (name the asked-for thing, then stop); the K prompts "
                                    "share them, so they are computed once.")
    question_weight: float = knob(0.0, aided=0.5, lo=0.0, hi=5.0, step=0.25,
                                  ends=("the retriever's p(z|x) alone", "the generator's vote counts that much"),
                                  label="Generator's vote on the passages",
                                  help="p(z|x) = softmax((score + w · log p(question | passage)) / T): the generator "
                                       "reweighs the passages by how well each explains the question.",
                                  why="It put a gold passage first more often on the external questions (UPR, "
                                      "Sachan et al. 2022; docs/results.md).")
    question_position: Literal["after", "both"] = knob(
        "after", label="Question position",
        help="after: the passage, then the question; both: the question before the passage too.",
        why="Off by default: it did not help the small reader (experiments/README.md).")
    passage_sentences: int = knob(0, lo=0, hi=20, step=1, ends=("the whole passage", ""),
                                  label="Sentences per passage",
                                  help="0 = the whole passage; n = the n sentences the retriever finds closest to "
                                       "the question.",
                                  why="Off by default: whole passages answered as well (experiments/README.md).")
    extractive: bool = knob(False, aided=True, label="Copy the answer from a passage",
                            help="Decoding may only continue a span of the passages (each its own in RAG-Sequence); "
                                 "scores stay the model's.",
                            why="The small reader otherwise mixes its own guesses into copied names and numbers.")
    copy_min_prior: float = knob(0.0, aided=0.05, lo=0.0, hi=1.0, step=0.05,
                                 ends=("copy from any of the K passages", "only from the most likely one"),
                                 label="RAG-Token copies from passages with p(z|x) at least",
                                 help="With extractive answers, RAG-Token copies only from passages the mixture "
                                      "reads (the most likely one always).",
                                 why="A passage at p(z|x) ≈ 0 adds nothing to the mixture; copying its words let the "
                                     "model's guesses through.")
    echo_retries: int = knob(0, aided=3, lo=0, hi=5, step=1, ends=("keep answers that repeat the question", ""),
                             label="Retry answers that only repeat the question",
                             help="An answer made of the question's words is decoded again with its first token "
                                  "banned, up to n times.",
                             why="The small reader often answers with its passage's subject, which the question "
                                 "already named.")
    echo_subjects: bool = knob(False, aided=True, label="Also retry answers naming the question's subject",
                               help="An answer that only names what the question is about (a retrieved passage's "
                                    "title the question names) is retried like an echo.",
                               why="'What did Alfred Nobel invent?' answered 'Alfred Nobel' is no answer.")
    recase_question: bool = knob(False, aided=True, label="Case the question as the passages do",
                                 help="A question typed in lower case reaches the generator cased as the retrieved "
                                      "passages write its words.",
                                 why="The small reader reads 'george eastman' as a weaker name than 'George Eastman'.")
    token_drafts: bool = knob(False, aided=True, label="RAG-Token also weighs each passage's drafts",
                              help="RAG-Token ranks its beams and each passage's own drafts by its exact "
                                   "log p(y|x), not only its beams.",
                              why="The mixture's search only approximates its argmax; with extractive copies it "
                                  "misses answers the model scores higher.")
    title_candidates: bool = knob(False, aided=True, label="Passage titles compete as answers",
                                  help="With short answers each passage's title is also an answer of its passage, "
                                       "scored exactly.",
                                  why="The subject of a passage is often the answer, and a copying search can miss it.")
    context_contrast: float = knob(0.0, lo=0.0, hi=4.0, step=0.25,
                                   ends=("off: the paper's decoding", "the passages' pull counts that much more"),
                                   label="Context-aware decoding",
                                   help="Choose each token by (1 + a) log p(with passages) − a log p(without) "
                                        "(Shi et al. 2023; greedy only).",
                                   why="Off by default: it did not help the small reader (experiments/README.md).")


GROUPS = {"decoding": Decoding, "aids": ReaderAids}


def _kind(annotation: Any) -> str:
    if annotation is bool:
        return "bool"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    return "choice"


def _spec(name: str, group: str, f) -> KnobSpec:
    extra = f.json_schema_extra
    lo = next((m.ge for m in f.metadata if isinstance(m, annotated_types.Ge)), None)
    hi = next((m.le for m in f.metadata if isinstance(m, annotated_types.Le)), None)
    kind = _kind(f.annotation)
    choices = tuple(f.annotation.__args__) if kind == "choice" else ()
    return KnobSpec(name, group, kind, extra["aided"], f.default, extra["label"], f.description, extra["why"], lo, hi,
                    extra["step"], choices, tuple(extra["ends"]), extra["flag"] or "--" + name.replace("_", "-"),
                    extra["trained"])


KNOBS: dict[str, KnobSpec] = {name: _spec(name, group, f) for group, cls in GROUPS.items()
                              for name, f in cls.model_fields.items()}


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _message(e: ValidationError) -> str:
    """A pydantic error as the library says it: the setting, its value, what is wrong and the fix."""
    err = e.errors()[0]
    name = str(err["loc"][-1]) if err["loc"] else ""
    v = err.get("input")
    spec = KNOBS.get(name)
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown setting {name!r}: known are {', '.join(KNOBS)} and preset."
    if kind == "value_error":
        return str(err["ctx"]["error"])
    if spec is None:
        return f"{name}={v!r}: {err['msg']}."
    if kind == "int_from_float":
        return f"{name}={v!r} is not a whole number: give a whole number, e.g. {round(float(v))}."
    if kind == "int_parsing" and _is_number(v):
        return f"{name}={v!r} is not a whole number: give a whole number, e.g. {round(float(v))}."
    if kind.startswith(("int_", "float_")):
        return f"{name}={v!r} is not a number: give e.g. {spec.aided!r}."
    if kind in ("greater_than_equal", "less_than_equal"):
        lo, hi = (f"{x:g}" + (f" ({m})" if m else "") for x, m in zip((spec.lo, spec.hi), spec.ends))
        return f"{name}={v!r} is out of range: use {lo} to {hi}."
    if kind.startswith("bool"):
        return f"{name}={v!r} is not true or false: pass True or False."
    if kind == "literal_error":
        return f"{name}={v!r} is unknown: use one of {', '.join(spec.choices)}."
    return f"{name}={v!r}: {err['msg']}."


# ---------------------------------------------------------------- the settings of one question

class RagSettings(BaseModel):
    """The settings of one question: a preset, the paper's knobs and the reader aids.

    `RagSettings(preset="paper", k=3)` takes knobs by name (flat); a knob left out takes the
    preset's value. `merged(**knobs)` is a validated copy with some knobs changed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: Literal["paper", "aided", "trained"] = "paper"  # the reference; the others are named where they are used
    decoding: Decoding = Field(default_factory=Decoding)
    aids: ReaderAids = Field(default_factory=ReaderAids)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ValueError(_message(e)) from None

    @model_validator(mode="before")
    @classmethod
    def _from_knobs(cls, data: Any) -> Any:
        """Flat knobs -> the two groups, starting from the preset's values (None: the preset's)."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        preset = data.get("preset", "paper")
        if preset not in PRESETS:
            raise ValueError(f"preset={preset!r} is unknown: use one of {', '.join(PRESETS)} "
                             f"({'; '.join(f'{p}: {d}' for p, d in PRESETS.items())}).")
        unknown = sorted(set(data) - set(KNOBS) - {"preset", "decoding", "aids"})
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}: known are {', '.join(KNOBS)} and preset.")
        groups: dict[str, dict] = {g: {n: s.default(preset) for n, s in KNOBS.items() if s.group == g} for g in GROUPS}
        for g in GROUPS:
            given = data.get(g)
            if isinstance(given, BaseModel):
                given = given.model_dump()
            groups[g].update(given or {})
        for name, v in data.items():
            if name in KNOBS:
                groups[KNOBS[name].group][name] = v
        return {"preset": preset, **groups}

    @classmethod
    def for_stack(cls, stack: str, **knobs: Any) -> "RagSettings":
        """The stack's default preset (offline: aided; paper: paper) with these knobs."""
        return cls(preset=knobs.pop("preset", None) or PRESET_OF_STACK.get(stack, "aided"), **knobs)

    def knobs(self) -> dict[str, Any]:
        """Every knob by name, flat (what the CLI, the API and eval reports name)."""
        return {**self.decoding.model_dump(), **self.aids.model_dump()}

    def merged(self, **knobs: Any) -> "RagSettings":
        """A validated copy with the given knobs (None: unchanged) or another preset; changing the
        preset resets every knob not given to the new preset's value."""
        knobs = {k: v for k, v in knobs.items() if v is not None}
        preset = knobs.pop("preset", self.preset)
        base = self.knobs() if preset == self.preset else {}
        return RagSettings(preset=preset, **{**base, **knobs})

    def changed(self) -> dict[str, Any]:
        """The knobs whose value is not the preset's own (what a card says besides the preset)."""
        return {n: v for n, v in self.knobs().items() if v != KNOBS[n].default(self.preset)}

    def aids_on(self) -> list[str]:
        """The reader aids that change anything here (paper preset: none)."""
        off = {n: s.paper for n, s in KNOBS.items() if s.group == "aids"}
        return [n for n, v in self.aids.model_dump().items() if v != off[n]]

    def describe(self) -> str:
        """What ran, in words: the preset's name and any knob changed from it."""
        changed = self.changed()
        extra = f" (changed: {', '.join(f'{n}={v}' for n, v in changed.items())})" if changed else ""
        return PRESETS[self.preset] + extra

    def to_dict(self) -> dict[str, Any]:
        """JSON: the preset, what it means, every knob (flat), the aids that are on, the knobs changed."""
        return {"preset": self.preset, "preset_title": PRESETS[self.preset], **self.knobs(),
                "aids_on": self.aids_on(), "changed": self.changed()}


# ---------------------------------------------------------------- questions and modes

def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown: use one of {', '.join(MODES)} (or 'all' on the command line).")
    return mode


def check_question(question: object) -> str:
    """The question stripped, or a ValueError naming the problem and the fix."""
    if not isinstance(question, str):
        raise ValueError(f"question must be text, got {type(question).__name__}: pass a string.")
    q = question.strip()
    if not q:
        raise ValueError("question is empty: type a question, e.g. 'Who painted The Starry Night?'.")
    if len(q) > MAX_QUESTION_CHARS:
        raise ValueError(
            f"question is {len(q)} characters, over the limit of {MAX_QUESTION_CHARS}: shorten it to one or two sentences."
        )
    return q
