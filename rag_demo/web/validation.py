"""What the app checks before anything runs: questions, settings, passages to edit, uploads, and
what a client sends back.

Owns the gradio validators (`validate_ask`, `validate_edit`, `validate_upload`: one
`gr.validate` per input, run before the queue, so a bad input gets the library's message on its
own box and nothing runs), the settings widgets' values turned into `RagSettings`,
`check_last_answers` (the last answers' JSON a client hands back), `wrong` (the message of an
argument of the wrong type: its name, what it got, what to send), and how a request is refused:
`user_errors` turns the library's ValueErrors into `refusal`s, gr.Errors gradio prints no
traceback of, and `logs_refusals` logs each as one line naming its endpoint. The checks of
questions, settings and documents are the library's (config.check_question, RagSettings,
corpus.check_passage_text, uploads.load_documents); this module only routes their messages.
"""

from __future__ import annotations

import functools
import inspect
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr

from rag_demo.config import KNOBS, MODES, RagSettings, check_question
from rag_demo.knowledge.uploads import MAX_UPLOAD_BYTES, check_type, load_documents, supported_extensions
from rag_demo.knowledge.corpus import check_passage_text, check_passage_title
from rag_demo.serving import memory
from rag_demo.serving.session import Session
from rag_demo.web.inputs import NotFiles

MAX_UPLOAD_FILES = 20

log = logging.getLogger(__name__)


def refusal(message: str) -> gr.Error:
    """A request refused, with the message its visitor sees. A refusal is the app's answer, not its
    failure: gradio prints no traceback of it, and `logs_refusals` logs it in one line."""
    return gr.Error(message, print_exception=False)


@contextmanager
def user_errors():
    """Library ValueErrors become gr.Error (`refusal`): a visible message, and the app keeps serving."""
    try:
        yield
    except gr.Error:
        raise
    except ValueError as e:
        raise refusal(str(e)) from e


def unexpected_message(name: str, e: BaseException) -> str:
    """What a visitor reads of an exception no check foresaw: a short message with an id, never the
    exception's own text (it can hold paths or values); the log holds the traceback under that id."""
    ident = secrets.token_hex(4)
    log.error("/%s failed (error %s)", name, ident, exc_info=e)
    return (f"Something went wrong on the server (error {ident}), not in what you sent: try again, and "
            "if it happens again, report the error id.")


def unexpected(name: str, e: Exception) -> gr.Error:
    """`unexpected_message` as the page's error."""
    err = gr.Error(unexpected_message(name, e))
    err.print_exception = False
    return err


def logs_refusals(fn: Callable) -> Callable:
    """An endpoint (a handler method; its name is its api_name) whose refusals, any gr.Error it
    raises, each make one line in the server's log, "/name refused: message", and no traceback;
    any other exception becomes `unexpected`'s message, its traceback logged under an id.
    A generator stays a generator (gradio streams what a generator function yields). However it
    ends, the request's freed buffers go back to the OS (`memory.trim`): after every kind of
    request, not only a question (an upload's embedding, a corpus built, a stack loaded)."""
    name = fn.__name__

    def say(e: gr.Error) -> None:
        e.print_exception = False
        # WARNING: the level Python's last-resort handler prints, so an app that configures no
        # logging still writes the line
        log.warning("/%s refused: %s", name, " ".join(str(e.message).split()))

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streamed(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error as e:
                say(e)
                raise
            except Exception as e:  # noqa: BLE001 - shown as an id, logged whole
                raise unexpected(name, e) from None
            finally:
                memory.trim()
        return streamed

    @functools.wraps(fn)
    def called(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error as e:
            say(e)
            raise
        except Exception as e:  # noqa: BLE001 - shown as an id, logged whole
            raise unexpected(name, e) from None
        finally:
            memory.trim()
    return called


def wrong(name: str, value: Any, want: str) -> ValueError:
    """The ValueError of an argument a client sent with the wrong type: its name, what it got, what
    to send."""
    got = "nothing (None)" if value is None else f"{type(value).__name__} {_short(value)}"
    return ValueError(f"{name} got {got}: send {want}.")


def _short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


_NUMBER = (int, float)
# What the handlers that take the last answers back (/without_passage, /continue_mode) read of
# each answer and of each of its passages: (key, type, what to send)
MAX_SENT_TEXT = 4000  # an answer's text, a passage id or title as a client sends it back: longer is not ours
ANSWER_FIELDS = (("text", str, "its text"), ("corpus", str, "its corpus's name"), ("docs", list, "a list of passages"))
DOC_FIELDS = (("id", str, "the passage id, a string"), ("rank", int, "its rank, a whole number"),
              ("title", str, "its title, a string"), ("text", str, "its text, a string"),
              ("score", _NUMBER, "its retrieval score, a number"), ("prior", _NUMBER, "its p(z|x), a number"))


def check_last_answers(raw: Any, name: str = "raw") -> dict:
    """The last answers' JSON that a client hands back (/without_passage, /continue_mode), as the
    page holds it: /ask_session's `raw` output (/ask's dict), {"question": str, "settings": dict,
    "answers": {mode: Answer.to_dict()}}; -> raw. A ValueError names the first part that is missing
    or of another type, what it got and what to send."""
    whole = "the last answers' JSON, the dict /ask_session returns as its raw output (or /ask returns)"
    if raw is None:
        raise ValueError(f"{name} got nothing (None): there is no answer yet; ask a question first, then send "
                         f"{whole}.")

    def need(value: Any, path: str, kind: Any, want: str) -> Any:
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise wrong(path, value, f"{want}, as in {whole}")
        return value

    need(raw, name, dict, "a dict")
    check_question(need(raw.get("question"), f'{name}["question"]', str, "the question, a string"))
    need(raw.get("settings"), f'{name}["settings"]', dict, "the settings, a dict")
    unknown = sorted(set(need(raw.get("answers"), f'{name}["answers"]', dict, "a dict of answers by mode"))
                     - set(MODES))
    if unknown:
        raise ValueError(f'{name}["answers"] holds unknown modes {unknown}: send /ask\'s answers for '
                         f"{', '.join(MODES)}.")
    for mode, a in raw["answers"].items():
        at = f'{name}["answers"][{mode!r}]'
        need(a, at, dict, "an answer, a dict")
        for key, kind, want in ANSWER_FIELDS:
            need(a.get(key), f'{at}["{key}"]', kind, want)
        if len(a["text"]) > MAX_SENT_TEXT:
            raise ValueError(f'{at}["text"] holds {len(a["text"])} characters, more than an answer has '
                             f"({MAX_SENT_TEXT}): send the text /ask returned, as in {whole}.")
        most = int(KNOBS["k"].hi)
        if len(a["docs"]) > most:
            raise ValueError(f'{at}["docs"] holds {len(a["docs"])} passages, more than K can be ({most}): send the '
                             f"passages the answer read, as in {whole}.")
        for key in ("passage_drop", "doc_posterior"):  # one number (or null) per passage, when given
            if a.get(key) is not None:
                for x in need(a[key], f'{at}["{key}"]', list, "a list of numbers, one per passage"):
                    if x is not None:
                        need(x, f'{at}["{key}"]', _NUMBER, "a list of numbers, one per passage")
                if a.get("docs") is not None and len(a[key]) != len(a["docs"]):
                    raise ValueError(f'{at}["{key}"] has {len(a[key])} numbers but {at}["docs"] has '
                                     f"{len(a['docs'])} passages: send one per passage, as in {whole}.")
        for i, d in enumerate(a["docs"]):
            need(d, f'{at}["docs"][{i}]', dict, "a passage, a dict")
            for key, kind, want in DOC_FIELDS:
                need(d.get(key), f'{at}["docs"][{i}]["{key}"]', kind, want)
            if len(d["id"]) > MAX_SENT_TEXT or len(d["title"]) > MAX_SENT_TEXT:
                raise ValueError(f'{at}["docs"][{i}] has an id or title of over {MAX_SENT_TEXT} characters: send '
                                 f"the passages /ask returned, as in {whole}.")
    try:
        settings_of(raw)
    except ValueError as e:
        raise ValueError(f'{name}["settings"]: {e}') from None
    return raw


def settings_of(raw: dict) -> RagSettings:
    """The settings the last answers ran with (`raw` as the page holds it)."""
    return RagSettings(preset=raw["settings"].get("preset", "aided"),
                       **{n: v for n, v in raw["settings"].items() if n in KNOBS})


def settings_from_inputs(**values: Any) -> RagSettings:
    """RagSettings from the page's controls (by knob name, and "preset"; a knob left out takes the
    preset's value), or the library's ValueError naming the bad one. The values go through as they
    came (sliders send 5.0): the declarations parse whole numbers and refuse anything else
    (k=2.5, k='abc'); the app never rounds or clamps a value silently."""
    return RagSettings(**values)


def check_passage_chosen(pid: object, s: Session | None = None) -> None:
    """A passage to edit is chosen and, given the session, is one of its last answer's passages."""
    if not pid:
        raise ValueError("No passage chosen: ask a question first, then pick one of its passages to edit.")
    if not isinstance(pid, str):
        raise wrong("pid", pid, "the id of one of your last answer's passages, a string such as 'Mars#0'")
    if s is not None and pid not in {i for i, _, _ in s.last_docs}:
        raise ValueError(
            f"passage {pid!r} is not one of the passages retrieved for your last question: ask a question, "
            "then pick one of its passages to edit."
        )


def checked_settings(**values: Any) -> RagSettings:
    """settings_from_inputs, its ValueError made the page's gr.Error (user_errors)."""
    with user_errors():
        return settings_from_inputs(**values)


def _valid(check: Callable[[], Any]) -> dict:
    """gr.validate for one input: the library's ValueError message when `check()` raises."""
    try:
        check()
    except (ValueError, TypeError) as e:
        return gr.validate(False, str(e))
    except Exception as e:  # noqa: BLE001 - a check no one foresaw failing (a PDF library's error): an id, logged
        return gr.validate(False, unexpected_message("validate", e))
    return gr.validate(True, "")


def _validate_settings(settings: dict[str, Any]) -> list[dict]:
    """One gr.validate per setting, in `settings`' order: the library's message on the setting it
    names (RagSettings' messages start "name=value"), or on every setting when it names none."""
    try:
        settings_from_inputs(**settings)
    except (ValueError, TypeError) as e:
        msg = str(e)
        bad = {n for n in settings if msg.startswith(f"{n}=")} or set(settings)
        return [gr.validate(n not in bad, msg if n in bad else "") for n in settings]
    return [gr.validate(True, "") for _ in settings]


Refuse = Callable[[str, RagSettings, Session], str | None]  # (question, settings, session) -> refusal or None


def _refusal(out: list[dict], question, settings: dict[str, Any], s, refuse: Refuse | None, at: int) -> list[dict]:
    """out, with the budget's refusal (if any) on input `at` once every input is valid."""
    if refuse is not None and all(r["is_valid"] for r in out):
        msg = refuse(question, settings_from_inputs(**settings), s if isinstance(s, Session) else Session())
        if msg:
            out[at] = gr.validate(False, msg)
    return out


def validate_ask(question, s, refuse: Refuse | None = None, **settings) -> list[dict]:
    """gradio validator of the events that ask a question. It runs before the queue (no model
    runs) and shows the library's message on the question box; a bad question then never
    reaches the outputs, which would otherwise each show an error badge. One gr.validate per
    input, in the event's order: question, session, then the settings (by RagSettings field name,
    as the event passes them), a bad setting's message on that setting. `refuse` is the server's
    budget: a question whose estimated cost is over it is refused here, with the message on the
    question box (the settings sit in a closed accordion), and nothing runs."""
    out = [_valid(lambda: check_question(question)), gr.validate(True, ""), *_validate_settings(settings)]
    return _refusal(out, question, settings, s, refuse, 0)


def validate_edit(pid, new_text, question, s, refuse: Refuse | None = None, **fields) -> list[dict]:
    """gradio validator of "save edit and ask again", like validate_ask: a passage of the last
    answer must be chosen, its new text must not be empty, and the question must be askable.
    `fields`: the settings and the new title ("new_title"), in the event's order."""
    sess = s if isinstance(s, Session) else Session()
    settings = {n: v for n, v in fields.items() if n != "new_title"}
    checks = dict(zip(settings, _validate_settings(settings), strict=True))
    out = [_valid(lambda: check_passage_chosen(pid, sess)), _valid(lambda: check_passage_text(str(pid), new_text)),
           _valid(lambda: check_question(question)), gr.validate(True, ""),
           *(checks.get(n, _valid(lambda: check_passage_title(str(pid), fields[n])) if n == "new_title" else
                        gr.validate(True, "")) for n in fields)]
    return _refusal(out, question, settings, s, refuse, 2)


def check_upload(files: Any, read: bool = True) -> Any:
    """The Corpus of an upload (files: paths or gradio file objects), or a ValueError naming the
    problem and the fix: no file, too many, too large, a type not accepted, a file that cannot be
    read, or what a client sent that is not files (`inputs.NotFiles`). read=False: only what needs
    no reading (count, sizes, types), -> None."""
    if isinstance(files, NotFiles):
        if files.value in (None, "", []):
            files = None
        else:
            raise wrong("files", files.value, "one or more files, each as gradio_client's handle_file(path) makes it")
    paths = [getattr(f, "name", f) for f in (files if isinstance(files, list) else [files] if files else [])]
    if not paths:
        raise ValueError(f"No file uploaded: choose one or more files ({', '.join(supported_extensions())}).")
    if len(paths) > MAX_UPLOAD_FILES:
        raise ValueError(f"{len(paths)} files uploaded, over the limit of {MAX_UPLOAD_FILES}: upload fewer files.")
    total = sum(Path(p).stat().st_size for p in paths)
    if total > MAX_UPLOAD_BYTES:
        raise ValueError(
            f"The upload is {total / 2**20:.1f} MB, over the limit of {MAX_UPLOAD_BYTES / 2**20:.0f} MB "
            "in all: upload smaller or fewer files."
        )
    if not read:
        for p in paths:
            check_type(p)
        return None
    names = [Path(p).name for p in paths]
    shown = ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])} +{len(names) - 3}"
    key = tuple((str(p), Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in paths)
    with _PARSED_LOCK:
        if key in _PARSED:  # the validator parsed these very files a moment ago: the handler reuses it
            return _PARSED.pop(key)
    corpus = load_documents(paths, name=f"Your documents: {shown}")
    with _PARSED_LOCK:
        _PARSED[key] = corpus
        while len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)
    return corpus


# An upload's corpus as the validator read it, for the handler that follows: each upload is read and
# split once. Keyed by the files' paths, sizes and times; taken (not copied) by the next reader.
_PARSED: "OrderedDict[tuple, Any]" = OrderedDict()
_PARSED_LOCK = threading.Lock()
_PARSED_KEPT = 4


def remove_uploaded(files: Any) -> None:
    """Delete an upload's files from gradio's cache (their text is in the visitor's corpus now);
    anything that is not a file path is left alone."""
    if isinstance(files, NotFiles) or not files:
        return
    for f in files if isinstance(files, list) else [files]:
        path = getattr(f, "name", f)
        if isinstance(path, (str, Path)):
            Path(path).unlink(missing_ok=True)


def validate_upload(files, s, serving: Any = None) -> list[dict]:
    """gradio validator of the upload: reads and splits the files (no model runs), so a file
    that cannot be used gets its message on the file box, and the status line, which shows the
    upload's progress, never carries an error badge. With the server's `serving`, reading is
    work of the server's one upload lane: while another upload holds it, only what needs no
    reading is checked here (count, sizes, types), and the handler reads the files in its turn."""
    if serving is None:
        return [_valid(lambda: check_upload(files)), gr.validate(True, "")]
    with serving.upload_lane(block=False) as free:
        return [_valid(lambda: check_upload(files, read=free)), gr.validate(True, "")]
