"""Take the README screenshot: the real app (Vital Articles, offline stack) answering a question.

    python scripts/screenshot.py                      # starts `python app.py` on a free port
    python scripts/screenshot.py --url http://127.0.0.1:7860/   # or use a running app

Drives Debian's chromium (/usr/bin/chromium) with Playwright, asks the question, and writes
assets/screenshot.png (palette-quantised to stay under ~300 KB).
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
    from PIL import Image
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1,
                                color_scheme="dark" if dark else "light")
        page.goto(url + ("?__theme=dark" if dark else ""))
        page.wait_for_selector(".rag-status[data-stack]", timeout=600_000)
        page.locator("#rag-settings").get_by_text("Settings").click()
        for elem, value in (("rag-k", k), ("rag-max-new", max_new_tokens)):
            box = page.locator(f"#{elem} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.locator("#rag-settings").get_by_text("Settings").click()  # closed again
        page.locator("#rag-question textarea, #rag-question input").first.fill(question)
        page.click("#rag-ask")
        for mode in ("sequence", "token", "closed-book"):
            page.wait_for_selector(f"#rag-answer-{mode} .rag-answer", timeout=600_000)
        time.sleep(1)
        # the page down to the end of the passage table
        bottom = page.locator("#rag-passages").bounding_box()
        raw = out.with_suffix(".raw.png")
        page.screenshot(path=str(raw), full_page=True,
                        clip={"x": 0, "y": 0, "width": 1280, "height": bottom["y"] + bottom["height"] + 16})
        browser.close()
    img = Image.open(raw).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    img.save(out, optimize=True)
    raw.unlink()
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB, {img.size[0]}x{img.size[1]})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running app (default: start python app.py)")
    p.add_argument("--question", default="What is the capital of Australia?")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--dark", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshot.png")
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
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
