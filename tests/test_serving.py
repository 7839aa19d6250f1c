"""Nothing a visitor does can take the demo down: the page's maximum settings sent to a
launched `app.py` (Vital Articles, the offline stack) get an answer or a clear refusal within the
configured time limit, the app's peak RSS stays under its budget, and a normal question is
answered right after. Slow (loads the real models); CI runs it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rag_demo.config import KNOBS, MAX_QUESTION_CHARS
from rag_demo.serving.memory import peak_rss_bytes, rss_bytes

ROOT = Path(__file__).resolve().parent.parent
TIME_LIMIT_S = 30.0  # the app's --time-limit in this test
LONG_QUESTION = ("Tell me everything about the history of the Roman Empire, its emperors, wars, roads and fall. "
                 * 20)[:MAX_QUESTION_CHARS].strip()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(free_port, tmp_path_factory, stop_process):
    port = free_port()
    log_path = tmp_path_factory.mktemp("serving") / "app.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    cmd = [sys.executable, "app.py", "--port", str(port), "--time-limit", str(TIME_LIMIT_S)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + 600
            from gradio_client import Client

            while True:  # served at once, then "Live" once loaded and warmed up
                if proc.poll() is not None:
                    pytest.fail(f"app.py exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
                try:
                    urllib.request.urlopen(url, timeout=2).close()
                    status = Client(url, verbose=False).predict(api_name="/status")[0]
                    if "data-stack=" in status:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"app.py not ready within 600 s: {log_path.read_text()[-3000:]}")
                time.sleep(2)
            yield url, proc.pid, log_path
        finally:
            stop_process(proc)


@pytest.mark.alone  # the budget prices the question after it by the machine's measured speed: another
# worker's load (a fresh environment installed by test_space.py) made it refuse an ordinary question
def test_maximum_settings_are_answered_or_refused_within_the_limit_and_memory_stays_bounded(served):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from rag_demo.serving.budget import Budget

    url, pid, log_path = served
    budget = Budget()  # app.py's defaults (only --time-limit is set here)
    warm = rss_bytes(pid)
    assert warm is not None
    c = Client(url, verbose=False)
    t0 = time.monotonic()
    try:
        r = c.predict(LONG_QUESTION, KNOBS["k"].hi, KNOBS["num_beams"].hi, KNOBS["max_new_tokens"].hi,
                      "thorough", "offline", api_name="/ask")
        outcome = "answered"
    except AppError as e:  # a refusal names the cost and what to change
        r, outcome = None, str(e)
        assert "would" in outcome.lower() or "limit" in outcome.lower(), outcome
        assert any(w in outcome for w in ("K", "k=", "beams", "max new tokens", "max_new_tokens")), outcome
    took = time.monotonic() - t0
    peak = peak_rss_bytes(pid)
    print(f"\nmax settings: {outcome if r is None else 'answered'} in {took:.1f} s; RSS warm {warm / 1e9:.2f} GB, "
          f"peak {peak / 1e9:.2f} GB; load avg {os.getloadavg()}")
    # the wall-clock limit holds for the whole request (one deadline for the three answers), plus
    # one model step that may be running when it passes and the three answers' overheads
    assert took < TIME_LIMIT_S + 30, f"took {took:.1f} s with a {TIME_LIMIT_S:.0f} s limit"
    if r is not None:
        assert set(r["answers"]) == {"sequence", "token", "closed-book"}
        for a in r["answers"].values():
            assert a["stopped"] in ("eos", "max_new_tokens", "time_limit")
    assert peak < warm + budget.max_request_bytes + 0.5e9, (peak, warm, budget.max_request_bytes)
    # and the app keeps serving: a normal question right after, at the page's defaults (always admitted;
    # a costlier one is priced by the CPU's measured speed, and on a busy shared CPU its estimate
    # crossed the 45 s limit)
    from rag_demo.config import RagSettings

    d = RagSettings(preset="aided").decoding
    t1 = time.monotonic()
    ok = c.predict("Who painted The Starry Night?", d.k, d.num_beams, d.max_new_tokens, d.sequence_decoding,
                   "offline", api_name="/ask")
    took = time.monotonic() - t1
    print(f"then a normal question in {took:.1f} s: {ok['answers']['token']['text']!r} "
          f"({ok['answers']['token']['stopped']})")
    assert took < TIME_LIMIT_S + 30  # at most the time limit, whatever the CPU's load
    token = ok["answers"]["token"]
    assert token["text"].strip()
    if token["stopped"] != "time_limit":  # a whole answer (a busy CPU may cut it)
        assert "Gogh" in token["text"] or "Gogh" in ok["answers"]["sequence"]["text"]


def test_the_wrong_answer_lesson_copies_the_wrong_name_marks_it_and_its_confidence_cannot_tell(served):
    """The lesson "The right passage, a wrong answer" in a real browser, on the Vital Articles app:
    both RAG cards copy the wrong name from the Fleming passage, as the lesson says, the copied words
    are highlighted in that passage, and the confidence is no lower than a coin toss, as the lesson
    tells the learner: a sure copy from a passage with p(z|x) near 1 is a failure the fitted
    confidence (assets/confidence.json) can hardly see (docs/results.md §8)."""
    from playwright.sync_api import sync_playwright
    from test_browser import CHROMIUM_ARGS, SHOTS, _require_browser

    _require_browser()
    url = served[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)

        def ask(lesson, q: str, shot: str) -> None:
            lesson.locator(".rag-lesson-q", has_text=q).click()
            page.wait_for_function(  # every card final (its timings shown) and the passages table drawn
                """(q) => [...document.querySelectorAll('[id^=rag-answer-]')].every(c => c.querySelector('.rag-total')
                    && (c.querySelector('.rag-asked') || {}).textContent === 'Q: ' + q)
                    && document.querySelector('#rag-passages table.rag-ptable')""",
                arg=q, timeout=180_000, polling=200)
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / shot), full_page=True)

        try:
            page.goto(url)
            page.wait_for_selector(".rag-status[data-stack='offline']", timeout=240_000)
            lesson = page.locator(".rag-lesson", has_text="The right passage, a wrong answer")
            assert "what it cannot see" in lesson.inner_text()  # the lesson says what the confidence misses
            ask(lesson, "Who discovered penicillin?", "penicillin-lesson.png")
            for mode in ("sequence", "token"):
                card = page.locator(f"#rag-answer-{mode}")
                text = card.locator(".rag-answer").inner_text()
                assert "Fleming" not in text, f"{mode} answered {text!r}: the lesson's failure no longer happens"
                shown = card.locator(".rag-confidence").get_attribute("data-confidence")
                # the confidence can hardly see it, as the lesson says: no cue, and far from sure it is wrong
                assert shown and 0.2 < float(shown) < 0.75, (mode, shown)
                assert card.locator(".rag-cue[data-cue='probably_wrong']").count() == 0, mode
            marks = page.locator("#rag-passages table.rag-ptable:not(.rag-near-table) mark.rag-span")
            copied = [marks.nth(i).inner_text() for i in range(marks.count())]
            answer = page.locator("#rag-answer-token .rag-answer").inner_text().strip().rstrip(".")
            assert any(m.strip() in answer or answer in m for m in copied), (copied, answer)
        finally:
            browser.close()
