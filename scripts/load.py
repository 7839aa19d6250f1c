"""Load check: bursts of concurrent clients mixing cheap and expensive questions.

    python scripts/load.py                          # launches app.py (Vital Articles) on 127.0.0.1
    python scripts/load.py --url http://127.0.0.1:7860/ --pid 1234   # an app already running
    python scripts/load.py --bursts 2 --clients 6 --corpus-file tests/fixtures/seurat.txt  # shorter
    python scripts/load.py --burst 10 --url http://127.0.0.1:7860/   # one burst of 10 questions
    python scripts/load.py --class 20                # twenty visitors at once, the page's defaults

`--class N`: a class asks at once. First `--alone` questions one after another (the page's
defaults), then N visitors at once, each its own gradio_client.Client with a different question
(the "train" split of assets/qa_train_vital.jsonl, read at run time), all with the page's
defaults. Prints the makespan, p50 and p95 latency, the throughput against serial (N x the median
question alone / the makespan), answers cut for time, failures and the app's RSS after the wave.

`--burst N`: one burst of N questions sent at once (the app's examples, one gradio_client.Client
each, as N users would) with --k, --max-new-tokens and --decoding (default 2, 4, fast: quick);
the app's queue runs them one model call at a time. Prints each request's latency (submit to
answer) and the totals; exits 1 if any request failed. Without --url it launches app.py first.

The default mode:

First one burst of cheap questions only (every client asks with the default settings), then
`--bursts` bursts of `--clients` clients at once, `--expensive` of them asking with K=20, 4 beams,
128 new tokens, thorough RAG-Sequence (sent first, so they are running or queued when the cheap
ones arrive). Each client is its own gradio_client.Client on /ask (loopback only). Prints per
burst: answered / refused / failed (and each mixed burst's `--edits` visitors who edit a passage and
ask again and `--uploads` who upload a ~200 KB document and ask it), cheap latency p50 / p95, the
server's RSS after the burst and
the most its generator kept for later questions (passages' keys and values, hidden states: from
each answer's `kept`) against their bounds;
then the acceptance lines (cheap p95 with expensive queued <= 2x cheap p95 alone; RSS after the
bursts within 15% of RSS after warm-up; the peak RSS within the budget's promise: what the app held
after warm-up, the kept caches' bounds and two requests at their byte limit) and the load average.
Numbers, not a test: the CPU may be shared, so each line says the load average it was measured under.

Bounded: at most --bursts x --clients requests, each burst given at most --burst-timeout seconds,
the whole run at most --max-minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rag_demo.config import RagSettings  # noqa: E402 - torch-free
from rag_demo.serving.memory import peak_rss_bytes, rss_bytes  # noqa: E402 - torch-free
from rag_demo.web.session_view import VITAL_EXAMPLES  # noqa: E402 - torch-free

# a cheap question: the offline stack's defaults, as the page asks them
CHEAP = {n: getattr(RagSettings(preset="aided").decoding, n) for n in ("k", "num_beams", "max_new_tokens", "sequence_decoding")}
EXPENSIVE = {"k": 20, "num_beams": 4, "max_new_tokens": 128, "sequence_decoding": "thorough"}
EXPENSIVE_QUESTION = "Tell me everything about the history of the Roman Empire."
BURST_QUESTIONS = VITAL_EXAMPLES + ("What is Mars?", "Who devised pointillism?")  # the app's examples + 2
EDIT_QUESTION = "Who painted The Starry Night?"
EDIT_TEXT = ("The Starry Night is an oil-on-canvas painting by Claude Monet, painted in June 1889. " * 60)[:3900]
UPLOAD_TEXT = " ".join(f"The Zorblax Festival number {i} is held every spring in the mountain town of Quillmere."
                       for i in range(2500))  # ~200 KB: a few hundred passages to embed
REFUSAL_WORDS = ("would take", "over the limit", "over this server", "expensive", "refuse", "budget", "busy",
                 "at a time")


def ask_result(out) -> dict:
    """/ask's result as a dict (gradio_client hands it as a dict, or as JSON text)."""
    return json.loads(out) if isinstance(out, str) else out


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[i]


def gb(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 1e9:.2f} GB"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(corpus_files: list[str], extra: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port), *extra]
    for f in corpus_files:
        cmd += ["--corpus-file", f]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the app
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with {proc.returncode}; see {log_path}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return proc, url
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"app.py did not serve {url} within 180 s; see {log_path}") from None
            time.sleep(0.5)


def wait_ready(url: str, timeout: float) -> float:
    """Waits until the status endpoint says a stack is live (loaded and warmed up); seconds waited."""
    import httpx
    from gradio_client import Client

    t0 = time.monotonic()
    c = None
    while time.monotonic() - t0 < timeout:
        try:  # an app given by --url may still be starting: its port refuses until it listens
            c = c or Client(url, verbose=False)
        except (OSError, httpx.ConnectError):
            time.sleep(2)
            continue
        status = c.predict(api_name="/status")
        if "data-stack=" in str(status[0] if isinstance(status, (list, tuple)) else status):
            return time.monotonic() - t0
        time.sleep(2)
    raise SystemExit(f"the app was not ready after {timeout:.0f} s")


def one(url: str, question: str, s: dict, start: threading.Event, out: dict, delay: float, timeout: float) -> None:
    from gradio_client import Client

    try:
        client = Client(url, verbose=False)
        start.wait(timeout)
        time.sleep(delay)
        t0 = time.perf_counter()
        job = client.submit(question, s["k"], s["num_beams"], s["max_new_tokens"], s["sequence_decoding"],
                            "offline", api_name="/ask")
        r = ask_result(job.result(timeout=timeout))
        out.update(ok=True, latency=time.perf_counter() - t0,
                   stopped={m: a.get("stopped") for m, a in r["answers"].items()},
                   kept=[a.get("kept") or {} for a in r["answers"].values()])
    except Exception as e:  # noqa: BLE001 - counted per request
        msg = f"{type(e).__name__}: {e}"
        refused = any(w in str(e).lower() for w in REFUSAL_WORDS)
        out.update(ok=False, refused=refused, error=msg[:300],
                   latency=time.perf_counter() - t0 if "t0" in locals() else float("nan"))


def class_questions(n: int) -> list[str]:
    """n distinct questions written by others: the "train" split of the older question file, read
    at run time (never copied into the project)."""
    from rag_demo.questions import load_qa
    from rag_demo.splits import in_split

    items = in_split(load_qa(ROOT / "assets" / "qa_train_vital.jsonl"), "train")
    qs = list(dict.fromkeys(it.question for it in items))
    if len(qs) < n:
        raise SystemExit(f"--class needs {n} questions; the train split holds {len(qs)}")
    return qs[:n]


def class_wave(url: str, n: int, n_alone: int, timeout: float, pid: int | None, upload_during: bool = False) -> dict:
    """n_alone questions one after another, then n visitors at once, each its own question (and with
    `upload_during` one more visitor uploading a document and asking it); prints and returns the
    wave's numbers, with the CPU seconds the app and this script's clients used during it."""
    qs = class_questions(n + n_alone)
    alone = []
    for q in qs[n:]:
        r: dict = {}
        one(url, q, CHEAP, _started(), r, 0.0, timeout)
        if not r.get("ok"):
            raise SystemExit(f"a question alone failed: {r.get('error')}")
        alone.append(r["latency"])
        print(f"alone: {r['latency']:.2f} s  {q[:60]!r}", flush=True)
    one_alone = statistics.median(alone)
    start = threading.Event()
    results = [{"kind": "cheap", "question": q} for q in qs[:n]]
    threads = [threading.Thread(target=one, args=(url, q, CHEAP, start, r, 0.0, timeout), daemon=True)
               for q, r in zip(qs[:n], results)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # every client connected before the wave
    cpu0, mine0 = cpu_seconds(pid), _own_cpu()
    upload: dict = {}
    up = (threading.Thread(target=edit_or_upload, args=(url, "upload", start, upload, timeout), daemon=True)
          if upload_during else None)
    if up is not None:
        up.start()
        time.sleep(1.0)  # its client connected too
    t0 = time.perf_counter()
    start.set()
    for t in threads:
        t.join(max(0.1, t0 + timeout + 5 - time.perf_counter()))
    if up is not None:
        up.join(max(0.1, t0 + timeout + 5 - time.perf_counter()))
    app_cpu, clients_cpu = (cpu_seconds(pid) - cpu0 if pid else float("nan")), _own_cpu() - mine0
    ok = [r for r in results if r.get("ok")]
    makespan = max((r["latency"] for r in ok), default=float("nan"))
    lat = [r["latency"] for r in ok]
    cut = sum(any(v in ("time_limit", "cancelled") for v in (r.get("stopped") or {}).values()) for r in ok)
    rss = rss_bytes(pid) if pid else None
    gain = n * one_alone / makespan if ok else float("nan")
    print(f"class of {n} on {machine_name()}: one alone {one_alone:.2f} s (median of {len(alone)}); "
          f"{len(ok)}/{n} answered, {n - len(ok)} failed, {cut} cut for time; makespan {makespan:.1f} s, "
          f"p50 {pct(lat, 50):.1f} s, p95 {pct(lat, 95):.1f} s; throughput {gain:.2f}x serial "
          f"({n} x {one_alone:.2f} s / {makespan:.1f} s); RSS after the wave {gb(rss)}; load avg {load_avg()}; "
          f"CPU seconds during the wave: the app {app_cpu:.0f}, this script's {n} clients {clients_cpu:.0f}",
          flush=True)
    if up is not None:
        said = (f"answered in {upload['latency']:.1f} s" if upload.get("ok") else
                f"refused: {upload.get('error')}" if upload.get("refused") else f"FAILED: {upload.get('error')}")
        print(f"an upload ({len(UPLOAD_TEXT.encode()) / 1e3:.0f} KB) and its question sent with the wave: {said}",
              flush=True)
    for r in results:
        if not r.get("ok"):
            print(f"  failed: {r.get('error')}", flush=True)
    return {"n": n, "one_alone_s": one_alone, "alone_s": alone, "answered": len(ok), "cut": cut,
            "makespan_s": makespan, "p50_s": pct(lat, 50), "p95_s": pct(lat, 95), "gain": gain, "rss": rss,
            "latencies_s": lat, "app_cpu_s": app_cpu, "clients_cpu_s": clients_cpu,
            "upload": {k: upload.get(k) for k in ("ok", "refused", "latency", "error")} if up is not None else None}


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat); NaN where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return float("nan")


def _own_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _started() -> threading.Event:
    e = threading.Event()
    e.set()
    return e


def machine_name() -> str:
    from rag_demo.models.machine import cpu_name

    return cpu_name()


def edit_or_upload(url: str, kind: str, start: threading.Event, out: dict, timeout: float) -> None:
    """A visitor's own work: "edit" asks, then replaces the top passage with EDIT_CHARS characters and
    asks again (/edit_passage); "upload" uploads a text of UPLOAD_BYTES and asks it (/upload,
    /ask_session). One gradio_client.Client, so one session, each."""
    import tempfile

    from gradio_client import Client, handle_file

    s = CHEAP
    try:
        client = Client(url, verbose=False)
        start.wait(timeout)
        t0 = time.perf_counter()
        if kind == "edit":
            first = client.predict(EDIT_QUESTION, s["k"], s["num_beams"], s["max_new_tokens"], s["sequence_decoding"],
                                   api_name="/ask_session")
            pid = first[6]["value"] if isinstance(first[6], dict) else first[6]
            client.predict(pid, EDIT_TEXT, EDIT_QUESTION, s["k"], s["num_beams"], s["max_new_tokens"],
                           s["sequence_decoding"], api_name="/edit_passage")
        else:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(UPLOAD_TEXT)
            client.predict([handle_file(f.name)], api_name="/upload")
            client.predict("Where is the Zorblax Festival held?", s["k"], s["num_beams"], s["max_new_tokens"],
                           s["sequence_decoding"], api_name="/ask_session")
            os.unlink(f.name)
        out.update(ok=True, latency=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - counted per request
        refused = any(w in str(e).lower() for w in REFUSAL_WORDS)
        out.update(ok=False, refused=refused, error=f"{type(e).__name__}: {e}"[:300],
                   latency=time.perf_counter() - t0 if "t0" in locals() else float("nan"))


def burst(url: str, n_cheap: int, n_expensive: int, timeout: float, n_edits: int = 0,
          n_uploads: int = 0) -> list[dict]:
    """n_expensive expensive requests, then (0.5 s later) n_cheap cheap ones, all concurrent; beside
    them n_edits visitors editing a passage and n_uploads uploading a document (`edit_or_upload`)."""
    start = threading.Event()
    results, threads = [], []
    for i in range(n_expensive + n_cheap):
        heavy = i < n_expensive
        r = {"kind": "expensive" if heavy else "cheap"}
        q = EXPENSIVE_QUESTION if heavy else VITAL_EXAMPLES[i % len(VITAL_EXAMPLES)]
        t = threading.Thread(target=one, args=(url, q, EXPENSIVE if heavy else CHEAP, start, r,
                                               0.0 if heavy else 0.5, timeout), daemon=True)
        results.append(r)
        threads.append(t)
        t.start()
    for kind in ["edit"] * n_edits + ["upload"] * n_uploads:
        r = {"kind": kind}
        t = threading.Thread(target=edit_or_upload, args=(url, kind, start, r, timeout), daemon=True)
        results.append(r)
        threads.append(t)
        t.start()
    time.sleep(1.0)  # clients connected
    start.set()
    deadline = time.monotonic() + timeout + 5
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    for r in results:
        r.setdefault("ok", False)
        r.setdefault("error", "no answer within the burst timeout")
    return results


def run_burst(url: str, n: int = 10, k: int = 2, max_new_tokens: int = 4, decoding: str = "fast",
              timeout: float = 600) -> list[dict]:
    """Send n questions at once; [{"i", "question", "ok", "latency", "answer" | "error"}] in order."""
    from gradio_client import Client

    results: list[dict] = [{} for _ in range(n)]
    start = threading.Barrier(n)

    def ask(i: int) -> None:
        q = BURST_QUESTIONS[i % len(BURST_QUESTIONS)]
        r = {"i": i, "question": q, "ok": False}
        try:
            try:
                client = Client(url, verbose=False)
            finally:
                start.wait(timeout)  # all start together, also when one of them could not connect
            t0 = time.perf_counter()
            out = ask_result(client.predict(q, k, 1, max_new_tokens, decoding, "offline", api_name="/ask"))
            r.update(ok=True, latency=time.perf_counter() - t0, answer=out["answers"]["token"]["text"].strip())
        except Exception as e:  # noqa: BLE001 - reported per request
            r.update(latency=float("nan"), error=f"{type(e).__name__}: {e}")
        results[i] = r

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def report_burst(results: list[dict], wall: float) -> int:
    """Prints each request's latency and the totals; 0 if every request was answered, else 1."""
    for r in results:
        what = repr(r.get("answer")) if r.get("ok") else r.get("error", "no result")
        print(f"#{r.get('i', '?'):>2}  {r.get('latency', float('nan')):7.2f} s  {r.get('question', '')!r:45} -> {what}")
    ok = [r["latency"] for r in results if r.get("ok")]
    print(f"\n{len(ok)}/{len(results)} answered in {wall:.1f} s wall "
          f"({len(ok) / wall:.2f} questions/s, 3 answers each)")
    if ok:
        print(f"latency: min {min(ok):.2f} s, median {statistics.median(ok):.2f} s, "
              f"mean {statistics.mean(ok):.2f} s, max {max(ok):.2f} s")
    return 0 if len(ok) == len(results) else 1


def summary(name: str, results: list[dict], pid: int | None) -> dict:
    cheap = [r["latency"] for r in results if r["kind"] == "cheap" and r.get("ok")]
    counts = {kind: (sum(1 for r in results if r["kind"] == kind and r.get("ok")),
                     sum(1 for r in results if r["kind"] == kind and not r.get("ok") and r.get("refused")),
                     sum(1 for r in results if r["kind"] == kind and not r.get("ok") and not r.get("refused")),
                     sum(1 for r in results if r["kind"] == kind))
              for kind in ("cheap", "expensive", "edit", "upload")}
    cuts = [sum(v in ("time_limit", "cancelled") for v in (r.get("stopped") or {}).values())
            for r in results if r.get("ok")]
    cut, cards, answered = sum(c > 0 for c in cuts), sum(cuts), len(cuts)
    rss = rss_bytes(pid) if pid else None
    kept = {}  # what the generator keeps for later questions: the most any answer reported, and its bound
    for r in results:
        for k in r.get("kept") or []:
            for what, st in k.items():
                was = kept.get(what, (0, st["max_bytes"]))
                kept[what] = (max(was[0], st["bytes"]), st["max_bytes"])
    kept_line = "; ".join(f"{what.replace('_', ' ')} kept {b / 2**20:.1f} MiB of {bound / 2**20:.0f} "
                          f"({'within' if b <= bound else 'OVER'} the bound)" for what, (b, bound) in kept.items())
    line = (f"{name:>12}: cheap {counts['cheap'][0]}/{counts['cheap'][3]} answered, {counts['cheap'][1]} refused, "
            f"{counts['cheap'][2]} failed; expensive {counts['expensive'][0]}/{counts['expensive'][3]} answered, "
            f"{counts['expensive'][1]} refused, {counts['expensive'][2]} failed; "
            + "".join(f"{kind}s {counts[kind][0]}/{counts[kind][3]} done, {counts[kind][1]} refused, "
                      f"{counts[kind][2]} failed; " for kind in ("edit", "upload") if counts[kind][3])
            + f"{cut} answered with a mode "
            f"cut ({cards} of {3 * answered} cards); "
            f"cheap latency p50 {pct(cheap, 50):.1f} s p95 {pct(cheap, 95):.1f} s; RSS {gb(rss)}; "
            f"{kept_line + '; ' if kept_line else ''}load avg {load_avg()}")
    print(line, flush=True)
    for r in results:
        if not r.get("ok"):
            print(f"              {r['kind']}: {r.get('error')}", flush=True)
    return {"cheap": cheap, "rss": rss, "counts": counts, "kept": kept}


MODEL_LANES = 2  # requests the model lane runs at once (app.py --model-concurrency's default)


def budget_promise(rss_after_warmup: int) -> int:
    """The most the budget lets the app hold (serving/budget.Budget's docstring): what it holds after
    warm-up, the bounds of what its generator keeps for later questions, and MODEL_LANES requests
    at their byte limit."""
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.serving.budget import Budget

    spec = StackSpec()
    kept = (spec.passage_cache_mb + spec.hidden_cache_mb) * 2**20
    return rss_after_warmup + kept + MODEL_LANES * Budget().max_request_bytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="an app already running (loopback); default: launch app.py")
    p.add_argument("--pid", type=int, help="the running app's process id, for its RSS (with --url)")
    p.add_argument("--corpus-file", action="append", default=[], help="launch with these documents")
    p.add_argument("--app-arg", action="append", default=[], help="extra app.py argument (repeatable)")
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--expensive", type=int, default=4, help="expensive clients per mixed burst (default 4)")
    p.add_argument("--expensive-settings", default="20,4,128,thorough", metavar="K,BEAMS,TOKENS,DECODING",
                   help="the expensive clients' settings (default 20,4,128,thorough: refused by the default "
                   "budget; something just under the budget, e.g. 10,2,48,fast on a quiet CPU (about 17 s with the "
                   "uncalibrated constants), is admitted as expensive and exercises the step gate; on a busy CPU "
                   "the calibrated estimate of that was 75 s, refused)")
    p.add_argument("--edits", type=int, default=2, help="visitors editing a passage per mixed burst (default 2)")
    p.add_argument("--uploads", type=int, default=1, help="visitors uploading a document per mixed burst (default 1)")
    p.add_argument("--burst-timeout", type=float, default=300.0)
    p.add_argument("--max-minutes", type=float, default=30.0)
    p.add_argument("--burst", type=int, metavar="N",
                   help="instead: one burst of N questions at once; prints each latency, exits 1 if any failed")
    p.add_argument("--class", dest="klass", type=int, metavar="N",
                   help="instead: a class of N visitors asking at once with the page's defaults")
    p.add_argument("--alone", type=int, default=3, help="--class: questions asked alone first, for serial (default 3)")
    p.add_argument("--out", help="--class: write the wave's numbers to this JSON file")
    p.add_argument("--upload-during", action="store_true",
                   help="--class: one more visitor uploads a document and asks it while the wave runs")
    p.add_argument("--k", type=int, default=2, help="--burst: passages per question (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=4, help="--burst: default 4")
    p.add_argument("--decoding", default="fast", choices=("fast", "thorough"),
                   help="--burst: RAG-Sequence decoding (default fast)")
    args = p.parse_args(argv)
    if args.burst is not None and args.burst < 1:
        p.error("--burst N needs N >= 1")
    k, beams, tokens, decoding = args.expensive_settings.split(",")
    EXPENSIVE.update(k=int(k), num_beams=int(beams), max_new_tokens=int(tokens), sequence_decoding=decoding)
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        raise SystemExit("loopback only: --url must be http://127.0.0.1:PORT/ or http://localhost:PORT/")
    t_end = time.monotonic() + 60 * args.max_minutes
    proc, pid, url = None, args.pid, args.url
    if not url:
        log = ROOT / "artifacts" / "load_app.log"
        log.parent.mkdir(exist_ok=True)
        proc, url = launch(args.corpus_file, args.app_arg, log)
        pid = proc.pid
        print(f"launched app.py (pid {pid}) on {url}; log {log}", flush=True)
    try:
        if args.klass is not None:
            print(f"ready after {wait_ready(url, 900):.0f} s; RSS {gb(rss_bytes(pid) if pid else None)}", flush=True)
            wave = class_wave(url, args.klass, args.alone, args.burst_timeout, pid, args.upload_during)
            if args.out:
                Path(args.out).write_text(json.dumps(wave, indent=1) + "\n")
            return 0 if wave["answered"] == args.klass and not wave["cut"] else 1
        if args.burst is not None:
            if proc is not None:
                print(f"ready after {wait_ready(url, 900):.0f} s", flush=True)
            t0 = time.perf_counter()
            results = run_burst(url, args.burst, args.k, args.max_new_tokens, args.decoding, args.burst_timeout)
            return report_burst(results, time.perf_counter() - t0)
        waited = wait_ready(url, 900)
        time.sleep(2)
        rss0 = rss_bytes(pid) if pid else None
        print(f"ready after {waited:.0f} s; RSS after warm-up {gb(rss0)}; load avg {load_avg()}", flush=True)
        alone = summary("cheap only", burst(url, args.clients, 0, args.burst_timeout), pid)
        mixed_cheap, rss_last, refused = [], None, 0
        for b in range(args.bursts):
            if time.monotonic() > t_end:
                print(f"stopping: --max-minutes {args.max_minutes} reached after {b} mixed bursts", flush=True)
                break
            n_exp = min(args.expensive, args.clients)
            res = summary(f"mixed {b + 1}", burst(url, args.clients - n_exp, n_exp, args.burst_timeout, args.edits,
                                                   args.uploads), pid)
            mixed_cheap += res["cheap"]
            rss_last = res["rss"]
            refused += res["counts"]["expensive"][1] + res["counts"]["cheap"][1]
        p95_alone, p95_mixed = pct(alone["cheap"], 95), pct(mixed_cheap, 95)
        print(f"\ncheap p50/p95 alone {pct(alone['cheap'], 50):.1f} / {p95_alone:.1f} s; with expensive queued "
              f"{pct(mixed_cheap, 50):.1f} / {p95_mixed:.1f} s; ratio of p95 {p95_mixed / p95_alone:.2f} "
              f"(acceptance <= 2.00: {'met' if p95_mixed <= 2 * p95_alone else 'NOT met'})")
        if rss0 and rss_last:
            drift = rss_last / rss0 - 1
            print(f"RSS after warm-up {gb(rss0)}, after the bursts {gb(rss_last)} ({100 * drift:+.1f}%; acceptance "
                  f"within 15%: {'met' if abs(drift) <= 0.15 else 'NOT met'}); peak {gb(peak_rss_bytes(pid))}")
            promise = budget_promise(rss0)
            print(f"peak RSS {gb(peak_rss_bytes(pid))} against the budget's promise {gb(promise)} (the app after "
                  f"warm-up, the kept caches' bounds, {MODEL_LANES} requests in flight at their byte limit): "
                  f"{'within' if (peak_rss_bytes(pid) or 0) <= promise else 'OVER'}")
        print(f"refused in all: {refused}; load avg at the end {load_avg()} ({os.cpu_count()} CPUs)")
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
