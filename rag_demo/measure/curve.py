"""The training curve: RAG's loss, −log p(y|x) marginalised over the retrieved passages, against
the examples seen (each epoch sees every example again), on the training batches and on the
held-out twentieth the run never trains on, per stage that ran. Drawn from the rows `python -m
rag_demo train` writes beside the trained weights (assets/trained/curve.jsonl); no model runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import altair as alt
import pandas as pd

from rag_demo.measure.figures import finish_chart, chart_legend, no_rows_chart, tooltips

STAGE_TITLES = {"retriever": "question map alone (generator frozen)", "reader": "the generator"}
LOSS_TITLES = {"train_loss": "training batches", "heldout_loss": "held-out questions"}
CURVE_COLOURS = {"train_loss": "#1f78b4", "heldout_loss": "#e6550d"}


def load_curve(path: str | Path) -> pd.DataFrame:
    """The curve's rows ({stage, step, examples, train_loss, heldout_loss, seconds}), or none."""
    path = Path(path)
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.is_file() else []
    df = pd.DataFrame(rows, columns=["stage", "step", "examples", "train_loss", "heldout_loss", "seconds"])
    df.attrs["source"] = str(path)
    return df


def training_curve(df: pd.DataFrame):
    """Loss against questions seen, one panel per stage: the training batches' loss (the mean over
    the optimizer step that ended there) and the held-out loss. A held-out curve that falls with the
    training one is learning that carries to questions the run did not see."""
    long = df.melt(id_vars=["stage", "step", "examples"], value_vars=list(LOSS_TITLES), var_name="curve",
                   value_name="loss").dropna(subset=["loss"])
    long = long[~((long["curve"] == "train_loss") & (long["step"] == 0))]  # no batch has run at step 0
    if long.empty:
        return no_rows_chart(df, "The training curve needs the rows python -m rag_demo train writes (curve.jsonl).")
    long = long.assign(curve_title=[LOSS_TITLES[c] for c in long["curve"]],
                       stage_title=[STAGE_TITLES.get(s, s) for s in long["stage"]])
    # the legends draw a line sample, as the marks are lines
    colour = alt.Color("curve_title:N", title="loss on", legend=chart_legend("loss on", symbolType="stroke",
                                                                          symbolStrokeWidth=2),
                       scale=alt.Scale(domain=list(LOSS_TITLES.values()), range=list(CURVE_COLOURS.values())))
    tip = tooltips(("stage_title:N", "stage"), ("curve_title:N", "loss on"), ("examples:Q", "examples seen"),
                   ("loss:Q", "−log p(y|x) (nats)"))
    x = alt.X("examples:Q", title="examples seen (each epoch sees every example again)")
    y = alt.Y("loss:Q", title="−log p(y|x), nats", scale=alt.Scale(zero=False))
    encoding = {"x": x, "y": y, "color": colour, "tooltip": tip}
    if long["stage"].nunique() > 1:  # one dash a stage, when more than one ran
        encoding["strokeDash"] = alt.StrokeDash("stage_title:N", title="stage", legend=chart_legend(
            "stage", symbolType="stroke", symbolStrokeColor="#333333"))
    chart = alt.Chart(long).mark_line(point=True, strokeWidth=2).encode(**encoding)
    return finish_chart(chart, "Training with RAG's own loss",
                   "The marginal −log p(y|x) over the retrieved passages, as training goes: on the batches it "
                   "learns from, and on held-out questions it never trains on.")


def write_curve_figure(path: str | Path, out_dir: str | Path | None = None, fmt: str = "png") -> Path:
    """`eval --plot assets/trained/curve.jsonl`: the training curve, captioned with the trained
    weights' meta (each stage's command and CPU), as training_curve.png (or .html) in out_dir."""
    from rag_demo.measure.figures import save_figure

    path = Path(path)
    meta_path = path.with_name("meta.json")
    stages = json.loads(meta_path.read_text(encoding="utf-8")).get("stages", {}) if meta_path.is_file() else {}
    note = " ".join(f"{s['stage']}: {s['data']['trained_on']} examples, {s['device']}, {s['finished']}; rerun: "
                    + " then ".join(c for c in ((s.get("prepared_by") or {}).get("command"), s["command"]) if c) + "."
                    for s in stages.values()) or "No meta.json beside the curve."
    out = Path(out_dir) if out_dir is not None else path.with_name(path.stem + "_figures")
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(training_curve(load_curve(path)), out / f"training_curve.{fmt}", note, fmt)
