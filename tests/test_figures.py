"""The figures of a sweep (measure/figures.py) and `eval --plot`, on a small tidy run built here.

The run: four questions q1..q4 of one question set. Dense retrieval finds a gold passage for the
first 1, 2 and 3 questions at K = 1, 3, 5; each (mode, preset) answers the first `RIGHT[...]`
questions right at each K, so every mean below is a count over four, worked out by hand.
Question q4 runs K = 5 first (order 0), the others run K ascending, which the time figure must
respect. The charts are checked through their Vega-Lite specs: the data each layer draws and its
encodings, which is what a reader sees.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rag_demo.config import MODE_COLOURS, MODE_TITLES
from rag_demo.measure import figures as fig

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ("q1", "q2", "q3", "q4")
KS = (1, 3, 5)
# questions answered right (the first n) at K = 1, 3, 5
RIGHT = {("sequence", "aided"): (1, 2, 3), ("sequence", "paper"): (0, 1, 2),
         ("token", "aided"): (1, 1, 2), ("token", "paper"): (0, 0, 1)}
CLOSED_RIGHT = {"aided": 2, "paper": 1}
GOLD = {"dense": (1, 2, 3), "bm25": (0, 1, 2), "hybrid": (2, 3, 4)}  # questions with a gold passage at each K
META = {"command": "python -m rag_demo eval --sweep --qa assets/qa_dev.jsonl --ks 1,3,5", "date": "2026-11-27",
        "cpu": "AMD EPYC (family 25 model 1), no native bfloat16", "qa": "assets/qa_dev.jsonl", "questions": 4}


def _order(q: int, k_index: int) -> int:
    return (0, 1, 2)[k_index] if q < 3 else (1, 2, 0)[k_index]  # q4 ran K=5 first


def tidy_rows(qa: str = "qa_dev") -> list[dict]:
    rows = []
    for q, qid in enumerate(QUESTIONS):
        for retriever, found in GOLD.items():
            for i, k in enumerate(KS):
                rows.append({"qa": qa, "question_id": qid, "mode": "retrieval", "preset": None, "retriever": retriever,
                             "k": k, "em": None, "f1": None, "contains": None, "gold_in_top_k": q < found[i],
                             "order": _order(q, i), "confidence": None, "cues": []})
        for (mode, preset), right in RIGHT.items():
            for i, k in enumerate(KS):
                ok = float(q < right[i])
                order = _order(q, i)
                seconds = (10.0 if order == 0 else 1.0) if preset == "aided" else (4.0 if order == 0 else 0.5)
                # token: a flat 0.6; sequence: 0.9 when right, 0.2 when wrong, but q1's first aided answer
                # is right at 0.2 (the cue flags it wrongly)
                confidence = 0.6 if mode == "token" else 0.9 if ok and (q, i, preset) != (0, 0, "aided") else 0.2
                rows.append({"qa": qa, "question_id": qid, "mode": mode, "preset": preset, "retriever": "dense",
                             "k": k, "em": ok, "f1": ok, "contains": ok, "gold_in_top_k": q < GOLD["dense"][i],
                             "logprob": -1.5, "n_tokens": 3, "seconds": seconds, "answer": "x", "order": order,
                             "confidence": confidence, "cues": [], "signals": {"unknown": 1}})
        for preset, right in CLOSED_RIGHT.items():
            rows.append({"qa": qa, "question_id": qid, "mode": "closed-book", "preset": preset, "retriever": None,
                         "k": None, "em": float(q < right), "f1": float(q < right), "contains": float(q < right),
                         "gold_in_top_k": None, "seconds": 0.5, "order": None, "confidence": None,
                         "cues": ["not_in_passages"]})
    return rows


@pytest.fixture
def df() -> pd.DataFrame:
    return fig.tidy(pd.DataFrame(tidy_rows()))


def write_run(folder: Path, rows: list[dict], meta: dict | None = META, tail: str = "") -> Path:
    run = folder / "s.jsonl"
    run.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    if meta is not None:
        (folder / "s.meta.json").write_text(json.dumps(meta))
    return run


def layers(chart) -> list[tuple[str, list[dict], dict]]:
    """(mark type, the rows it draws, its encoding) per layer of a chart's Vega-Lite spec."""
    spec = chart.to_dict()
    out = []
    for layer in spec.get("layer", [spec]):
        mark = layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
        data = layer.get("data", spec.get("data"))
        out.append((mark, spec["datasets"][data["name"]] if "name" in data else data["values"], layer["encoding"]))
    return out


def title_of(chart) -> str:
    title = chart.to_dict()["title"]["text"]
    return " ".join(title) if isinstance(title, list) else title


def by(rows: list[dict], *keys: str) -> dict:
    return {tuple(r[k] for k in keys): r["value"] for r in rows}


# ---------------------------------------------------------------- the figures' numbers

def test_accuracy_vs_k_draws_each_modes_mean_per_k_and_closed_book_flat(df):
    (line, line_rows, _), (point, _, _), (rule, rule_rows, rule_enc) = layers(fig.accuracy_vs_k(df))
    assert (line, point, rule) == ("line", "point", "rule")
    expected = {(m, p, k): 100 * right[i] / 4 for (m, p), right in RIGHT.items() for i, k in enumerate(KS)}
    assert by(line_rows, "mode", "preset", "k") == expected
    # closed-book reads no passages: one value per preset, drawn with no x, i.e. across every K
    assert by(rule_rows, "mode", "preset") == {("closed-book", "aided"): 50.0, ("closed-book", "paper"): 25.0}
    assert "x" not in rule_enc and rule_enc["y"]["field"] == "value"


def test_accuracy_vs_k_speaks_of_a_slope_only_where_several_k_were_run(df):
    several = " ".join(fig.accuracy_vs_k(df).to_dict()["title"]["subtitle"])
    assert "slope between K = 1, 3, 5" in several
    one = df[df["k"].isna() | (df["k"] == 5)]
    said = " ".join(fig.accuracy_vs_k(one).to_dict()["title"]["subtitle"])
    assert "Only K = 5 was run" in said and "one point, not a curve" in said and "slope" not in said


def test_accuracy_vs_k_tells_the_presets_apart_by_dash_and_names_them(df):
    _, _, enc = layers(fig.accuracy_vs_k(df))[0]
    scale = enc["strokeDash"]["scale"]
    assert scale["domain"] == [fig.PRESET_TITLES["aided"], fig.PRESET_TITLES["paper"]]
    assert scale["range"][0] == [1, 0] and scale["range"][1] != [1, 0]  # aided solid, paper dashed


def test_recall_vs_k_is_the_share_of_questions_with_a_gold_passage(df):
    chart = fig.recall_vs_k(df)
    (_, rows, enc), = layers(chart)
    assert by(rows, "retriever", "k") == {(r, k): 100 * found[i] / 4 for r, found in GOLD.items()
                                          for i, k in enumerate(KS)}
    colours = enc["color"]["scale"]["range"]
    assert colours == [fig.RETRIEVER_COLOURS[r] for r in ("dense", "bm25", "hybrid")]
    assert not set(colours) & set(MODE_COLOURS.values())  # a retriever is never mistaken for a mode


def test_accuracy_given_retrieval_joins_closed_book_to_the_dense_retrieval_row(df):
    (_, rows, enc), = layers(fig.accuracy_given_retrieval(df, k=5))
    got = {(r["mode"], r["preset"], r["retrieved"]): (r["value"], r["n"]) for r in rows}
    gold, none = "gold in top 5", "no gold in top 5"
    # dense K=5 holds a gold passage for q1..q3, not q4
    assert got[("sequence", "aided", gold)] == (100.0, 3) and got[("sequence", "aided", none)] == (0.0, 1)
    assert got[("closed-book", "aided", gold)] == (pytest.approx(200 / 3), 3)
    assert got[("closed-book", "paper", gold)] == (pytest.approx(100 / 3), 3)
    assert got[("closed-book", "paper", none)] == (0.0, 1)
    assert "n" in [t["title"] for t in enc["tooltip"]]


def test_plain_vs_aided_times_only_each_questions_first_k(df):
    (_, rows, _), (_, points, enc) = layers(fig.plain_vs_aided(df, k=5))
    got = {(r["mode"], r["preset"]): (r["value"], r["seconds"], r["timing"]) for r in points}
    # at K=5 only q4 ran first (order 0): its seconds, not the median of all four (1.0 and 0.5)
    assert got[("sequence", "aided")] == (75.0, 10.0, fig.FRESH)
    assert got[("sequence", "paper")] == (50.0, 4.0, fig.FRESH)
    assert got[("closed-book", "aided")] == (50.0, 0.5, fig.FRESH)
    assert enc["x"]["title"] == "seconds per answer (median)" and enc["y"]["title"] == "accuracy (%)"


def test_plain_vs_aided_says_when_no_answer_at_that_k_was_timed_first(df):
    chart = fig.plain_vs_aided(df, k=3)  # K=3 never ran first
    _, points, _ = layers(chart)[1]
    timing = {(r["mode"], r["preset"]): (r["seconds"], r["timing"]) for r in points}
    assert timing[("token", "aided")] == (1.0, fig.KEPT) and timing[("closed-book", "paper")] == (0.5, fig.FRESH)
    assert "kept states" in " ".join(chart.to_dict()["title"]["subtitle"])


def test_reliability_bins_the_confidence_against_answers_right(df):
    chart = fig.reliability(df)
    (diagonal, _, _), (_, rows, _) = layers(chart)
    assert diagonal == "line"
    # sequence: 15 wrong at 0.2 plus 1 right at 0.2; 8 right at 0.9. token: 5 of 24 right, all at 0.6.
    # Four bins of equal count per mode (6 answers each), in order of confidence.
    for mode, right in (("sequence", 9), ("token", 5)):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["bin"])
        assert [r["n"] for r in mine] == [6, 6, 6, 6]
        assert sum(r["right"] * r["n"] for r in mine) == pytest.approx(100 * right, abs=0.1)  # shares kept to 4 places
        assert [r["confidence"] for r in mine] == sorted(r["confidence"] for r in mine)
    top = max((r for r in rows if r["mode"] == "sequence"), key=lambda r: r["bin"])
    assert (top["confidence"], top["right"]) == (pytest.approx(90.0), 100.0)  # the six surest: all at 0.9, all right
    assert "closed-book" not in {r["mode"] for r in rows}  # its confidence is null: left out


def test_cue_quality_is_precision_and_recall_of_the_probably_wrong_cue(df):
    table = fig.cue_quality(df, 0.5)
    assert set(table["mode"]) == {"sequence", "token"} and set(table["preset"]) <= {"paper", "aided"}
    per = table.groupby("mode")[["answers", "flagged", "wrong"]].sum()
    assert tuple(per.loc["sequence"]) == (24, 16, 15) and per.loc["token", "flagged"] == 0
    for _, r in table.iterrows():  # each row's shares from its own counts
        assert r.flagged == 0 and math.isnan(r.precision) or 0 <= r.precision <= 1
    pooled = fig.cue_quality(df.assign(preset="aided"), 0.5).set_index("mode")
    assert pooled.loc["sequence", "precision"] == round(15 / 16, 3) and pooled.loc["sequence", "recall"] == 1.0
    assert math.isnan(pooled.loc["token", "precision"]) and pooled.loc["token", "recall"] == 0.0
    # no threshold: each answer's own cue decides
    cued = df.assign(preset="aided", cues=[["probably_wrong"] if c is not None and c < 0.5 else [] for c in df["confidence"]])
    assert fig.cue_quality(cued).equals(pooled.reset_index()[fig.cue_quality(cued).columns])
    with pytest.raises(ValueError, match="threshold=1.5"):
        fig.cue_quality(df, 1.5)


# ---------------------------------------------------------------- what every chart shares

def test_every_figure_fits_a_phone_and_says_what_to_notice(df):
    for name, chart in fig.figures(df).items():
        spec = chart.to_dict()
        assert spec["width"] == "container" and 260 <= spec["height"] <= 300, name
        assert spec["title"]["text"] and spec["title"]["subtitle"], name
        assert "bottom" in spec["config"]["legend"]["layout"]["expr"], name
        for _, _, enc in layers(chart):
            legend = enc.get("color", {}).get("legend")
            assert legend is None or legend["orient"] == "bottom", name


def test_modes_keep_their_colour_and_title_in_every_figure(df):
    charts = fig.figures(df)
    for name in ("accuracy_vs_k", "accuracy_given_retrieval", "plain_vs_aided", "reliability"):
        for _, _, enc in layers(charts[name]):
            if enc.get("color", {}).get("field") != "mode_title":
                continue
            scale = enc["color"]["scale"]
            modes = {title: mode for mode, title in MODE_TITLES.items()}
            assert [MODE_COLOURS[modes[t]] for t in scale["domain"]] == scale["range"], name


def test_a_figure_without_its_rows_is_a_chart_that_says_so(df):
    retrieval_only = df[df["mode"] == "retrieval"]
    retrieval_only.attrs["source"] = "s.jsonl"
    charts = fig.figures(retrieval_only)
    for name in ("accuracy_vs_k", "accuracy_given_retrieval", "plain_vs_aided", "reliability"):
        assert title_of(charts[name]) == "no rows for this figure in s.jsonl", name
        assert charts[name].to_dict()["width"] == "container"
    assert "no rows" not in title_of(charts["recall_vs_k"])
    assert "no rows" in title_of(fig.recall_vs_k(df[df["mode"] != "retrieval"]))
    # one preset only: still drawn, with that preset's dash alone
    _, _, enc = layers(fig.accuracy_vs_k(df[df["preset"] != "paper"]))[0]
    assert enc["strokeDash"]["scale"]["domain"] == [fig.PRESET_TITLES["aided"]]


def test_rows_of_two_question_sets_must_be_told_apart(df):
    both = pd.concat([df, fig.tidy(pd.DataFrame(tidy_rows("qa_other")))])
    with pytest.raises(ValueError, match="qa="):
        fig.accuracy_vs_k(both)
    assert len(layers(fig.accuracy_vs_k(both, qa="qa_other"))[0][1]) == 12
    with pytest.raises(ValueError, match="metric='bleu'"):
        fig.accuracy_vs_k(df, metric="bleu")


def test_a_learners_sweep_is_drawn_on_top_as_your_sweep(df):
    mine = df[df["question_id"].isin(["q1", "q2"])]
    *_, (mark, rows, enc) = layers(fig.accuracy_vs_k(df, extra=mine))
    assert mark == "point" and enc["shape"]["scale"]["domain"] == [fig.YOURS]
    assert {r["source"] for r in rows} == {fig.YOURS}
    # the learner's own means: sequence aided answered q1 right at K=1 and q1, q2 at K=3
    points = {(r["mode"], r["preset"], r["k"]): r["value"] for r in rows}
    assert points[("sequence", "aided", 1)] == 50.0 and points[("sequence", "aided", 3)] == 100.0
    assert points[("closed-book", "paper", 5)] == 50.0  # closed-book marked at every K drawn
    for name in ("recall_vs_k", "accuracy_given_retrieval", "plain_vs_aided", "reliability"):
        chart = getattr(fig, name)(df, extra=mine)
        assert {r.get("source") for r in layers(chart)[-1][1]} == {fig.YOURS}, name
    assert all(r.get("source") != fig.YOURS for _, rows, _ in layers(fig.recall_vs_k(df)) for r in rows)


# ---------------------------------------------------------------- reading a run

def test_load_rows_skips_a_half_written_last_line(tmp_path):
    run = write_run(tmp_path, tidy_rows(), tail='{"qa": "qa_dev", "question_id": "q5", "mo')
    rows = fig.load_rows(run)
    assert len(rows) == len(tidy_rows()) and rows.attrs["skipped_last_line"]
    assert rows.attrs["source"] == "s.jsonl" and str(rows["k"].dtype) == "Int64"
    assert not fig.load_rows(write_run(tmp_path, tidy_rows())).attrs["skipped_last_line"]


@pytest.mark.parametrize("text, message", [
    ('{"qa": "a", "question_id": "1", "mode": "token"}\n{not json\n{"qa": "a", "question_id": "2", "mode": "token"}\n',
     "line 2 is not JSON"),
    (json.dumps({"questions": [], "recall": {}}, indent=1), "line 1 is not JSON"),  # an `eval --out` report
    ('{"questions": []}\n', "lacks qa, question_id, mode"),
    ('{"qa": "a", "question_id": "1", "mode": "beam"}\n', "mode 'beam'"),
    ('{"qa": "a", "question_id": "1", "mode": "token", "k": "five"}\n', "field 'k' holds 'five'"),
    ("\n", "holds no rows"),
])
def test_load_rows_rejects_what_is_not_a_tidy_run(tmp_path, text, message):
    run = tmp_path / "bad.jsonl"
    run.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        fig.load_rows(run)
    assert "bad.jsonl" in str(e.value)


def test_caption_names_the_questions_cpu_date_and_command(tmp_path):
    run = write_run(tmp_path, tidy_rows())
    text = fig.caption(fig.load_meta(run))
    for part in ("4 questions of assets/qa_dev.jsonl", "AMD EPYC", "2026-11-27", "Rerun: " + META["command"]):
        assert part in text
    assert "Date not recorded" in fig.caption({"qa": "x.jsonl", "command": "c"})
    (tmp_path / "s.meta.json").unlink()
    assert fig.load_meta(run) == {} and "unknown" in fig.caption({})
    (tmp_path / "s.meta.json").write_text("{")
    with pytest.raises(ValueError, match="s.meta.json"):
        fig.load_meta(run)


# ---------------------------------------------------------------- eval --plot

def test_eval_plot_writes_pngs_and_loads_no_model(tmp_path):
    run = write_run(tmp_path, tidy_rows())
    code = ("import sys; from rag_demo.cli import main; rc = main(['eval', '--plot', sys.argv[1]]); "
            "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'gradio'})); "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(run)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout
    written = [Path(line) for line in out.stdout.splitlines() if line.endswith(".png")]
    assert [p.name for p in written] == [f"{name}.png" for name in fig.FIGURES]
    for path in written:
        assert path.parent == tmp_path / "s_figures"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_plot_writes_html_when_asked(tmp_path, capsys):
    from rag_demo.cli import main

    run = write_run(tmp_path, tidy_rows())
    assert main(["eval", "--plot", str(run), "--plot-format", "html", "--plot-dir", str(tmp_path / "figs")]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / "figs" / f"{name}.html") for name in fig.FIGURES]
    page = Path(written[0]).read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and '"container"' in page
    assert "Rerun: " + META["command"] in page and "cdn.jsdelivr" not in page  # captioned, opens offline


def test_eval_plot_errors_are_exit_status_2(tmp_path, capsys):
    from rag_demo.cli import main

    assert main(["eval", "--plot", str(tmp_path / "missing.jsonl")]) == 2
    assert "error: cannot read the run" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("{}\n")
    assert main(["eval", "--plot", str(tmp_path / "bad.jsonl")]) == 2
    assert main(["eval", "--plot-format", "html"]) == 2
    assert "add --plot" in capsys.readouterr().err


def test_a_caption_names_every_command_that_filled_the_file_and_the_questions_drawn():
    """A run filled by two commands (answers, then recall rows for more questions) is remade by
    both, in order; the count is of the questions the figure draws, not the last command's."""
    first = {**META, "command": "eval --sweep --k 1,5", "date": "2026-11-26"}
    second = {**META, "command": "eval --sweep --modes none --k 20", "date": "2026-11-27"}
    meta = {**second, "runs": [first, first, second]}  # a resumed command is named once
    text = fig.caption(meta, questions=600)
    assert "Rerun: eval --sweep --k 1,5 then eval --sweep --modes none --k 20" in text
    assert "2026-11-26 to 2026-11-27" in text and "600 questions of" in text
    rows = fig.tidy(pd.DataFrame(tidy_rows()))
    assert fig.questions_drawn(rows, retrieval=False) == rows.loc[rows["mode"] != "retrieval", "question_id"].nunique()
