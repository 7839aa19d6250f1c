"""experiments/ still runs: each experiment's --help, and each on a tiny input (the tiny offline
pipeline of experiments/_shared.py: a random 2-layer generator with SmolLM2's tokenizer, MiniLM,
the three fixture passages), called in this process so the models load once; and scripts/ holds
only what a user runs, each still starting."""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
NAMES = ("rerank_candidates", "token_misses", "reader_variants", "reader_variants_table", "corpus_scale",
         "memory_check", "index_build_profile", "float32_profile", "int8_generator", "linear_kernels", "question_pmi",
         "off_subject", "question_tower", "cue_signals", "cue_enlarged", "passage_pmi")


@pytest.fixture(scope="module")
def exp():
    """import_module for experiments/ (on sys.path while this module's tests run)."""
    sys.path.insert(0, str(EXPERIMENTS))
    yield importlib.import_module
    sys.path.remove(str(EXPERIMENTS))


@pytest.fixture(scope="module")
def tiny_run(exp, tmp_path_factory) -> Path:
    """An `eval --out` report of the tiny pipeline on 3 questions about the fixture passages."""
    return exp("_shared").tiny_run(tmp_path_factory.mktemp("run") / "tiny_run.json")


def run_script(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_scripts_hold_only_what_users_run_and_experiments_are_all_tested_and_described():
    assert sorted(p.name for p in (ROOT / "scripts").iterdir() if p.name != "__pycache__") == [
        "batched_same.py", "class_calls.py", "estimates.py", "identical.py", "load.py", "page_stays.py", "screenshot.py",
        "setup.sh", "ship_index.py", "space_build.sh", "space_check.py"]
    on_disk = {p.stem for p in EXPERIMENTS.glob("*.py") if not p.name.startswith("_")}
    assert on_disk == set(NAMES)
    readme = (EXPERIMENTS / "README.md").read_text(encoding="utf-8")
    assert all(f"{name}.py" in readme for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_experiment_says_how_to_run_it(name):
    r = run_script(EXPERIMENTS / f"{name}.py", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stderr[-2000:]


@pytest.mark.parametrize("script", ["batched_same.py", "class_calls.py", "estimates.py", "identical.py", "load.py",
                                    "page_stays.py", "screenshot.py"])
def test_the_scripts_still_start(script):
    r = run_script(ROOT / "scripts" / script, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stderr[-2000:]
    if script == "load.py":
        assert "--burst N" in r.stdout


def test_identical_counts_an_answer_as_the_same_only_when_text_tokens_and_score_agree(tmp_path):
    """Two eval reports of the same two answers: one unchanged, one with a score moved by more
    than the tolerance; identical.py counts 1 of 2 and lists the one that differs."""
    def report(lp2: float) -> dict:
        return {"questions": [{"question": "q1", "answers_by_row": {"dense/token": {"text": "a", "n_tokens": 2, "logprob": -1.0},
                                                                     "dense/sequence": {"text": "b", "n_tokens": 3, "logprob": lp2}}}]}
    for name, lp2 in (("old_dev_paper.json", -2.0), ("new_dev_paper.json", -2.5)):
        (tmp_path / name).write_text(json.dumps(report(lp2)))
    out = tmp_path / "identical.json"
    r = run_script(ROOT / "scripts" / "identical.py", "--before", str(tmp_path / "old_{set}_{preset}.json"),
                   "--after", str(tmp_path / "new_{set}_{preset}.json"), "--sets", "dev", "--presets", "paper",
                   "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(out.read_text())
    assert [(row["answers"], row["identical"]) for row in got["rows"]] == [(2, 1)]
    assert [d["row"] for d in got["differ"]] == ["dense/sequence"]


def test_setup_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "setup.sh")], timeout=30).returncode == 0


@pytest.fixture(scope="module")
def load():
    """scripts/load.py as a module."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module("load")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_load_burst_reports_each_request_and_fails_when_one_fails(load, capsys):
    ok = {"i": 0, "question": "What is Mars?", "ok": True, "latency": 1.5, "answer": "A planet."}
    bad = {"i": 1, "question": "Who?", "ok": False, "latency": float("nan"), "error": "ConnectError: refused"}
    assert load.report_burst([ok], 2.0) == 0
    assert load.report_burst([ok, bad], 2.0) == 1
    out = capsys.readouterr().out
    assert "1.50 s" in out and "ConnectError: refused" in out and "1/2 answered" in out
    # nothing listens on port 9: every request fails at once, and --burst exits 1
    assert load.main(["--burst", "2", "--url", "http://127.0.0.1:9/", "--burst-timeout", "20"]) == 1
    assert "0/2 answered" in capsys.readouterr().out


def test_rerank_candidates_prints_every_rule_for_both_rows(exp, tiny_run, capsys):
    assert exp("rerank_candidates").main([str(tiny_run), "--tiny", "--channel"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {tiny_run} |")]
    for row in ("sequence|dense", "token|dense"):
        rules = [r[2] for r in rows if r[1] == row]
        assert rules == ["oracle", "length alpha 0", "length alpha 0.25", "length alpha 0.5", "length alpha 1", "type",
                         "channel lam 0.1", "channel lam 0.25", "channel lam 0.5", "channel lam 1"], rules
    contains = {(r[1], r[2]): float(r[5].rstrip(" |")) for r in rows}
    assert all(c <= contains[(row, "oracle")] for (row, _), c in contains.items())  # no rule beats the oracle


def test_token_misses_ranks_each_miss_and_puts_the_ranking_back(exp, tiny_run, capsys):
    import rag_demo.reader.drafts as drafts

    original = drafts.rank_by_rag_token
    run = json.loads(tiny_run.read_text(encoding="utf-8"))
    missed = [q for q in run["questions"]
              if q["answers_by_row"]["token|dense"]["hit"] and not q["answers_by_row"]["token|dense"]["contains"]]
    assert missed, "the random generator answered every question: nothing to rank"
    assert exp("token_misses").main([str(tiny_run), "--tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["question"] for r in rows] == [q["question"] for q in missed]
    for r, q in zip(rows, missed):
        assert r["gold"].strip().rstrip(".") in q["answers"] and r["chosen_lp"] <= 0 and r["gold_lp"] <= 0
    assert lines[-1].startswith(f"{len(rows)} misses ranked")
    assert drafts.rank_by_rag_token is original


def test_reader_variants_answers_resumes_and_tabulates(exp, tmp_path, capsys):
    rv = exp("reader_variants")
    from rag_demo.config import RagSettings
    from rag_demo.knowledge.corpus import Passage
    from rag_demo.models.chat_format import ChatFormat
    from rag_demo.reader.aided import prompt

    gen, s = exp("_shared").tiny_generator(), RagSettings(preset="paper")
    doc = Passage("p#0", "Paris", "Paris is the capital of France.")
    original = ChatFormat.messages
    with rv.answer_label(True):
        labelled = gen.tokenizer.decode(prompt(gen, "What is the capital of France?", doc, s.decoding, s.aids))
    assert "Question: What is the capital of France?\nShort answer:" in labelled
    assert ChatFormat.messages is original

    outs = {}
    for variant in ("answerlabel", "qfirst"):
        outs[variant] = tmp_path / f"{variant}.json"
        args = ["--tiny", "--files", "ext", "--n-ext", "2", "--k", "2", "--variant", variant, "--out", str(outs[variant])]
        assert rv.main(args) == 0
        report = json.loads(outs[variant].read_text(encoding="utf-8"))
        assert report["settings"]["question_position"] == ("both" if variant == "qfirst" else "after")
        assert set(report["summary"]) == {"ext|closed-book", "ext|sequence", "ext|token"}
        assert report["summary"]["ext|token"]["all"]["n"] == 2
    assert rv.main(args) == 0  # a rerun resumes: nothing left to answer
    assert len(outs["qfirst"].with_suffix(".jsonl").read_text(encoding="utf-8").splitlines()) == 2
    capsys.readouterr()

    table = exp("reader_variants_table")
    assert table.main([f"label*={outs['answerlabel'].with_suffix('.jsonl')}",
                       f"qfirst={outs['qfirst'].with_suffix('.jsonl')}"]) == 0
    out = capsys.readouterr().out
    assert "Questions every variant answered: 2" in out
    assert "| label (cut at '. ' or ',', simulated) | ext | token | 2 |" in out and "| qfirst | ext | sequence | 2 |" in out
    assert table.cut("Paris, France. It is", table.CUTS[2]) == "Paris"


def test_corpus_scale_measures_both_ways(exp, capsys):
    assert exp("corpus_scale").main(["--n", "500"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("500 passages")
    assert "| Arrow table, memory-mapped (cached_corpus) |" in out and "| list of Passage objects (pickle) |" in out


def test_memory_check_reports_rss(exp, capsys):
    assert exp("memory_check").main(["--one", "default", "--tiny", "--requests", "2", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "default: RSS after warm-up" in out and "after 2 requests on 2 threads" in out


def test_index_build_profile_reports_padding_stages_and_both_batchings(exp, capsys):
    assert exp("index_build_profile").main(["--tiny", "--passage-dtype", "float32"]) == 0
    out = capsys.readouterr().out
    pad = re.search(r"sorted by characters ([\d.]+)x, by tokens ([\d.]+)x", out)
    assert pad and 1.0 <= float(pad.group(2)) <= float(pad.group(1)), out  # token order never pads more
    assert "tokenising" in out and "forward + pooling" in out and "FAISS add" in out
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert {"characters", "tokens"} <= set(rows)
    # the same float32 vectors, whichever batching: rounding only (1e-5 as in test_encoders)
    assert float(rows["tokens"].rstrip(" |").rsplit(" | ", 1)[1]) <= 1e-5


@pytest.mark.slow
def test_rerank_candidates_counts_tokens_with_the_real_smollm2(exp, tiny_run, capsys):
    assert exp("rerank_candidates").main([str(tiny_run)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {tiny_run} |")]
    assert len(rows) == 2 * 6  # two rows, oracle + 4 length rules + type


def test_float32_profile_times_the_stages_and_bounds_the_model_calls(exp, capsys):
    assert exp("float32_profile").main(["--tiny", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert "GEMM float32:" in out and "GB/s at 10 rows" in out
    for mode in ("token", "sequence"):
        assert f"### {mode}: 1 questions" in out
    assert "| prefill > model body |" in out and "| drafts (each doc's search) > search > model body |" in out
    assert "| prefill: model body |" in out and "lower bound of the same calls on this CPU" in out


def test_question_pmi_scores_each_answer_with_and_without_its_question(exp, capsys):
    mod = exp("question_pmi")
    assert mod.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    assert "3 answers, 2 right" in out
    aurocs = [float(line.split(" | ")[1].rstrip(" |")) for line in out.splitlines() if line.startswith(("| lp_q", "| pmi"))]
    assert len(aurocs) == 2 and all(0.0 <= a <= 1.0 for a in aurocs)
    pipe = exp("_shared").tiny_pipeline()
    (row,) = mod.probe(pipe, [("What is the capital of France?", "Paris", 1.0)])
    assert row["pmi"] == row["lp_q"] - row["lp_0"] and row["lp_q"] < 0 and row["lp_0"] < 0


def test_off_subject_names_a_copy_from_a_passage_about_something_unasked(exp, capsys, tiny_run):
    mod = exp("off_subject")
    assert mod.off_subject("Who discovered penicillin?", "Howard Florey.", "Alexander Fleming")
    assert not mod.off_subject("Who discovered penicillin?", "Alexander Fleming.", "Alexander Fleming")  # the subject
    assert not mod.off_subject("Who discovered penicillin?", "Fleming.", "Alexander Fleming")  # part of it
    assert not mod.off_subject("When was Alexander Fleming born?", "1881.", "Alexander Fleming")  # the question names it
    assert not mod.off_subject("Who discovered penicillin?", "", "Alexander Fleming")
    rows = mod.answers(str(tiny_run), fitted_whole=True)
    assert {a["mode"] for a in rows} == {"sequence", "token"} and all(a["fitted"] for a in rows)
    assert mod.main([str(tiny_run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(rows)} RAG answers, {sum(a['off'] for a in rows)} off-subject")
    assert all(f"| {m} | " in out for m in ("sequence", "token")) and "| closed-book |" not in out


def test_cue_signals_reads_each_answers_type_and_support_and_compares_the_cue(exp, capsys):
    mod = exp("cue_signals")
    assert mod.type_fit("When did the war end?", "1945.") == 1.0
    assert mod.type_fit("When did the war end?", "The treaty.") == -1.0
    assert mod.type_fit("Who painted it?", "Vincent van Gogh") == 1.0 and mod.type_fit("Who painted it?", "a man") == -1.0
    assert mod.type_fit("What is jazz?", "music") == 0.0
    passages = [("Paris", "Paris is the capital of France. It has a river."), ("Rome", "Rome is old.")]
    got = mod.support("What is the capital of France?", "Paris", passages, [0.7, 0.3])
    assert got == {"support": 1.0, "answer_mass": 0.7}  # "capital" and "france" both in Paris's sentence
    assert mod.support("What is the capital of France?", "Lyon", passages, [0.7, 0.3]) == {"support": 0.0,
                                                                                            "answer_mass": 0.0}
    assert mod.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    assert "aided sequence: 12 answerable answers, 6 right" in out and "logprob+type_fit+support+answer_mass" in out


def _answers(n: int, separable: bool, seed: int = 0):
    """n answerable and 3n unanswerable answers with one signal, log p: for the right ones drawn
    well above the wrong ones (`separable`) or from the same spread."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(4 * n):
        answerable = i < n
        right = int(rng.random() < (0.5 if answerable else 0.1))
        lp = (-1.0 if right else -6.0) if separable else -3.0
        rows.append({"question_id": f"q{i}", "answerable": answerable, "contains": float(right),
                     "signals": {"logprob": lp + rng.normal(0, 0.5 if separable else 2.0)}})
    return pd.DataFrame(rows)


def test_cue_enlarged_reads_the_cue_on_held_out_answerable_halves(exp):
    mod = exp("cue_enlarged")
    clear = mod.summary(mod.held_out_halves(_answers(40, True), ("logprob",), "answerable", 0.2, reps=4))
    assert clear["recall"][0] > 0.9 and clear["right_flagged"][0] <= 0.2 and clear["holds"] == 1.0
    blind = mod.summary(mod.held_out_halves(_answers(40, False), ("logprob",), "mix", 0.2, reps=4))
    assert blind["holds"] < 1.0 and blind["recall"][0] < 0.5  # a signal that says nothing cannot meet the bar


def test_passage_pmi_teacher_forces_the_answer_under_the_closed_book_prompt(exp, tmp_path):
    """closed_logprob agrees with the same tokens read as the end of one prompt (the prefill's own
    log-probs, another code path), and with_pmi subtracts it from the answer's log p per answer."""
    import pandas as pd

    from rag_demo.config import RagSettings
    from rag_demo.reader.reading import prompt, question_read

    mod = exp("passage_pmi")
    pipe = exp("_shared").tiny_pipeline()
    question, answer = "Who painted The Starry Night?", "Vincent van Gogh"
    lp, n = mod.closed_logprob(pipe, "aided", question, answer)
    s = RagSettings(preset="aided")
    gen = pipe.stack.modes["closed-book"].generator
    ids = gen.tokenizer.encode(answer, add_special_tokens=False)
    cb = prompt(gen, question_read(s.aids, question), None, s.decoding, s.aids)
    _, state = gen.prefill([cb + ids], keep_prompt_logprobs=len(ids))
    assert n == len(ids) and lp == pytest.approx(float(state.prompt_lp.sum()), abs=1e-3)  # float32 logits
    assert lp < 0 and mod.closed_logprob(pipe, "aided", question, answer + " and friends")[0] < lp
    scores = tmp_path / "scores.jsonl"
    scores.write_text("\n".join(json.dumps({"preset": "aided", "question_id": q, "answer": "x", "closed_logprob": c,
                                             "n": 2, "verify": 0.5}) for q, c in (("a", -7.0), ("b", -80.0))))
    rows = pd.DataFrame([{"preset": "aided", "question_id": q, "answer": "x", "signals": {"logprob": lp_}}
                         for q, lp_ in (("a", -3.0), ("b", -60.0))])
    got = mod.with_pmi(rows, str(scores))["signals"].tolist()
    assert [g["pmi"] for g in got] == [4.0, 0.0] and got[0]["pmi_mean"] == 2.0  # both floored at -50 for "b"


def test_int8_generator_measures_each_variant_against_float32(exp, capsys):
    assert exp("int8_generator").main(["--tiny", "--n", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| generator")]
    assert [r.split(" | ")[0][2:] for r in rows] == ["float32", "bfloat16", "float32, BLAS linear layers (not oneDNN)",
                                                     *exp("int8_generator").VARIANTS]
    assert rows[0].split(" | ")[1:3] == ["0", "100.0%"]  # float32 against itself
    assert float(rows[3].split(" | ")[1]) > 0  # every layer in int8 really moved the distributions


def test_linear_kernels_times_both_kernels_on_the_same_weights(exp, capsys):
    assert exp("linear_kernels").main(["--tiny"]) == 0
    out = capsys.readouterr().out
    gemm = [line for line in out.splitlines() if line.startswith("| 576 -> 1536 |") or line.startswith("| 1536 -> 576 |")]
    assert len(gemm) == 4 and all(float(r.split(" | ")[2]) > 0 and float(r.split(" | ")[3]) > 0 for r in gemm), gemm
    assert "| prefill, 5 x 160 tokens |" in out and "| decoding step, 10 rows |" in out
    diff = float(re.search(r"largest log-prob difference, MKL against oneDNN: (\S+)", out).group(1))
    assert diff < 1e-3  # the same function, the products summed in another order


def test_load_summary_reports_what_the_generator_kept_against_its_bound(load, capsys):
    kept = lambda b: {"passages": {"bytes": b, "max_bytes": 2**29}, "hidden_states": {"bytes": 2**20, "max_bytes": 2**26}}  # noqa: E731
    results = [{"kind": "cheap", "ok": True, "latency": 1.0, "stopped": {}, "kept": [kept(2**27), kept(2**28)]},
               {"kind": "cheap", "ok": True, "latency": 2.0, "stopped": {}, "kept": [kept(3 * 2**28)]}]
    out = load.summary("mixed 2", results, None)
    assert out["kept"] == {"passages": (3 * 2**28, 2**29), "hidden_states": (2**20, 2**26)}
    line = capsys.readouterr().out
    assert line.strip().startswith("mixed 2: cheap 2/2 answered")
    assert "passages kept 768.0 MiB of 512 (OVER the bound)" in line
    assert "hidden states kept 1.0 MiB of 64 (within the bound)" in line
