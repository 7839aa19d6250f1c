"""RagPipeline end to end on the paper stack's loading code with tiny random checkpoints,
bad input, and the command line. (Real offline models: test_e2e.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_demo.config import MAX_QUESTION_CHARS, RagSettings
from rag_demo.models.stack_spec import StackSpec
from rag_demo.knowledge.corpus import Corpus, corpus_from_documents
from rag_demo.pipeline import RagPipeline
from rag_demo.models.random_models import fixture_passages

ROOT = Path(__file__).resolve().parents[1]


def _spec(tiny_ckpts, cache: Path) -> StackSpec:
    return StackSpec(name="paper", rag_token=str(tiny_ckpts["rag_token"]), rag_sequence=str(tiny_ckpts["rag_sequence"]),
                     ctx_encoder=str(tiny_ckpts["ctx_encoder"]), cache_dir=cache)


def _corpus() -> Corpus:
    return corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()])


@pytest.fixture(scope="module")
def pipe(tiny_ckpts, tmp_path_factory):
    return RagPipeline.load(_spec(tiny_ckpts, tmp_path_factory.mktemp("cache")), corpus=_corpus(),
                            settings=RagSettings(preset="aided", k=3, max_new_tokens=6))


def test_answer_structure_all_modes(pipe):
    out = pipe.answers("who painted the starry night", ["sequence", "token", "closed-book"],
                            sequence_decoding="thorough")
    # Priors and posteriors are float32 softmaxes over K = 3 docs: they sum to 1 within a few ulps
    # (6e-8 measured); 1e-6 leaves margin for other CPUs, a missing normalisation is off by O(1).
    for mode in ("sequence", "token"):
        a = out[mode]
        assert a.mode == mode and a.stack == "paper" and a.corpus == "fixture"
        assert len(a.docs) == 3 and [d.rank for d in a.docs] == [1, 2, 3]
        assert sum(d.prior for d in a.docs) == pytest.approx(1.0, abs=1e-6)
        assert a.docs[0].score >= a.docs[1].score >= a.docs[2].score
        assert len(a.token_doc_posteriors) == len(a.tokens) == len(a.token_ids)
        for row in a.token_doc_posteriors:
            assert len(row) == 3 and sum(row) == pytest.approx(1.0, abs=1e-6)
        assert sum(a.doc_posterior) == pytest.approx(1.0, abs=1e-6)
        assert set(a.timings) == {"encode", "retrieve", "generate", "attribute", "total"}
        assert a.sequence_logprob < 0
        json.dumps(a.to_dict())  # serialisable as the CLI's --json
    # thorough decoding lists its candidates; the answer is the best-scored one (the same float, copied)
    assert max(c["logprob"] for c in out["sequence"].candidates) == out["sequence"].sequence_logprob
    cb = out["closed-book"]
    assert cb.docs == [] and cb.token_doc_posteriors == [] and cb.timings["retrieve"] == 0.0


def test_candidates_come_best_first_one_a_text(pipe):
    """Answer.candidates is shown as a ranked list: sorted by score, the winner first, and two
    token sequences that decode to the same words shown once (the better), which the engine's
    Generation.candidates keeps apart. The table below puts a worse duplicate and a better
    candidate out of order, as the engine may list them."""
    from rag_demo.rag.engine import Generation
    from rag_demo.answer import ranked_candidates
    from rag_demo.reader.drafts import UPPER_BOUNDS
    gen = pipe.stack.modes["token"].generator
    a, b = gen.tokenizer.encode(" Paris", add_special_tokens=False), gen.tokenizer.encode(" Rome", add_special_tokens=False)
    g = Generation(b, -1.0, "test", None, None, candidates=[(a, -3.0), (b, -1.0), (a + [], -2.0), (b, -4.0)],
                   extras={UPPER_BOUNDS: {0}})
    out = ranked_candidates(gen, g)
    assert [(c["text"].strip(), c["logprob"]) for c in out] == [("Rome", -1.0), ("Paris", -2.0)]
    assert "upper_bound" not in out[1]  # the kept Paris is the exact one, not the bounded -3.0
    for mode in ("sequence", "token"):  # on a real answer: best first, the answer's own text first
        ans = pipe.answer("who painted the starry night", mode)
        scores = [c["logprob"] for c in ans.candidates]
        assert scores == sorted(scores, reverse=True) and ans.candidates[0]["text"] == ans.text
        assert len({c["text"].strip() for c in ans.candidates}) == len(ans.candidates)


def test_each_paper_mode_uses_its_own_question_encoder(pipe):
    m = pipe.stack.modes
    assert m["token"].question_encoder is not m["sequence"].question_encoder
    assert m["token"].generator is not m["sequence"].generator


def test_per_call_overrides_fall_back_to_settings(pipe):
    a = pipe.answer("what is the capital of france", "token", k=2)
    assert len(a.docs) == 2
    b = pipe.answer("what is the capital of france", "token")
    assert len(b.docs) == pipe.settings.decoding.k == 3


def test_second_load_reuses_cached_index(tiny_ckpts, tmp_path):
    spec = _spec(tiny_ckpts, tmp_path)
    first = RagPipeline.load(spec, corpus=_corpus())
    second = RagPipeline.load(spec, corpus=_corpus())
    assert first.index_info.source == "built" and second.index_info.source == "cache"


def test_hot_swap_changes_the_passages_not_the_models(pipe):
    other = corpus_from_documents("swap", [("Mars", "Mars is the fourth planet from the sun.", None),
                                          ("Venus", "Venus is the second planet from the sun.", None)])
    swapped = pipe.with_corpus(other)
    a = swapped.answer("what is the fourth planet", "token", k=2)
    assert {d.title for d in a.docs} == {"Mars", "Venus"} and a.corpus == "swap"
    assert swapped.stack is pipe.stack and pipe.index.corpus.name == "fixture"


@pytest.mark.parametrize("question, fragment", [
    ("", "question is empty"),
    ("   \n\t ", "question is empty"),
    ("x" * (MAX_QUESTION_CHARS + 1), f"limit of {MAX_QUESTION_CHARS}"),
])
def test_bad_questions(pipe, question, fragment):
    with pytest.raises(ValueError, match=fragment):
        pipe.answer(question, "token")


@pytest.mark.parametrize("k", [0, -1, 21])
def test_k_out_of_range(pipe, k):
    with pytest.raises(ValueError, match=r"k=.*out of range.*1 to 20"):
        pipe.answer("who painted the starry night", "token", k=k)


def test_k_larger_than_corpus(pipe):
    with pytest.raises(ValueError, match=r"k=5 is more than the 3 passages.*choose k from 1 to 3"):
        pipe.answer("who painted the starry night", "token", k=5)


def test_unknown_mode(pipe):
    with pytest.raises(ValueError, match=r"mode='tokens' is unknown: use one of sequence, token, closed-book"):
        pipe.answer("who painted the starry night", "tokens")


def test_unknown_stack():
    with pytest.raises(ValueError, match=r"stack='gpt' is unknown: use one of offline, paper"):
        StackSpec(name="gpt")


def test_unknown_generator_dtype():
    with pytest.raises(ValueError, match=r"generator_dtype='fp16' is unknown: use one of auto, float32, bfloat16"):
        StackSpec(generator_dtype="fp16")
    with pytest.raises(ValueError, match=r"passage_dtype='half' is unknown: use one of auto, float32, bfloat16"):
        StackSpec(passage_dtype="half")


def test_passage_dtype_reaches_the_encoders(tmp_path: Path):
    """--passage-dtype goes CLI -> StackSpec; a worker's EncoderRef loads its encoder in that dtype."""
    import torch

    from rag_demo.cli import _spec, build_parser
    from rag_demo.knowledge.shards import EncoderRef
    from rag_demo.models.stacks import resolve_dtype

    args = build_parser().parse_args(["index", "--passage-dtype", "bfloat16", "--cache-dir", str(tmp_path)])
    assert _spec(args).passage_dtype == "bfloat16"
    assert build_parser().parse_args(["index"]).passage_dtype is None and StackSpec().passage_dtype == "auto"
    assert EncoderRef(passage_dtype="bfloat16").load().passage_dtype is torch.bfloat16
    assert EncoderRef().load().passage_dtype is torch.float32
    with pytest.raises(ValueError, match="dtype 'fp8' is unknown: use auto, float32 or bfloat16"):
        resolve_dtype("fp8")


def test_generator_dtype_resolution():
    import torch

    from rag_demo.models.stacks import cpu_has_native_bf16, resolve_dtype

    assert resolve_dtype("float32") is torch.float32 and resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("auto") is (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # the probe agrees with the kernel's CPU flags
        flags = set(next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")).split())
        assert cpu_has_native_bf16() == bool(flags & {"amx_tile", "avx512_bf16"})


def test_unknown_setting(pipe):
    with pytest.raises(ValueError, match="unknown setting"):
        pipe.answer("who painted the starry night", "token", beams=2)


def test_empty_corpus(pipe):
    with pytest.raises(ValueError, match="the corpus is empty"):
        pipe.with_corpus(Corpus("nothing", []))
    with pytest.raises(ValueError, match="the corpus is empty"):
        corpus_from_documents("blank", [("t", "   ", None)])


def test_paper_stack_without_hub_fails_fast(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"paper stack needs the Hugging Face Hub.*--stack offline"):
        RagPipeline.load(StackSpec(name="paper", cache_dir=tmp_path), corpus=_corpus())
    assert time.perf_counter() - t0 < 10


def _cli(*args, cache: Path):
    env = {"HF_HUB_OFFLINE": "1", "RAG_DEMO_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "rag_demo", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def test_cli_paper_stack_json_and_table(tiny_ckpts, tmp_path):
    """The CLI on the tiny paper checkpoints: `ask --json` is an Answer per mode; the text
    output has the attribution table; the second run loads the index from cache."""
    corpus_file = tmp_path / "docs.jsonl"
    corpus_file.write_text("\n".join(json.dumps({"title": t, "text": x}) for t, x in fixture_passages()))
    common = ["--stack", "paper", "--rag-token", str(tiny_ckpts["rag_token"]), "--rag-sequence",
              str(tiny_ckpts["rag_sequence"]), "--ctx-encoder", str(tiny_ckpts["ctx_encoder"]),
              "--corpus-file", str(corpus_file), "--k", "2", "--max-new-tokens", "4"]
    r = _cli("ask", "who painted the starry night", "--mode", "all", "--json", *common, cache=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"sequence", "token", "closed-book"}
    assert len(data["token"]["docs"]) == 2 and "token_doc_posteriors" in data["token"]
    assert "built and cached" in r.stderr
    r = _cli("ask", "who painted the starry night", "--mode", "token", *common, cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "loaded from cache" in r.stderr
    assert "Passages:" in r.stdout and "Attribution p(z | x, y_i, y_<i)" in r.stdout


def test_cli_bad_input_exits_2_with_message(tmp_path):
    r = _cli("ask", "  ", "--mode", "token", cache=tmp_path)
    assert r.returncode == 2 and "question is empty" in r.stderr
    r = _cli("ask", "hi", "--mode", "tokenz", cache=tmp_path)
    assert r.returncode == 2 and "mode='tokenz' is unknown" in r.stderr
    r = _cli("ask", "hi", "--k", "0", cache=tmp_path)
    assert r.returncode == 2 and "k=0 is out of range" in r.stderr
    # refused before the models, or even torch, load: a typo costs no wait
    probe = ("import sys; from rag_demo.cli import main; code = main(['ask', 'hi', '--k', '0']); "
             "print(code, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr[-1000:])


def test_hub_probe_is_bounded_even_when_the_lookup_hangs(monkeypatch):
    import socket

    from rag_demo.models.hub import hub_unavailable_reason

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    def hanging_lookup(*args, **kwargs):  # a DNS lookup that hangs, then gives up
        time.sleep(10)
        raise OSError("lookup gave up")

    monkeypatch.setattr(socket, "create_connection", hanging_lookup)
    t0 = time.perf_counter()
    reason = hub_unavailable_reason(0.5)
    assert time.perf_counter() - t0 < 2
    assert reason == "huggingface.co did not answer within 0.5 s"
