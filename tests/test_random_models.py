"""Random RAG checkpoints: built offline, saved in the Hub's format, and loaded back unchanged.

Everything here runs on the "tiny" size (a build takes well under a second).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # these tests must never reach the Hub

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    DPRContextEncoder,
    RagSequenceForGeneration,
    RagTokenForGeneration,
    RagTokenizer,
)

from rag_demo.models import random_models as rm  # noqa: E402

N_DOCS = 3


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("random_rag")


@pytest.fixture(scope="module")
def paths(ckpt_root) -> dict[str, Path]:
    return rm.make_random_rag_checkpoints(ckpt_root, size="tiny", seed=0, n_docs=N_DOCS)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_clean(load, path: Path):
    """Load with output_loading_info and a handler on the (non-propagating) transformers logger;
    fail on any missing / unexpected / mismatched weight or a v5 "LOAD REPORT" warning."""
    handler = _Records()
    root = logging.getLogger("transformers")
    root.addHandler(handler)
    try:
        model, info = load(path, output_loading_info=True)
    finally:
        root.removeHandler(handler)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    bad = [m for m in handler.messages if "LOAD REPORT" in m or "newly initialized" in m or "MISSING" in m]
    assert not bad, bad
    return model.eval()


@pytest.fixture(scope="module")
def loaded(paths):
    return {
        "rag_token": _load_clean(RagTokenForGeneration.from_pretrained, paths["rag_token"]),
        "rag_sequence": _load_clean(RagSequenceForGeneration.from_pretrained, paths["rag_sequence"]),
        "ctx_encoder": _load_clean(DPRContextEncoder.from_pretrained, paths["ctx_encoder"]),
    }


def test_layout_matches_the_hub(paths):
    assert set(paths) == {"rag_token", "rag_sequence", "ctx_encoder"}
    for key in ("rag_token", "rag_sequence"):
        p = paths[key]
        assert p.name == key.replace("_", "-") + "-tiny"
        assert (p / "config.json").is_file() and (p / "model.safetensors").is_file()
        assert (p / "question_encoder_tokenizer" / "vocab.txt").is_file()
        assert (p / "generator_tokenizer" / "vocab.json").is_file()
        assert (p / "generator_tokenizer" / "merges.txt").is_file()
        assert (p / rm.MARKER).is_file()
    assert paths["ctx_encoder"].name == "dpr-ctx-tiny"
    assert (paths["ctx_encoder"] / "vocab.txt").is_file()


def test_reloaded_classes_and_configs(loaded):
    tok, seq, ctx = loaded["rag_token"], loaded["rag_sequence"], loaded["ctx_encoder"]
    assert type(tok) is RagTokenForGeneration and type(seq) is RagSequenceForGeneration
    assert type(ctx) is DPRContextEncoder
    for m in (tok, seq):
        assert m.config.n_docs == N_DOCS
        assert m.config.retrieval_vector_size == m.config.question_encoder.hidden_size == 32
        g = m.config.generator
        assert (g.bos_token_id, g.pad_token_id, g.eos_token_id, g.decoder_start_token_id) == (0, 1, 2, 2)
        assert g.forced_eos_token_id is None
        assert m.rag.generator.generation_config.forced_eos_token_id is None
        assert next(m.parameters()).dtype == torch.float32
    assert tok.generation_config.forced_eos_token_id is None
    assert getattr(tok.generation_config, "forced_bos_token_id", None) is None
    assert ctx.config.hidden_size == 32


def test_weights_equal_a_fresh_build(loaded):
    """Reloaded weights == the model the factory builds (same seed), and they are random."""
    q_tok, g_tok = rm.build_tokenizers()
    q_cfg, g_cfg = rm.dpr_config("tiny", len(q_tok)), rm.bart_config("tiny", len(g_tok))
    fresh = rm._seeded(lambda: RagTokenForGeneration(rm.rag_config(q_cfg, g_cfg, N_DOCS)), 0)
    want, got = fresh.state_dict(), loaded["rag_token"].state_dict()
    assert set(want) == set(got)
    # Stored tensors, compared bitwise: both sides are the same seeded RNG draws made in this
    # process (no summed arithmetic a CPU kernel could reorder), one of them saved to safetensors
    # and read back, which is exact for float32.
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    emb = got["rag.generator.model.shared.weight"]
    assert emb.std() > 1e-3  # not the all-zeros / all-ones of a skipped init (0.02 measured: init std)
    q_emb = got["rag.question_encoder.question_encoder.bert_model.embeddings.word_embeddings.weight"]
    assert q_emb.std() > 1e-3
    ctx = rm._seeded(lambda: DPRContextEncoder(q_cfg), 2).state_dict()
    for name, value in loaded["ctx_encoder"].state_dict().items():
        torch.testing.assert_close(value, ctx[name], rtol=0, atol=0, msg=name)


def test_the_two_rag_checkpoints_differ(loaded):
    ids = torch.tensor([[0, 10, 20, 30, 2]] * N_DOCS)
    dec = torch.tensor([[2, 0, 40]] * N_DOCS)
    with torch.no_grad():
        a = loaded["rag_token"].rag.generator(input_ids=ids, decoder_input_ids=dec).logits
        b = loaded["rag_sequence"].rag.generator(input_ids=ids, decoder_input_ids=dec).logits
    assert a.shape == b.shape == (N_DOCS, 3, loaded["rag_token"].config.generator.vocab_size)
    assert (a - b).abs().max() > 1e-3  # 0.56 measured; identical weights would give 0 (or float noise < 1e-5)


def test_tokenizers_round_trip(paths):
    rag_tok = RagTokenizer.from_pretrained(paths["rag_token"])
    gen_ids = rag_tok.generator("the starry night")["input_ids"]
    assert gen_ids[0] == 0 and gen_ids[-1] == 2
    hello = rag_tok.generator("hello world")["input_ids"]
    assert hello[0] == 0 and hello[-1] == 2 and len(hello) > 2  # like BART: <s> ... </s>
    assert rag_tok.generator.decode(gen_ids, skip_special_tokens=True) == "the starry night"
    assert rag_tok.generator.convert_tokens_to_ids("<mask>") == len(rag_tok.generator) - 1

    q = rag_tok.question_encoder("Who painted the Starry Night?")["input_ids"]
    assert q[0] == rag_tok.question_encoder.cls_token_id and q[-1] == rag_tok.question_encoder.sep_token_id
    assert rag_tok.question_encoder.pad_token_id == 0
    assert rag_tok.question_encoder.unk_token_id not in q  # the built-in text covers the question

    q_auto = AutoTokenizer.from_pretrained(paths["rag_token"] / "question_encoder_tokenizer")
    assert q_auto("WHO painted the starry night?")["input_ids"] == q  # lowercased, like DPR
    ctx_tok = AutoTokenizer.from_pretrained(paths["ctx_encoder"])
    assert ctx_tok.get_vocab() == rag_tok.question_encoder.get_vocab()
    assert type(ctx_tok).__name__.startswith("DPRContextEncoderTokenizer")


def test_tokenizers_are_deterministic(tmp_path):
    q1, g1 = rm.build_tokenizers(tmp_path)
    rm._trained_vocabs.cache_clear()  # really retrain
    q2, g2 = rm.build_tokenizers(None)
    assert q1.get_vocab() == q2.get_vocab() and g1.get_vocab() == g2.get_vocab()
    assert 400 <= len(q1) <= 1000 and 400 <= len(g1) <= 1000
    assert (tmp_path / "question_encoder_tokenizer").is_dir() and (tmp_path / "generator_tokenizer").is_dir()


def test_legacy_vocab_files_load_the_same(paths, tmp_path):
    """The Hub RAG folders ship vocab.txt / vocab.json+merges.txt, not tokenizer.json: a copy
    with only those files must encode exactly like ours."""
    src = paths["rag_token"]
    shutil.copy(src / "config.json", tmp_path / "config.json")
    for sub in ("question_encoder_tokenizer", "generator_tokenizer"):
        shutil.copytree(src / sub, tmp_path / sub)
        (tmp_path / sub / "tokenizer.json").unlink()
    ours, legacy = RagTokenizer.from_pretrained(src), RagTokenizer.from_pretrained(tmp_path)
    for text in ["Who painted The Starry Night?", "when did the apollo 11 land on the moon", "zebra 42!"]:
        assert ours.question_encoder(text)["input_ids"] == legacy.question_encoder(text)["input_ids"]
        assert ours.generator(text)["input_ids"] == legacy.generator(text)["input_ids"]


def test_idempotent_and_rebuilds_stale(paths, ckpt_root):
    files = {k: p / "model.safetensors" for k, p in paths.items()}
    before = {k: f.stat().st_mtime_ns for k, f in files.items()}
    again = rm.make_random_rag_checkpoints(ckpt_root, size="tiny", seed=0, n_docs=N_DOCS)
    assert again == paths
    assert {k: f.stat().st_mtime_ns for k, f in files.items()} == before

    # a folder without its marker (an interrupted build) is rebuilt, and only that one
    (paths["ctx_encoder"] / rm.MARKER).unlink()
    rm.make_random_rag_checkpoints(ckpt_root, size="tiny", seed=0, n_docs=N_DOCS)
    after = {k: f.stat().st_mtime_ns for k, f in files.items()}
    assert after["rag_token"] == before["rag_token"] and after["rag_sequence"] == before["rag_sequence"]
    assert json.loads((paths["ctx_encoder"] / rm.MARKER).read_text())["seed"] == 0
    assert not [p for p in ckpt_root.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_other_seed_gives_other_weights(tmp_path, loaded):
    other = rm.make_random_rag_checkpoints(tmp_path, size="tiny", seed=7, n_docs=N_DOCS)
    m = RagTokenForGeneration.from_pretrained(other["rag_token"])
    name = "rag.generator.model.shared.weight"
    assert not torch.equal(m.state_dict()[name], loaded["rag_token"].state_dict()[name])


def test_unknown_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="size"):
        rm.make_random_rag_checkpoints(tmp_path, size="huge")


def test_fixture_passages():
    passages = rm.fixture_passages()
    assert len(passages) == 3 and len({t for t, _ in passages}) == 3
    q_tok, _ = rm.build_tokenizers()
    for title, text in passages:
        assert 30 <= len(text.split()) <= 60
        assert q_tok.unk_token_id not in q_tok(title, text)["input_ids"]


def _contexts(rag_tok: RagTokenizer, config, question: str) -> dict[str, torch.Tensor]:
    # the reference's doc format: title / text // question, one row per doc
    docs = [f"{t}{config.title_sep}{x}{config.doc_sep}{question}" for t, x in rm.fixture_passages()]
    return rag_tok.generator(docs, padding=True, truncation=True, return_tensors="pt")  # (K, L)


@pytest.mark.parametrize("kind", ["rag_token", "rag_sequence"])
def test_generate_smoke(paths, loaded, kind):
    model = loaded[kind]
    rag_tok = RagTokenizer.from_pretrained(paths[kind])
    ctx = _contexts(rag_tok, model.config, "who painted the starry night")
    doc_scores = torch.tensor([[3.0, 1.0, 0.5]])  # (B=1, K=3)
    with torch.no_grad():
        out = model.generate(context_input_ids=ctx["input_ids"], context_attention_mask=ctx["attention_mask"],
                             doc_scores=doc_scores, n_docs=N_DOCS, max_new_tokens=5)
    assert out.shape[0] == 1 and 2 <= out.shape[1] <= 1 + 5
    assert out[0, 0].item() == model.config.generator.decoder_start_token_id
    assert int(out.min()) >= 0 and int(out.max()) < len(rag_tok.generator)
    rag_tok.batch_decode(out, skip_special_tokens=True)  # decodes without error
