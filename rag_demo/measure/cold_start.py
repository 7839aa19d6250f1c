"""`bench` 4 and 6: index build throughput, and cold start to the first answer in a fresh process
(the CLI, and the app answering with BM25 while its dense index is built).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from rag_demo.measure.latency import load_avg

THROUGHPUT_PASSAGES = 1000


# ---------------------------------------------------------------- 4 index throughput


def index_throughput(pipe, n: int = THROUGHPUT_PASSAGES) -> dict:
    """Embed + index the first n passages of the pipeline's corpus (no cache): passages/s."""
    from rag_demo.knowledge.corpus import Corpus
    from rag_demo.knowledge.index import build_index

    sub = Corpus(f"first {n}", pipe.index.corpus.passages[:n])
    t0 = time.perf_counter()
    build_index(sub, pipe.stack.ctx_encoder)
    dt = time.perf_counter() - t0
    return {"passages": len(sub), "seconds": dt, "passages_per_s": len(sub) / dt,
            "encoder": pipe.stack.ctx_encoder.name}


# ---------------------------------------------------------------- 6 cold start


def cold_start(question: str, cache_dir: Path | None, extra: list[str], timeout: float = 3600) -> dict:
    """Wall seconds for a fresh `python -m rag_demo ask QUESTION --mode token --json` to print its answer."""
    cmd = [sys.executable, "-m", "rag_demo", "ask", question, "--mode", "token", "--json", *extra]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[2])
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"cold start failed ({proc.returncode}): {proc.stderr[-2000:]}")
    answer = json.loads(proc.stdout)["token"]["text"]
    return {"seconds": dt, "answer": answer, "load_avg_after": load_avg()}


DENSE_READY_LINE = "The dense index of the"  # what the app's pool logs when the swap is done


def cold_start_app(question: str, cache_dir: Path, generator_dtype: str, timeout: float = 1800) -> dict:
    """A fresh `python app.py` over `cache_dir` (empty: nothing cached): wall seconds from launch
    to the first answer of `/ask` (asked as soon as the page is served; it waits for the stack to
    be ready) and the retriever that answer names, then to the log line saying the dense index is
    complete (None if it was complete before, i.e. cached), then the retriever of a second answer."""
    import socket
    import threading
    import urllib.request

    from gradio_client import Client

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "RAG_DEMO_CACHE": str(cache_dir)}
    cmd = [sys.executable, "app.py", "--port", str(port), "--generator-dtype", generator_dtype]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen: dict[str, float] = {}
    timeline: list[tuple[float, str]] = []  # where the seconds went: each log line, timed from launch

    def read() -> None:  # the app's log, each line timed as it comes
        for line in proc.stdout:  # type: ignore[union-attr]
            timeline.append((round(time.perf_counter() - t0, 2), line.rstrip()))
            if DENSE_READY_LINE in line and "complete" in line:
                seen.setdefault("dense", time.perf_counter() - t0)
            elif "stack is ready" in line:
                seen.setdefault("ready", time.perf_counter() - t0)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}/"

    def answer() -> dict:
        r = Client(url, verbose=False).predict(question, api_name="/ask")
        return json.loads(r) if isinstance(r, str) else r

    try:
        while True:
            if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"app.py did not serve {url}: " + "\n".join(line for _, line in timeline[-30:]))
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        t_served = time.perf_counter() - t0
        first = answer()
        t_first = time.perf_counter() - t0
        while "dense" not in seen and time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError("app.py exited: " + "\n".join(line for _, line in timeline[-30:]))
            if first["answers"]["token"].get("retriever") == "dense":
                break  # dense from the start: nothing was built in the background
            time.sleep(0.2)
        second = answer()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"generator_dtype": generator_dtype, "served_s": t_served, "first_answer_s": t_first, "ready_s": seen.get("ready"),
            "first_retriever": first["answers"]["token"].get("retriever"),
            "first_answer": first["answers"]["token"]["text"], "dense_complete_s": seen.get("dense"),
            "second_retriever": second["answers"]["token"].get("retriever"), "load_avg_after": load_avg(),
            "timeline": [(t, line[:200]) for t, line in timeline]}


def run_cold_starts(question: str, spec, extra: list[str], say: Callable[[str], None]) -> dict:
    """Every cold start with an empty cache, one after another: the CLI's (`extra`: its stack
    flags; it embeds every passage, then answers) and, for the offline stack, the app's with the
    generator in float32 and, where the CPU has native bfloat16, in bfloat16."""
    from rag_demo.models.stacks import cpu_has_native_bf16

    out = {}
    say("Cold start of the CLI without a cache (embeds every passage, then answers; minutes) ...")
    with tempfile.TemporaryDirectory(prefix="rag-bench-cache-") as tmp:
        out["cold_uncached"] = cold_start(question, Path(tmp), extra)
    app_dtypes = ("float32", "bfloat16") if cpu_has_native_bf16() else ("float32",)
    for dtype in app_dtypes if spec.name == "offline" else ():
        say(f"Cold start of the app without a cache, generator in {dtype} (answers with BM25 while it builds) ...")
        with tempfile.TemporaryDirectory(prefix="rag-bench-cache-") as tmp:
            out[f"app_{dtype}"] = c = cold_start_app(question, Path(tmp), dtype)
        say(f"  first answer at {c['first_answer_s']:.1f} s ({c['first_retriever']}), dense index complete at "
            f"{c['dense_complete_s'] or float('nan'):.1f} s, then {c['second_retriever']}")
    return out


def format_cold_starts(cold: dict) -> list[str]:
    """The app's cold starts as a table (empty when none ran)."""
    rows = [(k.removeprefix("app_"), c) for k, c in cold.items() if k.startswith("app_")]
    if not rows:
        return []
    lines = ["", "### Cold start of the app with an empty cache (launch to ...)", "",
             "| generator | stack ready | first answer | its retriever | dense index complete | next answer's retriever |",
             "|---|---:|---:|---|---:|---|"]
    for dtype, c in rows:
        ready = f"{c['ready_s']:.1f} s" if c.get("ready_s") is not None else "-"
        dense = f"{c['dense_complete_s']:.1f} s" if c.get("dense_complete_s") is not None else "-"
        lines.append(f"| {dtype} | {ready} | {c['first_answer_s']:.1f} s | {c['first_retriever']} | {dense} "
                     f"| {c['second_retriever']} |")
    return lines
