"""The settings' controls on the page, generated from their declarations (rag_demo/config.py).

A number is a slider over its declared range, a choice a radio, a switch a checkbox; each takes
its label and help from the declaration. The preset switch sits next to Ask; the knobs live in
the Settings accordion, the paper's first and the reader aids in their own group.
"""
from __future__ import annotations

import gradio as gr

from rag_demo.config import KNOBS, PRESETS, KnobSpec, RagSettings
from rag_demo.web import inputs


def elem_id(name: str) -> str:
    """A knob's element id on the page: rag-knob-<name-with-dashes>."""
    return "rag-knob-" + name.replace("_", "-")


def knob_control(spec: KnobSpec, value) -> gr.components.Component:
    """The control of one knob, showing `value`. What a client sends for it reaches RagSettings as it
    came (web/inputs.py), which names a bad value, the knob's range and what to give."""
    common = {"label": spec.label, "info": spec.help, "elem_id": elem_id(spec.name)}
    if spec.kind == "bool":
        return gr.Checkbox(value=value, **common)  # gradio hands a checkbox's value on as it came
    if spec.kind == "choice":
        return inputs.handed_on(gr.Radio(list(spec.choices), value=value, **common))
    return inputs.handed_on(gr.Slider(spec.lo, spec.hi, value=value, step=spec.step, **common))


def preset_switch(preset: str) -> gr.Radio:
    """Which preset runs: the paper's algorithm alone, or with the reader aids."""
    return inputs.handed_on(gr.Radio([(title, key) for key, title in PRESETS.items()], value=preset,
                                     show_label=False, container=False, elem_id="rag-preset"))


def settings_controls(settings: RagSettings) -> dict[str, gr.components.Component]:
    """Every knob's control (by knob name), laid out in the current Blocks context: the paper's
    knobs, then the reader aids in an accordion of their own."""
    values = settings.knobs()
    out = {}
    gr.Markdown("**The paper's knobs** (retrieval, search, the prompt)", elem_id="rag-decoding-knobs")
    for name, spec in KNOBS.items():
        if spec.group == "decoding":
            out[name] = knob_control(spec, values[name])
    with gr.Accordion("Reader aids (each one off in the paper preset)", open=False, elem_id="rag-aids"):
        for name, spec in KNOBS.items():
            if spec.group == "aids":
                out[name] = knob_control(spec, values[name])
    return out


def preset_values(preset: str) -> list:
    """The controls' values under `preset`, in KNOBS order (the preset switch sets them all)."""
    return [spec.default(preset) for spec in KNOBS.values()]
