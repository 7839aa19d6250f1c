"""The page's input components: gradio's own, with what a client sends handed on to the app's checks.

gradio checks an input's value against its component before any validator or handler runs (a
slider's range, a radio's or a dropdown's choices, the shape of a file list) and answers a value
of the wrong type with a bare HTTP 400 under a validator, or with a message that names no
argument. The components made here pass the value on as it came, so that the app's own checks
name the argument, what it got and what to send: RagSettings for the knobs (its declarations
parse and range-check every value), the handlers for the corpus and the stack, `check_upload`
for files. They are gradio's components with their `preprocess` replaced on the instance (a
subclass would make gradio write a type stub beside this file), drawn as gradio draws them.
"""
from __future__ import annotations

from typing import Annotated, Any, TypeVar

import gradio as gr
from gradio.data_classes import FileData, GradioRootModel, ListFiles
from pydantic import Field

C = TypeVar("C", bound=gr.components.Component)


def handed_on(component: C) -> C:
    """`component`, whose value reaches the app as the client sent it (for a slider, a radio, a
    one-value dropdown: gradio's own preprocessing only checks the value)."""
    component.preprocess = _as_sent  # gradio calls block.preprocess(payload): the instance's comes first
    return component


def _as_sent(payload: Any) -> Any:
    return payload


class NotFiles:
    """What a client sent for files that is not a list of uploaded files: kept apart, never read as
    a path (a string could name any file on the server), so that `check_upload` can say what it got."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _Sent(GradioRootModel):
    """A file input's payload: gradio's list of uploaded files or, kept as it came, anything else."""

    # left to right: files whenever they are files; pydantic's "smart" union could take Any first
    root: Annotated[list[FileData] | Any, Field(union_mode="left_to_right")]


def files(**kwargs: Any) -> gr.File:
    """gr.File for several files that hands a payload other than a list of uploaded files to the
    app as `NotFiles` (gradio refused it with a bare HTTP 400); its API schema stays gradio's list
    of files. `kwargs`: gr.File's."""
    component = gr.File(file_count="multiple", **kwargs)
    schema = component.api_info()  # gradio's list of files, before the data model changes
    own = component.preprocess  # gr.File's: uploaded files -> their paths

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        root = payload.root if isinstance(payload, _Sent) else payload
        if isinstance(root, list) and all(isinstance(f, FileData) for f in root):
            return own(ListFiles(root=root))
        return NotFiles(root)

    component.data_model = _Sent  # gradio validates a payload against it before preprocess
    component.api_info = lambda: schema
    component.preprocess = preprocess
    return component
