"""Encoders: MiniLM parity with sentence-transformers and a retrieval sanity check; DPR wrappers on
tiny random models; the paper stack failing fast without the Hub."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from rag_demo.knowledge.corpus import Passage, load_vital_articles
from rag_demo.models.encoders import DPRPassageEncoder, DPRQuestionEncoder, MiniLMEncoder, minilm_path

GRANDE_JATTE = "A Sunday Afternoon on the Island of La Grande Jatte"
VOCAB = "the a of is in who painted seurat paris capital france city river seine grande jatte island sunday".split()


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return load_vital_articles(limit=40).passages[:30]


# ---------------------------------------------------------------- MiniLM


def test_minilm_matches_sentence_transformers(minilm: MiniLMEncoder, passages: list[Passage]):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_path()), device="cpu")
    questions = ["Who painted A Sunday Afternoon on the Island of La Grande Jatte?", "What is jazz?", "word " * 400]
    ours = minilm.encode_questions(questions)
    assert ours.shape == (3, 384) and ours.dtype == np.float32 and ours.flags["C_CONTIGUOUS"]
    # Same float32 model, other batching (sentence-transformers sorts by length, so rows are padded
    # differently): matmul reordering only, 1.5e-8 (questions) and 8.2e-8 (passages) measured on
    # unit vectors (entries <= 0.21) on an AVX2 EPYC. 1e-5 abs leaves room for other CPUs' kernels;
    # CLS pooling or a missing normalisation moves entries by > 0.19 (measured).
    np.testing.assert_allclose(ours, st.encode(questions, normalize_embeddings=True), rtol=0, atol=1e-5)
    texts = [f"{p.title}: {p.text}" for p in passages]
    np.testing.assert_allclose(
        minilm.encode_passages(passages, batch_size=8), st.encode(texts, normalize_embeddings=True), rtol=0, atol=1e-5
    )


def test_minilm_passages_keep_input_order_and_report_progress(minilm: MiniLMEncoder, passages: list[Passage]):
    calls: list[tuple[int, int]] = []
    batched = minilm.encode_passages(
        passages[:10], batch_size=4, progress=lambda done, total: calls.append((done, total))
    )
    one_by_one = np.concatenate([minilm.encode_passages([p]) for p in passages[:10]])
    # padded batch vs one row: float32 reordering, 6.7e-8 measured (as above, 1e-5 for other CPUs;
    # two passages' vectors differ by > 0.11, so rows out of order fail)
    np.testing.assert_allclose(batched, one_by_one, rtol=0, atol=1e-5)
    # unit vectors: a float32 norm is 1 within a few ulps (6e-8 measured); unnormalised would be O(1) off
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, rtol=0, atol=1e-5)
    assert calls == [(4, 10), (8, 10), (10, 10)]
    assert minilm.encode_passages([]).shape == (0, 384)
    assert minilm.encode_questions([]).shape == (0, 384)
    with pytest.raises(ValueError, match="batch_size=0"):
        minilm.encode_passages(passages, batch_size=0)


def test_minilm_batches_by_token_count_and_keeps_input_order(minilm: MiniLMEncoder, passages: list[Passage],
                                                              monkeypatch: pytest.MonkeyPatch):
    """Batches are formed by tokens, not characters: "a, b, c, ..." is short in characters and long
    in tokens, so it is embedded first; and the vectors come back in input order, equal to one
    passage at a time (float32: padding changes only the rounding, as above)."""
    dense = Passage("dense#0", "Dense", "a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u, v, w, x")
    airy = Passage("airy#0", "Airy", "interconnectedness " * 4)
    assert len(dense.text) < len(airy.text) and minilm.passage_lengths([dense])[0] > minilm.passage_lengths([airy])[0]
    batch = [airy, *passages[:6], dense]
    seen: list[str] = []
    real = type(minilm)._passages_batch
    monkeypatch.setattr(minilm, "_passages_batch", lambda ps: (seen.extend(p.id for p in ps), real(minilm, ps))[1])
    got = minilm.encode_passages(batch, batch_size=2, show_bar=False)  # (8, D)
    lengths = minilm.passage_lengths(batch)
    assert [lengths[[p.id for p in batch].index(i)] for i in seen] == sorted(lengths, reverse=True)
    assert seen.index(dense.id) < seen.index(airy.id)
    monkeypatch.undo()
    one_by_one = np.concatenate([minilm.encode_passages([p], show_bar=False) for p in batch])
    np.testing.assert_allclose(got, one_by_one, rtol=0, atol=1e-5)


def test_minilm_retrieves_seurat_for_the_grande_jatte_question(minilm: MiniLMEncoder):
    titles = [
        GRANDE_JATTE,
        "Georges Seurat",
        "Mona Lisa",
        "The Starry Night",
        "Vincent van Gogh",
        "Claude Monet",
        "Impressionism",
        "Pablo Picasso",
        "Paris",
        "Leonardo da Vinci",
    ]
    corpus = [p for p in load_vital_articles().passages if p.title in titles]
    d = minilm.encode_passages(corpus)  # (N, D)
    q = minilm.encode_questions(["Who painted A Sunday Afternoon on the Island of La Grande Jatte?"])  # (1, D)
    ranked = [corpus[i].title for i in np.argsort(-(d @ q[0]))]
    assert set(ranked[:2]) == {GRANDE_JATTE, "Georges Seurat"}, ranked


def test_minilm_fingerprint(minilm: MiniLMEncoder, tmp_path: Path):
    fp = minilm.fingerprint()
    assert len(fp) == 64 and fp == MiniLMEncoder().fingerprint()
    for f in minilm_path().iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "model.safetensors").symlink_to(minilm_path() / "model.safetensors")
    copy = MiniLMEncoder(tmp_path)
    assert copy.fingerprint() == fp  # same files, other place
    (tmp_path / "config.json").write_text((tmp_path / "config.json").read_text().replace('"gelu"', '"gelu_new"'))
    assert MiniLMEncoder(tmp_path).fingerprint() != fp


def test_minilm_bfloat16_passages_stay_close_to_float32(minilm: MiniLMEncoder, passages: list[Passage]):
    """passage_dtype bfloat16 runs the forward under bfloat16 autocast. Over all 11,485 Vital
    Articles passages its vectors were at cosine >= 0.99996 to float32's (AVX512-BF16 EPYC);
    casting the weights to bfloat16 instead gave 0.9968 at the 1st percentile, which 0.9999 here
    rejects. Questions stay float32: the same vectors as the float32 encoder's."""
    bf = MiniLMEncoder(passage_dtype=torch.bfloat16)
    v32, v16 = minilm.encode_passages(passages, show_bar=False), bf.encode_passages(passages, show_bar=False)  # (N, D)
    assert v16.dtype == np.float32 and v16.shape == v32.shape
    cos = (v32 * v16).sum(1) / np.linalg.norm(v16, axis=1)  # (N,) v32 rows are unit vectors
    assert cos.min() >= 0.9999, cos.min()
    assert not np.array_equal(v32, v16)  # it did compute in bfloat16
    q = ["Who painted A Sunday Afternoon on the Island of La Grande Jatte?"]
    np.testing.assert_allclose(bf.encode_questions(q), minilm.encode_questions(q), atol=1e-6)


def test_passage_dtype_keys_the_index_cache(minilm: MiniLMEncoder):
    """float32 keeps the fingerprint indexes had before the setting existed; bfloat16 vectors
    get their own key, so an index is never reused across precisions."""
    from rag_demo.models.encoders import MAX_TOKENS, folder_fingerprint

    before = folder_fingerprint(minilm_path(), "minilm", "mean-pool+l2", f"max_tokens={MAX_TOKENS}",
                                "passage={title}: {text}")
    assert minilm.fingerprint() == before
    assert MiniLMEncoder(passage_dtype=torch.bfloat16).fingerprint() != before
    with pytest.raises(ValueError, match=r"passage_dtype=torch.float16 is unsupported: use torch.float32 or torch.bfloat16"):
        MiniLMEncoder(passage_dtype=torch.float16)


def test_minilm_missing_folder(tmp_path: Path):
    with pytest.raises(ValueError, match="holds no model"):
        MiniLMEncoder(tmp_path)


# ---------------------------------------------------------------- DPR on tiny random models


def tiny_tokenizer(cls: type) -> transformers.PreTrainedTokenizerBase:
    """A lower-casing word-level BERT-style tokenizer: [CLS] a [SEP] and [CLS] a [SEP] b [SEP] pairs."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return cls(tokenizer_object=tok, **{f"{s.strip('[]').lower()}_token": s for s in specials})


def tiny_config() -> transformers.DPRConfig:
    return transformers.DPRConfig(
        vocab_size=5 + len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )


@pytest.fixture(scope="module")
def ctx_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-dpr-ctx")
    transformers.DPRContextEncoder(tiny_config()).save_pretrained(folder)
    tiny_tokenizer(transformers.DPRContextEncoderTokenizerFast).save_pretrained(folder)
    return folder


def test_dpr_context_encoder_encodes_title_text_pairs(ctx_folder: Path):
    enc = DPRPassageEncoder.from_pretrained(ctx_folder)
    ps = [
        Passage("p#0", "Paris", "Paris is the capital of France."),
        Passage("s#0", "Seurat", "Seurat painted the Grande Jatte."),
    ]
    d = enc.encode_passages(ps)
    assert d.shape == (2, 32) and d.dtype == np.float32 and enc.dim == 32
    # deterministic (eval mode, no dropout): the same call again gives the same vectors. Computed
    # floats, so a tolerance: 0 measured; 1e-6 (~4 ulps at |x| = 2.5) only allows for threaded
    # kernels that reorder sums; dropout left on changes entries by ~1.6 (measured in train mode).
    np.testing.assert_allclose(enc.encode_passages(ps), d, rtol=0, atol=1e-6)
    model = transformers.DPRContextEncoder.from_pretrained(ctx_folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(ctx_folder)
    pair = tok("Paris", "Paris is the capital of France.", return_tensors="pt")
    assert tok.convert_ids_to_tokens(pair["input_ids"][0])[:4] == ["[CLS]", "paris", "[SEP]", "paris"]
    with torch.no_grad():
        expected = model(**pair).pooler_output[0].numpy()
        flat = model(**tok("Paris Paris is the capital of France.", return_tensors="pt")).pooler_output[0].numpy()
    # our wrapper (a padded batch of 2) vs the model on one pair: float32 reordering at most, 0
    # measured here; 1e-5 (~40 ulps at |x| = 2.5) for other CPUs, far below the 1e-3 the format makes
    np.testing.assert_allclose(d[0], expected, rtol=0, atol=1e-5)
    assert np.abs(d[0] - flat).max() > 1e-3  # the pair format matters
    # batches are formed by the pair's tokens: [CLS] title [SEP] text [SEP]
    assert enc.passage_lengths(ps) == [len(pair["input_ids"][0]), len(tok("Seurat", ps[1].text)["input_ids"])]
    np.testing.assert_allclose(enc.encode_passages(ps, batch_size=1), d, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="encodes passages only"):
        enc.encode_questions(["who painted it?"])


def test_dpr_context_encoder_fingerprint(ctx_folder: Path, tmp_path: Path):
    fp = DPRPassageEncoder.from_pretrained(ctx_folder).fingerprint()
    assert fp == DPRPassageEncoder.from_pretrained(ctx_folder).fingerprint()
    torch.manual_seed(1)
    transformers.DPRContextEncoder(tiny_config()).save_pretrained(tmp_path)
    tiny_tokenizer(transformers.DPRContextEncoderTokenizerFast).save_pretrained(tmp_path)
    assert DPRPassageEncoder.from_pretrained(tmp_path).fingerprint() != fp  # same config and file sizes, other weights
    assert DPRPassageEncoder.from_pretrained(ctx_folder, passage_dtype=torch.bfloat16).fingerprint() != fp


def test_dpr_context_encoder_in_bfloat16(ctx_folder: Path):
    """The paper's passage encoder under bfloat16 autocast: float32 vectors near float32's (bfloat16
    keeps 8 bits of mantissa: 2e-2 relative over 2 layers of a random model; measured 3e-3)."""
    ps = [Passage("p#0", "Paris", "Paris is the capital of France."), Passage("s#0", "Seurat", "Seurat painted it.")]
    d32 = DPRPassageEncoder.from_pretrained(ctx_folder).encode_passages(ps, show_bar=False)  # (2, 32)
    enc = DPRPassageEncoder.from_pretrained(ctx_folder, passage_dtype=torch.bfloat16)
    d16 = enc.encode_passages(ps, show_bar=False)  # (2, 32)
    assert enc.passage_dtype is torch.bfloat16 and d16.dtype == np.float32
    np.testing.assert_allclose(d16, d32, rtol=0, atol=2e-2 * np.abs(d32).max())
    assert not np.array_equal(d16, d32)


def test_dpr_context_encoder_bad_folder(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no loadable DPR context encoder"):
        DPRPassageEncoder.from_pretrained(tmp_path)


def test_dpr_question_encoder_wraps_a_loaded_model():
    torch.manual_seed(0)
    model = transformers.DPRQuestionEncoder(tiny_config())
    tok = tiny_tokenizer(transformers.DPRQuestionEncoderTokenizerFast)
    enc = DPRQuestionEncoder(model, tok, name="tiny-rag")
    questions = ["Who painted the Grande Jatte?", "What is the capital of France?", "the " * 600]
    q = enc.encode_questions(questions)
    assert q.shape == (3, 32) and q.dtype == np.float32 and enc.dim == 32
    # the same call again: computed floats, 0 measured, 1e-6 for reordering kernels (as above)
    np.testing.assert_allclose(enc.encode_questions(questions), q, rtol=0, atol=1e-6)
    with torch.no_grad():
        expected = model(**tok(questions[:1], return_tensors="pt")).pooler_output.numpy()
        cut = model(**tok(["the " * 254], return_tensors="pt")).pooler_output.numpy()  # 256 tokens with [CLS] [SEP]
    # a batch of 3 (padded) vs one question: float32 reordering, 0 measured; 1e-5 as for passages
    np.testing.assert_allclose(q[:1], expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(q[2:], cut, rtol=0, atol=1e-5)  # truncated to 256 tokens, not 602
    # raw, not normalised: the LayerNorm'd CLS vector has norm ~sqrt(32) = 5.66 (measured), not 1
    assert (np.linalg.norm(q, axis=1) > 2).all()
    other = DPRQuestionEncoder(transformers.DPRQuestionEncoder(tiny_config()), tok, name="tiny-rag")
    assert enc.fingerprint() == DPRQuestionEncoder(model, tok, name="tiny-rag").fingerprint()
    assert other.fingerprint() != enc.fingerprint()  # same name and config, other weights


def test_dpr_context_encoder_fails_fast_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from huggingface_hub import try_to_load_from_cache

    hub_id = "facebook/dpr-ctx_encoder-single-nq-base"
    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        pytest.skip(f"{hub_id} is in the local HF cache, so it loads without the Hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # so the Hub id cannot be mistaken for a local folder
    start = time.perf_counter()
    with pytest.raises(ValueError, match="paper stack needs the Hugging Face Hub.*--stack offline"):
        DPRPassageEncoder.from_pretrained(hub_id)
    assert time.perf_counter() - start < 10
