"""Take the README screenshots: the real app (Vital Articles, offline stack) answering a question.

    python scripts/screenshot.py                      # starts `python app.py` on a free port
    python scripts/screenshot.py --url http://127.0.0.1:7860/   # or use a running app
    python scripts/screenshot.py --views              # also: streaming, inspector, phone

Drives Debian's chromium (/usr/bin/chromium) with Playwright, asks the question, and writes
assets/screenshot.png (palette-quantised to stay under ~300 KB); with --views also
assets/screenshot_streaming.png (the cards while RAG-Token decodes: its best hypothesis so far,
uncoloured while beam search may still change it), assets/screenshot_inspector.png (a RAG-Token token clicked)
and assets/screenshot_phone.png (390 px wide).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen | None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"app.py exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer within {timeout:.0f} s") from None
            time.sleep(0.5)


def capture(url: str, question: str, out: Path, k: int, max_new_tokens: int, dark: bool) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1,
                                color_scheme="dark" if dark else "light")
        page.goto(url + ("?__theme=dark" if dark else ""))
        page.wait_for_selector(".rag-status[data-stack]", timeout=600_000)
        page.locator("#rag-settings").get_by_text("Settings", exact=True).click()
        for elem, value in (("rag-knob-k", k), ("rag-knob-max-new-tokens", max_new_tokens)):
            box = page.locator(f"#{elem} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.locator("#rag-settings").get_by_text("Settings", exact=True).click()  # closed again
        page.locator("#rag-question textarea, #rag-question input").first.fill(question)
        page.click("#rag-ask")
        _wait_answers(page)
        time.sleep(1)
        # the page down to the end of the passage table
        bottom = page.locator("#rag-passages").bounding_box()
        raw = out.with_suffix(".raw.png")
        page.screenshot(path=str(raw), full_page=True,
                        clip={"x": 0, "y": 0, "width": 1280, "height": bottom["y"] + bottom["height"] + 16})
        browser.close()
    _save(raw, out)


def _wait_answers(page) -> None:
    """Until the three cards show final answers (streaming cards carry no .rag-answer)."""
    for mode in ("sequence", "token", "closed-book"):
        page.wait_for_selector(f"#rag-answer-{mode} .rag-answer", timeout=600_000)


def _save(raw: Path, out: Path) -> None:
    from PIL import Image

    img = Image.open(raw).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    img.save(out, optimize=True)
    raw.unlink()
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB, {img.size[0]}x{img.size[1]})")


STREAMED = "Who wrote War and Peace?"
PARTIAL_JS = """() => {
    const tok = document.querySelector('#rag-answer-token .rag-card-partial');
    return !!tok && Number(tok.dataset.partial) >= 2;
}"""


def capture_views(url: str, question: str, folder: Path) -> None:
    """The streaming view, the inspector and the phone layout (see the module docstring)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_selector(".rag-status[data-stack]", timeout=600_000)
        # a question this server has not answered yet: a repeated one comes from its kept states at once
        page.locator("#rag-question textarea, #rag-question input").first.fill(STREAMED)
        page.click("#rag-ask")
        page.wait_for_function(PARTIAL_JS, timeout=120_000, polling=50)
        cards = page.locator("#rag-cards").bounding_box()
        raw = folder / "screenshot_streaming.raw.png"
        page.screenshot(path=str(raw), full_page=True,  # the cards sit below the first screen
                        clip={"x": 0, "y": cards["y"] - 8, "width": 1280, "height": cards["height"] + 16})
        _save(raw, folder / "screenshot_streaming.png")
        _wait_answers(page)
        page.locator("#rag-question textarea, #rag-question input").first.fill(question)
        page.click("#rag-ask")
        page.wait_for_function("(q) => [...document.querySelectorAll('[id^=rag-answer-] .rag-asked')].every("
                               "e => e.textContent === 'Q: ' + q)", arg=question, timeout=120_000)
        _wait_answers(page)
        token = page.locator("#rag-answer-token a.rag-tok").nth(1)
        token.click()
        page.locator('#rag-answer-token .rag-insp[data-i="1"]').wait_for(state="visible")
        time.sleep(0.5)
        raw = folder / "screenshot_inspector.raw.png"
        page.locator("#rag-answer-token").screenshot(path=str(raw))
        _save(raw, folder / "screenshot_inspector.png")
        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)
        phone.goto(url)
        phone.wait_for_selector(".rag-status[data-stack]", timeout=600_000)
        phone.locator("#rag-question textarea, #rag-question input").first.fill(question)
        phone.click("#rag-ask")
        _wait_answers(phone)
        time.sleep(1)
        top = phone.locator("#rag-cards").bounding_box()
        raw = folder / "screenshot_phone.raw.png"
        phone.screenshot(path=str(raw), full_page=True, clip={"x": 0, "y": top["y"] - 8, "width": 390,
                                                              "height": min(top["height"] + 16, 1400)})
        _save(raw, folder / "screenshot_phone.png")
        browser.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running app (default: start python app.py)")
    p.add_argument("--question", default="What is the capital of Australia?")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--dark", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshot.png")
    p.add_argument("--views", action="store_true", help="also the streaming, inspector and phone screenshots")
    args = p.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        port = _free_port()
        url = f"http://127.0.0.1:{port}/"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env)
    try:
        _wait_http(url, proc)
        capture(url, args.question, args.out, args.k, args.max_new_tokens, args.dark)
        if args.views:
            capture_views(url, args.question, args.out.parent)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
