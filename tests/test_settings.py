"""Settings declared once (rag_demo/config.py): validation, presets, and the command line generated
from each knob's declaration. Every test runs over every knob, so a new knob is tested here
without a line added."""
from __future__ import annotations

import pytest

from rag_demo.cli import build_parser, main, settings_from_args
from rag_demo.config import KNOBS, PRESETS, RagSettings


def _inside(spec, preset="paper"):
    """A value inside the knob's range that is not its default in `preset`."""
    default = spec.default(preset)
    if spec.kind == "bool":
        return not default
    if spec.kind == "choice":
        return next(c for c in spec.choices if c != default)
    return spec.hi if default != spec.hi else spec.lo


@pytest.mark.parametrize("name", [n for n, s in KNOBS.items() if s.step])
def test_a_sliders_ends_and_defaults_lie_on_its_steps(name):
    """A slider reaches only lo + n * step: its maximum and every preset's default must be such a
    value, or the page could never be set to them (the browser snaps to the nearest step)."""
    spec = KNOBS[name]
    for v in (spec.hi, spec.paper, spec.aided, getattr(spec, "trained", spec.paper)):
        n = (v - spec.lo) / spec.step
        assert abs(n - round(n)) < 1e-9, (name, v, spec.lo, spec.step)


@pytest.mark.parametrize("name", list(KNOBS))
def test_each_knob_takes_its_range_and_refuses_the_rest_by_name(name):
    spec = KNOBS[name]
    v = _inside(spec)
    assert RagSettings(**{name: v}).knobs()[name] == v
    assert RagSettings().merged(**{name: v}).changed() == {name: v}
    if spec.kind in ("int", "float"):
        for bad in (spec.lo - 1, spec.hi + 1):
            with pytest.raises(ValueError, match=rf"^{name}={bad!r} is out of range: use {spec.lo:g}.* to {spec.hi:g}"):
                RagSettings(**{name: bad})
        with pytest.raises(ValueError, match=rf"^{name}='lots' is not a number"):
            RagSettings(**{name: "lots"})
        with pytest.raises(ValueError, match=rf"^{name}=True is not a number"):
            RagSettings(**{name: True})
        assert RagSettings(**{name: str(v)}).knobs()[name] == v  # the CLI's text
        assert RagSettings(**{name: float(v)}).knobs()[name] == v  # a slider's float
    if spec.kind == "int":
        with pytest.raises(ValueError, match=rf"^{name}={v + 0.5!r} is not a whole number: give a whole number"):
            RagSettings(**{name: v + 0.5})
    if spec.kind == "bool":
        assert RagSettings(**{name: str(v).lower()}).knobs()[name] is v
        with pytest.raises(ValueError, match=rf"^{name}='maybe' is not true or false: pass True or False"):
            RagSettings(**{name: "maybe"})
    if spec.kind == "choice":
        with pytest.raises(ValueError, match=rf"^{name}='{v.upper()}' is unknown: use one of {', '.join(spec.choices)}"):
            RagSettings(**{name: v.upper()})


def test_unknown_settings_and_presets_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['temperature'\]: known are k, num_beams"):
        RagSettings(temperature=2)
    with pytest.raises(ValueError, match=r"preset='plain' is unknown: use one of paper, aided"):
        RagSettings(preset="plain")


def test_the_paper_preset_turns_every_aid_off_and_decodes_as_the_paper():
    paper = RagSettings(preset="paper")
    assert paper.aids_on() == [] and paper.changed() == {}
    assert (paper.decoding.num_beams, paper.decoding.sequence_decoding, paper.decoding.prior_temperature,
            paper.decoding.length_penalty) == (1, "thorough", 1.0, 0.0)
    assert paper.aids.worked_examples == 0 and paper.aids.question_weight == 0 and not paper.aids.token_drafts
    assert RagSettings() == paper  # built with no arguments: the paper, the reference
    aided = RagSettings(preset="aided")
    assert aided.preset == "aided" and set(aided.aids_on()) >= {"worked_examples", "question_weight", "extractive",
                                                                "echo_retries", "token_drafts", "title_candidates"}
    # switching the preset resets every knob not given; a knob given is kept and reported as changed
    assert aided.merged(preset="paper") == paper
    assert paper.merged(echo_retries=2).changed() == {"echo_retries": 2}
    assert paper.merged(echo_retries=2).aids_on() == ["echo_retries"]
    assert paper.describe() == PRESETS["paper"] and "echo_retries=2" in paper.merged(echo_retries=2).describe()
    assert RagSettings.for_stack("paper").preset == "paper" and RagSettings.for_stack("offline").preset == "aided"


def test_settings_say_what_ran_in_json():
    d = RagSettings(preset="paper", k=3).to_dict()
    assert d["preset"] == "paper" and d["preset_title"] == PRESETS["paper"] and d["aids_on"] == []
    assert d["changed"] == {"k": 3} and all(n in d for n in KNOBS)


@pytest.mark.parametrize("command", [["ask", "Q?"], ["eval"], ["bench"]])
def test_every_knob_has_a_command_line_flag(command):
    parser = build_parser()
    none = parser.parse_args(command)
    assert settings_from_args(none) == RagSettings(preset="aided")  # no flag: the offline stack's preset
    assert settings_from_args(parser.parse_args([*command, "--preset", "paper"])) == RagSettings()
    for name, spec in KNOBS.items():
        v = _inside(spec, "aided")
        args = parser.parse_args([*command, spec.flag, str(v).lower() if spec.kind == "bool" else str(v)])
        assert settings_from_args(args).changed() == {name: v}, name


def test_a_bad_flag_value_exits_2_with_the_librarys_message(capsys):
    assert main(["eval", "--qa", "assets/qa_dev.jsonl", "--answer-style", "essay"]) == 2
    assert "answer_style='essay' is unknown" in capsys.readouterr().err
    assert main(["eval", "--qa", "assets/qa_dev.jsonl", "--beams", "2.5"]) == 2
    assert "num_beams=2.5 is not a whole number" in capsys.readouterr().err


def test_the_core_built_with_no_arguments_is_the_paper():
    """Defaults are the reference: `Decoding()` (what rag_token, rag_sequence and closed_book are
    given), `ReaderAids()` and `RagSettings()` are the paper preset (greedy, thorough RAG-Sequence,
    every aid off); the aided preset is only what is named so."""
    from rag_demo.config import Decoding, ReaderAids

    paper = RagSettings(preset="paper")
    assert Decoding() == paper.decoding and ReaderAids() == paper.aids and RagSettings() == paper
    assert (Decoding().num_beams, Decoding().sequence_decoding, Decoding().length_penalty) == (1, "thorough", 0.0)
    assert RagSettings(preset="aided").aids_on() and RagSettings(preset="aided").decoding != Decoding()
