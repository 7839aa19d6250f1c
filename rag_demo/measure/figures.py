"""Figures of a sweep: the tidy rows that `eval --sweep` writes, drawn as charts a learner reads in a minute.

The sweep (measure/sweep.py) writes RUN.jsonl, one row per (question, setting), and beside it
RUN.meta.json (the command, CPU and date). Each figure function here takes those rows as a
pandas DataFrame and returns an Altair chart: the page's Results tab shows these same objects in
`gr.Plot`, and `python -m rag_demo eval --plot RUN` writes them as PNG (vl-convert) or HTML.

  accuracy_vs_k             answer accuracy against K, per mode and preset (the paper's Figure 3, left)
  recall_vs_k               retrieval recall@K, per retriever (Figure 3, centre)
  accuracy_given_retrieval  each mode's accuracy with and without a gold passage in the top K
  plain_vs_aided            accuracy against seconds per answer, plain RAG and the reader aids
  reliability, cue_quality  whether the answer card's confidence means what it says

Every chart fits a phone (the container's width, legends below), draws each mode in its colour
from config.MODE_COLOURS, and takes `extra`: a learner's own sweep, drawn on top as hollow
diamonds labelled "your sweep". A figure whose rows the run lacks is a chart saying so, not an
error. No torch and no gradio here: this module draws, it runs no model.
"""
from __future__ import annotations

import html
import textwrap
from pathlib import Path

import altair as alt
import pandas as pd

from rag_demo.config import KNOBS, MODE_COLOURS, MODE_TITLES, MODES
from rag_demo.measure.metrics import RELIABILITY_BINS, precision_recall, reliability_bins
from rag_demo.measure.run_rows import caption, in_split, load_meta, load_rows, questions_drawn, tidy

RAG_MODES = tuple(m for m in MODES if m != "closed-book")
METRICS = {"em": "exact match", "f1": "token F1", "contains": "gold answer contained"}
RETRIEVERS = KNOBS["retriever"].choices  # the retriever knob's values, declared once (config.Decoding)
TRAINED_TOWER = ", trained tower"  # a retriever read through the trained question tower (the sweep's preset rows)
RETRIEVER_TITLES = {"dense": "dense", "bm25": "BM25", "hybrid": "hybrid", "dense" + TRAINED_TOWER: "dense, trained",
                    "hybrid" + TRAINED_TOWER: "hybrid, trained"}
# Dark2's remaining hues: apart from the modes' green, purple and grey, and readable on white; a
# trained tower's line is its retriever's hue, darker (the paper's Table 6: frozen against learned)
RETRIEVER_COLOURS = {"dense": "#d95f02", "bm25": "#a6761d", "hybrid": "#e7298a", "dense" + TRAINED_TOWER: "#7f3700",
                     "hybrid" + TRAINED_TOWER: "#8a1650"}
# Short on purpose: a legend at phone width holds about 40 characters a line.
PRESET_TITLES = {"aided": "With reader aids", "paper": "Plain RAG, as in the paper", "trained": "Plain RAG, trained"}
PRESET_DASHES = {"aided": [1, 0], "paper": [6, 4], "trained": [2, 2]}
PRESET_SHAPES = {"aided": "circle", "paper": "triangle-up", "trained": "square"}
PRESET_OPACITY = {"aided": 1.0, "paper": 0.45, "trained": 1.0}
YOURS = "your sweep"
FRESH, KEPT = "first K asked", "after a smaller K (kept states: faster)"
FIGURES = ("accuracy_vs_k", "recall_vs_k", "accuracy_given_retrieval", "plain_vs_aided", "reliability")

HEIGHT = 280  # px: a phone shows the chart and its legend without scrolling
EXPORT_WIDTH = 640  # px of a saved figure (twice that in pixels at scale 2): a slide's width
TITLE_CHARS, SUBTITLE_CHARS = 38, 46  # a line of each at 390 px (the chart is ~300 px wide there); longer ones wrap
FORMATS = ("png", "html")
LEGEND_CHANNELS = ("color", "shape", "strokeDash", "opacity")
LEGENDS_STACKED = "{bottom: {anchor: 'start', direction: 'vertical', margin: 8}}"
# vega-embed reads its options from the spec: SVG keeps every label and point in the page (crisp in a
# screenshot, readable by a screen reader, and what a browser test can find)
SVG = {"embedOptions": {"renderer": "svg"}}


# ---------------------------------------------------------------- shared pieces

def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(str, allowed))}: pass one of those.")


def _check_k(k) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k={k!r} is not a number of passages: pass an integer K of 1 or more.")


def _one_set(df: pd.DataFrame | None, qa: str | None) -> pd.DataFrame | None:
    """The rows of one question set: means over two sets would mix questions of different difficulty."""
    if df is None:
        return None
    rows = tidy(df)
    sets = sorted(rows["qa"].dropna().unique())
    if qa is not None:
        if qa not in sets:
            raise ValueError(f"qa={qa!r} is not in these rows (they hold {', '.join(sets) or 'none'}): pass one of "
                             "those.")
        return rows[rows["qa"] == qa]
    if len(sets) > 1:
        raise ValueError(f"the rows hold {len(sets)} question sets ({', '.join(sets)}): pass qa= one of them.")
    return rows


def _rated_sets(df: pd.DataFrame | None, qa: str | None) -> pd.DataFrame | None:
    """The rows of set `qa`, or with None of every set: a confidence is judged over all the answers
    it rates, and its report split spans question files (measure/calibration.py)."""
    if df is None or qa is not None:
        return _one_set(df, qa)
    return tidy(df)


def _checked_rows(df: pd.DataFrame, extra: pd.DataFrame | None, qa: str | None, k: int, metric: str,
                  retriever: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(the run's rows of one question set, the learner's), after checking K, the metric and the
    retriever a figure at one K was asked for."""
    _check_k(k)
    _check("metric", metric, METRICS)
    _check("retriever", retriever, RETRIEVERS)
    return _one_set(df, qa), _one_set(extra, None)


def _at_one_k(df: pd.DataFrame, extra: pd.DataFrame | None, qa: str | None, k: int, metric: str, retriever: str,
              make) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """What every chart at one K starts from: (the run's rows, their table, the learner's table or
    None), each table `make(rows, k, retriever, metric)`."""
    rows, yours = _checked_rows(df, extra, qa, k, metric, retriever)
    return rows, make(rows, k, retriever, metric), make(yours, k, retriever, metric) if yours is not None else None


def _source(df: pd.DataFrame) -> str:
    return df.attrs.get("source", "this run")


PHRASE_BREAKS = (" against ", " given ", ": ", " (")  # where a title may turn to a second line


def _lines(text: str, width: int) -> list[str] | str:
    lines = textwrap.wrap(text, width)
    return lines if len(lines) > 1 else text


def _title_lines(text: str, width: int) -> list[str] | str:
    """A title on one line, or broken before a phrase ("Answer accuracy (exact match)" / "against K"),
    never inside one ("... against" / "K"); plain wrapping only where no phrase break fits.

    >>> _title_lines("Answer accuracy (exact match) against K", 38)
    ['Answer accuracy (exact match)', 'against K']
    """
    if len(text) <= width:
        return text
    for word in PHRASE_BREAKS:
        at = text.rfind(word, 0, width + 1)
        if at > 0:
            rest = text[at:].strip()
            return [text[:at], *([rest] if len(rest) <= width else textwrap.wrap(rest, width))]
    return _lines(text, width)


def finish_chart(chart, title: str, subtitle: str):
    # Legends below the plot, one under the other: side by side they overflow a phone's width.
    # (Vega's legend layout; Vega-Lite's schema admits it only as an expression.)
    return chart.properties(
        title=alt.TitleParams(_title_lines(title, TITLE_CHARS), subtitle=_lines(subtitle, SUBTITLE_CHARS), anchor="start",
                              subtitleColor="#444"),
        width="container", height=HEIGHT, usermeta=SVG).configure_legend(layout=alt.ExprRef(LEGENDS_STACKED))


def no_rows_chart(df: pd.DataFrame, needs: str):
    """The chart for a figure the run holds no rows for: what it would need, said on the chart."""
    note = alt.Chart(pd.DataFrame({"note": ["no rows"]})).mark_text(size=16, color="#6b6b6b").encode(text="note:N")
    return finish_chart(note, f"no rows for this figure in {_source(df)}", needs)


def chart_legend(title: str, **more) -> alt.Legend:
    return alt.Legend(title=title, orient="bottom", direction="horizontal", columns=2, labelLimit=220, **more)


def _mode_colour(*tables: pd.DataFrame, legend: bool = True) -> alt.Color:
    """Colour by mode, from config.MODE_COLOURS, over the modes these tables hold (in MODES order)."""
    present = set().union(*(set(t["mode"]) for t in tables if t is not None))
    modes = [m for m in MODES if m in present]
    return alt.Color("mode_title:N", title="mode", legend=chart_legend("mode") if legend else None,
                     scale=alt.Scale(domain=[MODE_TITLES[m] for m in modes], range=[MODE_COLOURS[m] for m in modes]))


def _retriever_colour(*tables: pd.DataFrame) -> alt.Color:
    present = set().union(*(set(t["retriever"]) for t in tables if t is not None))
    names = [r for r in RETRIEVER_TITLES if r in present] + sorted(present - set(RETRIEVER_TITLES))
    return alt.Color("retriever_title:N", title="retriever", legend=chart_legend("retriever"),
                     scale=alt.Scale(domain=[RETRIEVER_TITLES.get(r, r) for r in names],
                                     range=[RETRIEVER_COLOURS.get(r, "#333333") for r in names]))


def _preset_scale(table: pd.DataFrame, values: dict[str, object]) -> alt.Scale:
    """A scale from the presets this table holds (titles) to their dashes, shapes or opacities."""
    presets = [p for p in PRESET_TITLES if p in set(table["preset"])]
    return alt.Scale(domain=[PRESET_TITLES[p] for p in presets], range=[values[p] for p in presets])


def _titled(table: pd.DataFrame) -> pd.DataFrame:
    """Adds the display names the legends show: mode, preset and retriever titles."""
    out = table.copy()
    if "mode" in out:
        out["mode_title"] = [MODE_TITLES.get(m, m) for m in out["mode"]]
    if "preset" in out:
        out["preset_title"] = [PRESET_TITLES.get(p, p) if isinstance(p, str) else "" for p in out["preset"]]
    if "retriever" in out:
        out["retriever_title"] = [RETRIEVER_TITLES.get(r, r) for r in out["retriever"]]
    return out


def _yours(table: pd.DataFrame, colour: alt.Color, **encodings):
    """The learner's own sweep: hollow diamonds on top, in the series' colours, labelled "your sweep"."""
    marks = _titled(table).assign(source=YOURS)
    return alt.Chart(marks).mark_point(filled=False, size=170, strokeWidth=2.5).encode(
        color=colour, shape=alt.Shape("source:N", title="", legend=chart_legend(""),
                                      scale=alt.Scale(domain=[YOURS], range=["diamond"])),
        **encodings)


def _layered(*layers):
    """Layers with a shape legend each: the presets' shapes and "your sweep" are separate keys."""
    return alt.layer(*[layer for layer in layers if layer is not None]).resolve_scale(shape="independent")


def _mean_table(rows: pd.DataFrame, value: str, by: list[str]) -> pd.DataFrame:
    """100 x the mean of `value` and the rows' count per group (rows where it is null left out)."""
    kept = rows.dropna(subset=[value])
    if kept.empty:
        return pd.DataFrame(columns=[*by, "value", "n"])
    grouped = kept.assign(v=kept[value].astype("float64")).groupby(by, dropna=False)["v"]
    return grouped.agg(value=lambda s: 100 * s.mean(), n="size").reset_index()


def tooltips(*fields: tuple[str, str]) -> list[alt.Tooltip]:
    return [alt.Tooltip(f, title=t, format=".1f") if f.endswith(":Q") and t != "n" else alt.Tooltip(f, title=t)
            for f, t in fields]


# ---------------------------------------------------------------- accuracy against K (Figure 3, left)

def _accuracy_by_k(rows: pd.DataFrame, metric: str, retriever: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    rag = rows[rows["mode"].isin(RAG_MODES) & (rows["retriever"] == retriever) & rows["k"].notna()]
    closed = rows[rows["mode"] == "closed-book"]
    return _mean_table(rag, metric, ["mode", "preset", "k"]), _mean_table(closed, metric, ["mode", "preset"])


def accuracy_vs_k(df: pd.DataFrame, metric: str = "em", retriever: str = "dense", *,
                  extra: pd.DataFrame | None = None, qa: str | None = None):
    """Answer accuracy (100 x the metric's mean) against K: a line per mode and preset, and
    closed-book, which reads no passages, as a flat rule. The paper's Figure 3 (left)."""
    _check("metric", metric, METRICS)
    _check("retriever", retriever, RETRIEVERS)
    rows, yours = _one_set(df, qa), _one_set(extra, None)
    rag, closed = _accuracy_by_k(rows, metric, retriever)
    if rag.empty:
        return no_rows_chart(rows, f"Accuracy against K needs RAG-Sequence or RAG-Token rows with the {retriever} "
                              f"retriever, a K and a {metric}.")
    y_rag, y_closed = (_accuracy_by_k(yours, metric, retriever) if yours is not None else (None, None))
    colour = _mode_colour(rag, closed, y_rag, y_closed)
    dash = alt.StrokeDash("preset_title:N", title="preset",
                          scale=_preset_scale(pd.concat([rag, closed]), PRESET_DASHES),
                          legend=chart_legend("preset", symbolType="stroke", symbolStrokeColor="#333333"))
    ks = sorted({int(k) for k in rag["k"]} | ({int(k) for k in y_rag["k"]} if y_rag is not None else set()))
    x = alt.X("k:Q", title="passages retrieved, K (log scale)",
              scale=alt.Scale(type="log", domain=[min(ks), max(ks)], nice=False),
              axis=alt.Axis(values=ks, format="d"))
    y = alt.Y("value:Q", title="accuracy (%)", scale=alt.Scale(domainMin=0))
    flat_tip = tooltips(("mode_title:N", "mode"), ("preset_title:N", "preset"), ("value:Q", "accuracy (%)"),
                        ("n:Q", "n"))
    tip = [*flat_tip[:2], alt.Tooltip("k:Q", title="K"), *flat_tip[2:]]
    # The points are their own layer: a line's built-in points would make the preset legend's
    # symbols dots, where it must show the dashes.
    lines = alt.Chart(_titled(rag)).mark_line(strokeWidth=2).encode(x=x, y=y, color=colour, strokeDash=dash)
    points = alt.Chart(_titled(rag)).mark_point(filled=True, size=40, opacity=1).encode(
        x=x, y=y, color=_mode_colour(rag, closed, y_rag, y_closed, legend=False), tooltip=tip)
    rule = None
    if not closed.empty:
        rule = alt.Chart(_titled(closed)).mark_rule(strokeWidth=2).encode(
            y=y, color=colour, strokeDash=dash, tooltip=flat_tip)
    mine = None
    if yours is not None and not (y_rag.empty and y_closed.empty):
        # closed-book is flat in K: the learner's closed-book score is marked at every K drawn
        flat = y_closed.merge(pd.DataFrame({"k": ks}), how="cross")
        mine = _yours(pd.concat([y_rag, flat], ignore_index=True), colour, x=x, y=y, tooltip=[
            alt.Tooltip("source:N", title="from"), *tip])
    chart = _layered(lines, points, rule, mine)
    if len({int(k) for k in rag["k"]}) < 2:  # one K: points, not lines, and no slope to read
        sub = (f"Only K = {int(rag['k'].iloc[0])} was run on these questions: each RAG mode is one point, not a "
               f"curve. Where a point stands above closed-book's flat rule, the {retriever} retriever's passages "
               "help; the sets run at several K (the dev set, the older file) show what more passages buy.")
    else:
        sub = (f"Where a RAG line stands above closed-book's flat rule, the {retriever} retriever's passages help; "
               f"the slope between K = {', '.join(str(k) for k in sorted({int(k) for k in rag['k']}))} is what "
               "more passages buy.")
    return finish_chart(chart, f"Answer accuracy ({METRICS[metric]}) against K", sub)


# ---------------------------------------------------------------- recall against K (Figure 3, centre)

def _recall_by_k(rows: pd.DataFrame) -> pd.DataFrame:
    """Recall per retriever and K; a trained question tower's rows (those naming a preset) are a
    line of their own beside the frozen tower's."""
    retrieval = rows[(rows["mode"] == "retrieval") & rows["k"].notna() & rows["retriever"].notna()]
    tower = [r + TRAINED_TOWER if isinstance(p, str) else r for r, p in zip(retrieval["retriever"], retrieval["preset"])]
    return _mean_table(retrieval.assign(retriever=tower), "gold_in_top_k", ["retriever", "k"])


def recall_vs_k(df: pd.DataFrame, *, extra: pd.DataFrame | None = None, qa: str | None = None):
    """Retrieval recall@K (the share of questions with a gold answer in the top K passages)
    against K, a line per retriever. The paper's Figure 3 (centre)."""
    rows, yours = _one_set(df, qa), _one_set(extra, None)
    recall = _recall_by_k(rows)
    if recall.empty:
        return no_rows_chart(rows, "Recall against K needs retrieval rows (mode \"retrieval\") with a K and "
                              "gold_in_top_k.")
    y_recall = _recall_by_k(yours) if yours is not None else None
    colour = _retriever_colour(recall, y_recall)
    ks = sorted({int(k) for k in recall["k"]} | ({int(k) for k in y_recall["k"]} if y_recall is not None else set()))
    x = alt.X("k:Q", title="passages retrieved, K (log scale)",
              scale=alt.Scale(type="log", domain=[min(ks), max(ks)], nice=False),
              axis=alt.Axis(values=ks, format="d"))
    y = alt.Y("value:Q", title="questions with a gold passage (%)", scale=alt.Scale(domain=[0, 100]))
    tip = tooltips(("retriever_title:N", "retriever"), ("k:Q", "K"), ("value:Q", "recall (%)"), ("n:Q", "n"))
    lines = alt.Chart(_titled(recall)).mark_line(point=True, strokeWidth=2).encode(x=x, y=y, color=colour, tooltip=tip)
    mine = None
    if y_recall is not None and not y_recall.empty:
        mine = _yours(y_recall, colour, x=x, y=y, tooltip=[alt.Tooltip("source:N", title="from"), *tip])
    trained = any(r.endswith(TRAINED_TOWER) for r in recall["retriever"])
    return finish_chart(_layered(lines, mine), "Retrieval recall against K",
                   "The paper's Table 6: the trained question tower (dark) against the frozen one, the passages "
                   "and the index unchanged." if trained else
                   "A reader can only copy an answer its passages hold: each line is the ceiling on what "
                   "the RAG modes read, with that retriever.")


# ---------------------------------------------------------------- accuracy given retrieval

def _given_retrieval(rows: pd.DataFrame, k: int, retriever: str, metric: str) -> pd.DataFrame:
    """Per mode and preset, the metric's mean with and without a gold passage in the top K.

    Closed-book reads no passages: its question is joined to the retrieval row of the same
    question, retriever and K, so "gold in top K" means the passages were there to be read.
    """
    rag = rows[rows["mode"].isin(RAG_MODES) & (rows["retriever"] == retriever) & (rows["k"] == k)]
    retrieval = rows[(rows["mode"] == "retrieval") & (rows["retriever"] == retriever) & (rows["k"] == k)]
    gold = retrieval.drop_duplicates(["qa", "question_id"])[["qa", "question_id", "gold_in_top_k"]]
    closed = rows[rows["mode"] == "closed-book"].drop(columns="gold_in_top_k").merge(gold, on=["qa", "question_id"])
    both = pd.concat([rag, closed], ignore_index=True).dropna(subset=["gold_in_top_k"])
    both["retrieved"] = [f"gold in top {k}" if g else f"no gold in top {k}" for g in both["gold_in_top_k"]]
    return _mean_table(both, metric, ["mode", "preset", "retrieved"])


def accuracy_given_retrieval(df: pd.DataFrame, k: int = 5, retriever: str = "dense", metric: str = "contains", *,
                             extra: pd.DataFrame | None = None, qa: str | None = None):
    """Each mode's accuracy when one of the top K passages holds a gold answer and when none
    does (bars; n per bar in the tooltip): what retrieval bounds, and what the generator knows
    without it."""
    rows, table, y_table = _at_one_k(df, extra, qa, k, metric, retriever, _given_retrieval)
    if table.empty:
        return no_rows_chart(rows, f"Accuracy given retrieval needs answer rows at K={k} with the {retriever} retriever "
                              f"(and, for closed-book, that retriever's retrieval rows at K={k}).")
    colour = _mode_colour(table, y_table)
    series = pd.concat([table, y_table]) if y_table is not None else table
    order = [f"{MODE_TITLES[m]}, {PRESET_TITLES[p]}" for m in MODES for p in PRESET_TITLES
             if ((series["mode"] == m) & (series["preset"] == p)).any()]
    x = alt.X("retrieved:N", title=None, sort=[f"gold in top {k}", f"no gold in top {k}"],
              axis=alt.Axis(labelAngle=0))
    offset = alt.XOffset("series:N", sort=order, scale=alt.Scale(domain=order))
    y = alt.Y("value:Q", title="accuracy (%)", scale=alt.Scale(domain=[0, 100]))
    tip = tooltips(("mode_title:N", "mode"), ("preset_title:N", "preset"), ("retrieved:N", "passages"),
                   ("value:Q", f"{METRICS[metric]} (%)"), ("n:Q", "n"))

    def with_series(t: pd.DataFrame) -> pd.DataFrame:
        t = _titled(t)
        return t.assign(series=t["mode_title"] + ", " + t["preset_title"])

    bars = alt.Chart(with_series(table)).mark_bar().encode(
        x=x, xOffset=offset, y=y, color=colour, tooltip=tip,
        # the preset's shade, drawn in a mode's colour as the bars are (a grey swatch matched no bar)
        opacity=alt.Opacity("preset_title:N", title="preset", legend=chart_legend(
            "preset", symbolType="square", symbolFillColor=MODE_COLOURS["token"], symbolStrokeWidth=0),
                            scale=_preset_scale(table, PRESET_OPACITY)))
    mine = None
    if y_table is not None and not y_table.empty:
        mine = _yours(with_series(y_table), colour, x=x, xOffset=offset, y=y,
                      tooltip=[alt.Tooltip("source:N", title="from"), *tip])
    return finish_chart(_layered(bars, mine), f"Accuracy ({METRICS[metric]}) given retrieval, K={k}",
                   f"With no gold passage in the top {k}, a right answer comes from the model's own weights: "
                   "the gap between the two groups is what retrieval decides.")


# ---------------------------------------------------------------- plain RAG against the reader aids

def _aids_table(rows: pd.DataFrame, k: int, retriever: str, metric: str) -> pd.DataFrame:
    """Per mode and preset: the metric's mean (%) and the median seconds per answer.

    Seconds come from rows with order 0 (or none, as closed-book's): the question's first K, with
    no state kept from its earlier K values to make it faster than a learner's first ask. Where a
    series has no such row at this K (every question ran a smaller K first), its median is over
    all its rows, and its `timing` says so.
    """
    answers = rows[(rows["mode"].isin(RAG_MODES) & (rows["retriever"] == retriever) & (rows["k"] == k))
                   | (rows["mode"] == "closed-book")]
    answers = answers[answers["preset"].notna()]
    accuracy = _mean_table(answers, metric, ["mode", "preset"])
    timed = answers[answers["seconds"].notna()]
    by = ["mode", "preset"]
    fresh = timed[timed["order"].isna() | (timed["order"] == 0)].groupby(by)["seconds"].agg(seconds="median",
                                                                                            timed="size")
    kept = timed.groupby(by)["seconds"].agg(seconds="median", timed="size")
    kept = kept[~kept.index.isin(fresh.index)]
    seconds = pd.concat([fresh.assign(timing=FRESH), kept.assign(timing=KEPT)]).reset_index()
    return accuracy.merge(seconds, on=by, how="inner")


def plain_vs_aided(df: pd.DataFrame, k: int = 5, retriever: str = "dense", metric: str = "em", *,
                   extra: pd.DataFrame | None = None, qa: str | None = None):
    """Per mode, plain RAG (the paper's) and the reader aids as two points, accuracy against
    seconds per answer, joined by a line: what the aids buy and what they cost."""
    rows, table, y_table = _at_one_k(df, extra, qa, k, metric, retriever, _aids_table)
    if table.empty:
        return no_rows_chart(rows, f"Plain against aided needs answer rows with a preset, a {metric} and seconds "
                              f"(order 0) at K={k} with the {retriever} retriever.")
    colour = _mode_colour(table, y_table)
    x = alt.X("seconds:Q", title="seconds per answer (median)", scale=alt.Scale(zero=True))
    y = alt.Y("value:Q", title="accuracy (%)", scale=alt.Scale(domainMin=0))
    tip = tooltips(("mode_title:N", "mode"), ("preset_title:N", "preset"), ("value:Q", f"{METRICS[metric]} (%)"),
                   ("seconds:Q", "seconds per answer"), ("n:Q", "n"), ("timed:Q", "answers timed"),
                   ("timing:N", "timed"))
    base = alt.Chart(_titled(table))
    link = base.mark_line(strokeWidth=1.5).encode(x=x, y=y, color=colour, detail="mode:N")
    points = base.mark_point(filled=True, size=110, opacity=1).encode(
        x=x, y=y, color=colour, tooltip=tip,
        shape=alt.Shape("preset_title:N", title="preset", legend=chart_legend("preset"),
                        scale=_preset_scale(table, PRESET_SHAPES)))
    mine = None
    if y_table is not None and not y_table.empty:
        mine = _yours(y_table, colour, x=x, y=y, tooltip=[alt.Tooltip("source:N", title="from"), *tip])
    note = (" Some seconds are after a smaller K, with kept states: faster than a first ask."
            if (table["timing"] == KEPT).any() else "")
    return finish_chart(_layered(link, points, mine), f"Plain RAG against reader aids, K={k}",
                   "Up is more right answers, right is slower: each line joins a mode's plain and aided "
                   "runs, so its slope is accuracy bought per second. A question's modes are answered in "
                   "one call, as on the page: the second RAG mode reads the prefill the first one made." + note)


# ---------------------------------------------------------------- is the confidence honest?

def _answered_with_confidence(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["mode"].isin(MODES) & rows["confidence"].notna() & rows["contains"].notna()]


def _reliability_table(rows: pd.DataFrame, bins: int) -> pd.DataFrame:
    """Per mode, metrics.reliability_bins: `bins` groups of equal count, each its mean confidence
    and share right (in %) and its count."""
    rated = _answered_with_confidence(rows)
    out = [{"mode": mode, "bin": i, "confidence": 100 * b["confidence"], "right": 100 * b["right"], "n": b["n"]}
           for mode, part in rated.groupby("mode") for i, b in
           enumerate(reliability_bins(part["confidence"], part["contains"] > 0, bins))]
    return pd.DataFrame(out, columns=["mode", "bin", "confidence", "right", "n"])


def reliability(df: pd.DataFrame, bins: int = RELIABILITY_BINS, *, extra: pd.DataFrame | None = None, qa: str | None = None):
    """Reliability diagram: each mode's answers sorted by confidence and cut into `bins` groups of
    equal count, each group's mean confidence against the share of its answers that are right (the
    gold answer is contained), with the diagonal that a calibrated confidence would follow."""
    if not isinstance(bins, int) or isinstance(bins, bool) or not 1 <= bins <= 100:
        raise ValueError(f"bins={bins!r} is not a bin count: pass an integer from 1 to 100.")
    rows, yours = _rated_sets(df, qa), _rated_sets(extra, None)
    table = _reliability_table(rows, bins)
    if table.empty:
        return no_rows_chart(rows, "The reliability diagram needs answer rows with a confidence; this run's "
                              "confidence is null (no confidence model yet).")
    y_table = _reliability_table(yours, bins) if yours is not None else None
    colour = _mode_colour(table, y_table)
    x = alt.X("confidence:Q", title="confidence given (%)", scale=alt.Scale(domain=[0, 100]))
    y = alt.Y("right:Q", title="answers right (%)", scale=alt.Scale(domain=[0, 100]))
    tip = tooltips(("mode_title:N", "mode"), ("confidence:Q", "mean confidence (%)"), ("right:Q", "right (%)"),
                   ("n:Q", "n"))
    diagonal = alt.Chart(pd.DataFrame({"confidence": [0, 100], "right": [0, 100]})).mark_line(
        color="#999999", strokeDash=[4, 4], strokeWidth=1).encode(x=x, y=y)
    lines = alt.Chart(_titled(table)).mark_line(point=True, strokeWidth=2).encode(x=x, y=y, color=colour, tooltip=tip)
    mine = None
    if y_table is not None and not y_table.empty:
        mine = _yours(y_table, colour, x=x, y=y, tooltip=[alt.Tooltip("source:N", title="from"), *tip])
    return finish_chart(_layered(diagonal, lines, mine), "Does the confidence mean what it says?",
                   "On the dashed diagonal, answers given 70% are right 70% of the time; below it the "
                   "confidence is too high, above it too low.")


def cue_quality(df: pd.DataFrame, threshold: float | None = None, *, qa: str | None = None) -> pd.DataFrame:
    """How well the "probably wrong" cue finds the wrong answers (contains == 0), per preset and
    mode: its precision (the flagged answers that are wrong) and its recall (the wrong answers that
    are flagged), with the counts behind them. Flagged: confidence < threshold, or with no
    threshold the rows whose cues hold "probably_wrong" (each answer's own model decided). NaN
    where a share has no answers to be taken of; no rated rows gives an empty table."""
    if threshold is not None and (not isinstance(threshold, (int, float)) or isinstance(threshold, bool)
                                  or not 0 <= threshold <= 1):
        raise ValueError(f"threshold={threshold!r} is not a probability: pass a number from 0 to 1.")
    rated = _answered_with_confidence(_rated_sets(df, qa))
    rows = []
    for (preset, mode), mine in rated.groupby([rated["preset"].fillna("-"), "mode"], sort=False):
        flagged = (mine["confidence"] < threshold if threshold is not None else
                   mine["cues"].map(lambda c: isinstance(c, (list, tuple)) and "probably_wrong" in c))
        wrong = mine["contains"] == 0
        precision, recall = precision_recall(flagged, wrong)
        rows.append({"preset": preset, "mode": mode, "answers": len(mine), "flagged": int(flagged.sum()),
                     "wrong": int(wrong.sum()), "precision": round(precision, 3), "recall": round(recall, 3)})
    order = {m: i for i, m in enumerate(MODES)}
    out = pd.DataFrame(rows, columns=["preset", "mode", "answers", "flagged", "wrong", "precision", "recall"])
    return out.sort_values(["preset", "mode"], key=lambda c: c.map(order) if c.name == "mode" else c,
                           ignore_index=True)


# ---------------------------------------------------------------- eval --plot

def figures(df: pd.DataFrame, k: int | None = None, *, qa: str | None = None) -> dict[str, alt.TopLevelMixin]:
    """Every figure of one question set, by name (FIGURES), at K = k for the two figures drawn at
    one K (default: 5 if the run has it, else its largest K up to 5, else its smallest)."""
    rows = _one_set(df, qa)
    if k is None:
        ks = sorted({int(x) for x in rows["k"].dropna()})
        k = 5 if 5 in ks else max([x for x in ks if x < 5], default=min(ks, default=5))
    return {"accuracy_vs_k": accuracy_vs_k(rows), "recall_vs_k": recall_vs_k(rows),
            "accuracy_given_retrieval": accuracy_given_retrieval(rows, k=k),
            "plain_vs_aided": plain_vs_aided(rows, k=k), "reliability": reliability(rows)}


def _caption_chart(text: str, width: int):
    lines = textwrap.wrap(text, width // 6)  # ~6 px a character at 11 px
    return alt.Chart(pd.DataFrame({"caption": ["\n".join(lines)]})).mark_text(
        align="left", baseline="top", lineBreak="\n", fontSize=11, color="#444444", x=0, y=0).encode(
        text="caption:N").properties(width=width, height=15 * len(lines))


def save_figure(chart, path: str | Path, note: str, fmt: str = "png") -> Path:
    """One figure with its caption under it: PNG at a slide's width and scale 2 (vl-convert), or
    HTML as wide as the window (altair's page, its scripts inline so it opens with no network)."""
    _check("format", fmt, FORMATS)
    path = Path(path)
    if fmt == "png":
        # A figure's config (the legends' layout) may sit only on the outermost chart: moved there.
        body = chart.copy(deep=True)
        config, body.config, body.usermeta = body.config, alt.Undefined, alt.Undefined  # top-level only
        # Legends kept with the figure, above the caption (a concatenation would gather them below it).
        framed = alt.vconcat(body.properties(width=EXPORT_WIDTH), _caption_chart(note, EXPORT_WIDTH), spacing=12
                             ).resolve_legend(**{channel: "independent" for channel in LEGEND_CHANNELS})
        framed.config = config
        framed.configure_view(strokeWidth=0).save(path, format="png", scale_factor=2)
    else:
        page = chart.to_html(inline=True)
        note_html = f'<p style="font: 13px sans-serif; color: #444; max-width: 60em">{html.escape(note)}</p>'
        head, body_end, tail = page.rpartition("</body>")  # the last one: the inline scripts hold others
        path.write_text(head + note_html + "\n" + body_end + tail if body_end else page + note_html, encoding="utf-8")
    return path


def write_figures(run: str | Path, out_dir: str | Path | None = None, fmt: str = "png",
                  split: str | None = None) -> list[Path]:
    """`eval --plot RUN`: every figure of the run, captioned with its meta file, into out_dir
    (default: RUN's stem + "_figures" beside it); `split`: only that split's questions
    (rag_demo/splits.py), named in each caption. Each question set in the run gets its own
    figures, prefixed with its name when there are several. Returns the paths written."""
    _check("format", fmt, FORMATS)
    run = Path(run)
    rows, meta = load_rows(run), load_meta(run)
    if split is not None:
        rows = in_split(rows, split)
    out = Path(out_dir) if out_dir is not None else run.with_name(run.stem + "_figures")
    out.mkdir(parents=True, exist_ok=True)
    sets = sorted(rows["qa"].dropna().unique())
    written = []
    for qa in sets:
        prefix = f"{qa}_" if len(sets) > 1 else ""
        mine = rows[rows["qa"] == qa]
        for name, chart in figures(rows, qa=qa).items():
            note = caption(meta, questions_drawn(mine, retrieval=name.startswith("recall")), split)
            written.append(save_figure(chart, out / f"{prefix}{name}.{fmt}", note, fmt))
    return written
