"""The Space's install path, checked end to end: a fresh virtualenv built by scripts/space_build.sh
alone (the Dockerfile's one build step: the registries only), then `python app.py` with
HF_HUB_OFFLINE=1 and an empty cache; /ask must answer, and from the GGUF weights every number in
docs/ was measured on (models/weights.MEASURED_GGUF), as its JSON and the app's log say.

    python scripts/space_check.py            # prints each stage's time; exits 1 if a check fails

tests/test_space.py runs it (so CI does). Loopback only; bounded: each stage has a time limit.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rag_demo.models.weights import MEASURED_GGUF  # noqa: E402 - torch-free

ASK = """
import json, sys
from gradio_client import Client
c = Client(sys.argv[1], verbose=False)
r = c.predict("Who painted The Starry Night?", api_name="/ask")
print(json.dumps(r if isinstance(r, dict) else json.loads(r)))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="space-check-"))
    venv, cache = work / "venv", work / "cache"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    subprocess.run(["scripts/space_build.sh"], cwd=ROOT, env=env, check=True, timeout=1800)
    print(f"installed as a Space installs ({time.perf_counter() - t0:.0f} s)", flush=True)
    port, log = free_port(), work / "app.log"
    run_env = {**env, "HF_HUB_OFFLINE": "1", "RAG_DEMO_CACHE": str(cache), "GRADIO_ANALYTICS_ENABLED": "False"}
    with open(log, "w") as out:
        app = subprocess.Popen([str(venv / "bin" / "python"), "app.py", "--host", "127.0.0.1", "--port", str(port)],
                               cwd=ROOT, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url, t1 = f"http://127.0.0.1:{port}/", time.perf_counter()
        while True:
            if app.poll() is not None:
                print(log.read_text()[-3000:])
                raise SystemExit(f"app.py exited with {app.returncode}")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                if time.perf_counter() - t1 > 300:
                    raise SystemExit("app.py served no page within 300 s") from None
                time.sleep(1)
        got = subprocess.run([str(venv / "bin" / "python"), "-c", ASK, url], env=run_env, capture_output=True,
                             text=True, timeout=600)
        if got.returncode:
            print(got.stderr[-3000:], log.read_text()[-3000:])
            raise SystemExit("/ask failed")
        r = json.loads(got.stdout.strip().splitlines()[-1])
        w, said = r.get("weights") or {}, log.read_text()
        print(f"answered in {time.perf_counter() - t1:.0f} s from a cold start: "
              f"{r['answers']['token']['text']!r}; weights {w.get('described')}", flush=True)
        checks = {
            "the answer came from the GGUF weights": w.get("generator") == "gguf" and w.get("fingerprint") == MEASURED_GGUF,
            "/ask's JSON says they are the measured ones": w.get("measured") is True,
            "the log names them at start": MEASURED_GGUF in said and "generator weights" in said,
            "every mode answered": set(r["answers"]) == {"sequence", "token", "closed-book"},
        }
        for what, ok in checks.items():
            print(f"{'ok  ' if ok else 'FAIL'} {what}")
        return 0 if all(checks.values()) else 1
    finally:
        app.terminate()
        try:
            app.wait(20)
        except subprocess.TimeoutExpired:
            app.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
