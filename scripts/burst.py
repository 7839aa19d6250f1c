"""Load check: a burst of N concurrent questions to a running app's `/ask` endpoint.

    python scripts/burst.py                       # 10 questions to http://127.0.0.1:7860/
    python scripts/burst.py --url URL -n 10 --k 2 --max-new-tokens 4

All requests are submitted at once (one gradio_client.Client each, as N users would); the app's
queue runs them one model call at a time. Prints each request's latency (submit to answer) and
the totals; exits 1 if any request failed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rag_demo.web.session_view import VITAL_EXAMPLES  # noqa: E402 - torch-free

QUESTIONS = VITAL_EXAMPLES + ("What is Mars?", "Who devised pointillism?")  # the app's examples + 2


def run(url: str, n: int = 10, k: int = 2, max_new_tokens: int = 4, decoding: str = "fast",
        timeout: float = 600) -> list[dict]:
    """Send n questions at once; [{"i", "question", "ok", "latency", "answer" | "error"}] in order."""
    from gradio_client import Client

    results: list[dict] = [{} for _ in range(n)]
    start = threading.Barrier(n)

    def one(i: int) -> None:
        q = QUESTIONS[i % len(QUESTIONS)]
        r = {"i": i, "question": q, "ok": False}
        try:
            client = Client(url, verbose=False)
            start.wait(timeout)
            t0 = time.perf_counter()
            out = client.predict(q, k, 1, max_new_tokens, decoding, "offline", api_name="/ask")
            r.update(ok=True, latency=time.perf_counter() - t0, answer=out["answers"]["token"]["text"].strip())
        except Exception as e:  # noqa: BLE001 - reported per request
            r.update(latency=float("nan"), error=f"{type(e).__name__}: {e}")
        results[i] = r

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:7860/")
    p.add_argument("-n", type=int, default=10, help="concurrent requests (default 10)")
    p.add_argument("--k", type=int, default=2, help="passages per question (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=4, help="default 4")
    p.add_argument("--decoding", default="fast", help="RAG-Sequence decoding: fast (default) or thorough")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = run(args.url, args.n, args.k, args.max_new_tokens, args.decoding)
    wall = time.perf_counter() - t0
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


if __name__ == "__main__":
    sys.exit(main())
