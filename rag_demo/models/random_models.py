"""Random-weight RAG checkpoints in the Hugging Face Hub's on-disk format.

Owns building stand-ins for the paper stack's three checkpoints -- `facebook/rag-token-nq`,
`facebook/rag-sequence-nq` (DPR question encoder + BART generator, with a `RagTokenizer` in
`question_encoder_tokenizer/` and `generator_tokenizer/`) and
`facebook/dpr-ctx_encoder-single-nq-base` -- with random weights and small tokenizers trained
offline on a built-in English text. Everything is deterministic for a given (size, seed), so
the loading code, the parity tests and the reference benchmark can run with no network.

These models know nothing: they are for tests and speed benchmarks, never for answering a
real question.
"""
from __future__ import annotations

import collections
import json
import string
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import pre_tokenizers
from transformers import (
    BartConfig,
    BartTokenizerFast,
    DPRConfig,
    DPRContextEncoder,
    DPRContextEncoderTokenizerFast,
    DPRQuestionEncoderTokenizerFast,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RagConfig,
    RagSequenceForGeneration,
    RagTokenForGeneration,
    RagTokenizer,
)

from rag_demo.publish import publish_folder

# Bump when the on-disk result of the same (size, seed, n_docs) would change, so that cached
# checkpoints from an older build are rebuilt instead of trusted.
FORMAT_VERSION = 1
MARKER = "random_checkpoint.json"  # written last into each folder: its presence means "complete"

# Dims per size. "tiny" is for unit tests (builds in well under a second). "base" is for the
# speed benchmark: DPR at its real size (BERT-base) and a BART-base generator (the paper uses
# BART-large: d_model 1024, 12+12 layers, 16 heads, ffn 4096), so it has realistic depth and
# width for a 2-core CPU while building in seconds. Vocabularies are the small built-in ones
# (vocab_size = tokenizer size), far smaller than BERT's 30522 / BART's 50265.
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "tiny": {
        "dpr": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=128),
        "bart": dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=256),
    },
    "base": {
        "dpr": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, max_position_embeddings=512),
        "bart": dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                     decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                     max_position_embeddings=1024),
    },
}

# BERT-style specials at ids 0..4 ([PAD] must be 0: DPRConfig.pad_token_id defaults to 0).
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# BART's ids: <s>=0, <pad>=1, </s>=2, <unk>=3; <mask> goes last, as in facebook/bart-large.
BPE_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
BPE_MASK = "<mask>"
BPE_TARGET_VOCAB = 1000  # merges stop here, or earlier when no pair occurs twice

# Short encyclopedic text the tokenizers are trained on. It holds every word of the questions
# the tests ask, so those questions tokenize into whole words rather than characters.
CORPUS_TEXT = """\
The Starry Night is an oil painting by the Dutch painter Vincent van Gogh. Van Gogh painted
The Starry Night in June 1889, from the window of his room at the asylum of Saint-Remy-de-Provence
in the south of France. The painting shows a swirling night sky over a small village, with a
cypress tree and a bright crescent moon. It is held by the Museum of Modern Art in New York City.

The Mona Lisa is a portrait painted by the Italian artist Leonardo da Vinci. Leonardo painted it
between 1503 and 1519. The painting hangs in the Louvre museum in Paris. Who painted the Mona Lisa?
Leonardo da Vinci painted the Mona Lisa, and it is one of the most famous paintings in the world.

Paris is the capital and the largest city of France. The city stands on the river Seine in the
north of the country. Paris is known for the Eiffel Tower, the Louvre, the cathedral of Notre-Dame
and its cafes. What is the capital of France? The capital of France is Paris. About two million
people live in the city, and more than twelve million live in the region around it.

Berlin is the capital of Germany, Rome is the capital of Italy, Madrid is the capital of Spain
and London is the capital of the United Kingdom. Tokyo is the capital of Japan and the largest
city in the world by population. Washington is the capital of the United States of America.

Apollo 11 was the American spaceflight that first landed humans on the Moon. When did Apollo 11
land on the Moon? The lunar module Eagle landed on July 20, 1969. Neil Armstrong and Buzz Aldrin
walked on the surface, while Michael Collins flew in orbit. Armstrong was the first person to step
onto the Moon. The mission was launched by NASA from Florida on a Saturn V rocket.

Albert Einstein was a German-born physicist who developed the theory of relativity. He received
the Nobel Prize in Physics in 1921. Marie Curie was a Polish and French scientist who studied
radioactivity; she was the first woman to win a Nobel Prize and the only person to win it in two
sciences. Isaac Newton described gravity and the laws of motion. Charles Darwin wrote about
evolution by natural selection. Where was Einstein born? He was born in Ulm, in Germany.

The Earth is the third planet from the Sun and the only known place where life exists. Water
covers most of its surface. The Moon is its only natural satellite. Mount Everest is the highest
mountain on Earth, and the Pacific is the largest ocean. How many planets are in the solar system?
There are eight planets: Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune.

William Shakespeare was an English playwright and poet who wrote Hamlet, Macbeth and Romeo and
Juliet. Which author wrote the novel Pride and Prejudice? Jane Austen wrote it in 1813. Ludwig van
Beethoven was a German composer who wrote nine symphonies, and Wolfgang Amadeus Mozart was born
in Salzburg, in Austria. Why do people still read these books? Because their stories are good.

The Great Wall of China was built over many centuries to protect the northern border of the
Chinese empire. The Roman Empire ruled most of Europe and the Mediterranean for about five hundred
years. The Second World War ended in 1945, and the United Nations was founded in the same year.
Christopher Columbus sailed across the Atlantic Ocean in 1492. The Nile is the longest river in
Africa, and the Amazon carries more water than any other river.

A computer is a machine that follows a program. Alan Turing described a simple model of
computation in 1936, and the first electronic computers were built during the war. The internet
connects billions of devices, and a search engine helps people find documents. A language model
predicts the next word; a retriever finds passages that may hold the answer to a question.
"""

# Three passages on distinct topics, for retrieval / generation tests (title, text).
FIXTURE_PASSAGES: tuple[tuple[str, str], ...] = (
    (
        "The Starry Night",
        "The Starry Night is an oil painting by the Dutch painter Vincent van Gogh. He painted it in "
        "June 1889 from the window of his room at the asylum in the south of France. It shows a "
        "swirling night sky over a small village and is held by the Museum of Modern Art in New York City.",
    ),
    (
        "Paris",
        "Paris is the capital and the largest city of France. It stands on the river Seine in the north "
        "of the country and is known for the Eiffel Tower, the Louvre and the cathedral of Notre-Dame. "
        "About two million people live in the city.",
    ),
    (
        "Apollo 11",
        "Apollo 11 was the American spaceflight that first landed humans on the Moon. The lunar module "
        "Eagle landed on July 20, 1969. Neil Armstrong and Buzz Aldrin walked on the surface while "
        "Michael Collins flew in orbit. The mission was launched by NASA from Florida.",
    ),
)


def fixture_passages() -> list[tuple[str, str]]:
    """Three (title, text) passages, 40-60 words each, on topics the tokenizers know."""
    return list(FIXTURE_PASSAGES)


# ----------------------------------------------------------------------------- tokenizers


def _wordpiece_vocab(texts: tuple[str, ...]) -> dict[str, int]:
    """A deterministic WordPiece vocab: specials, characters, '##'+characters, then whole words.

    `tokenizers`' WordPieceTrainer breaks ties in hash-map order, so its vocab changes from
    run to run; this one does not. Every printable ASCII character is in, so any ASCII text
    encodes without [UNK] (unseen words fall back to characters).
    """
    words: collections.Counter[str] = collections.Counter()
    pre = pre_tokenizers.BertPreTokenizer()
    for text in texts:
        words.update(w for w, _ in pre.pre_tokenize_str(text.lower()))
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation)
                   | {c for w in words for c in w})
    tokens = list(WORDPIECE_SPECIALS) + chars + ["##" + c for c in chars]
    seen = set(tokens)
    # most frequent first, ties alphabetical: a stable order for the same text
    for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])):
        if w not in seen:
            seen.add(w)
            tokens.append(w)
    return {t: i for i, t in enumerate(tokens)}


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _byte_bpe(texts: tuple[str, ...], target: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE (GPT-2 / BART style) with deterministic merges (ties: smallest pair).

    Words are split exactly as RobertaTokenizer will split them at encode time (ByteLevel
    pre-tokenizer, no prefix space), so every learned merge is reachable.
    """
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    counts: collections.Counter[tuple[str, ...]] = collections.Counter()
    for text in texts:
        counts.update(tuple(w) for w, _ in pre.pre_tokenize_str(text))
    tokens = list(BPE_SPECIALS) + sorted(pre_tokenizers.ByteLevel.alphabet())
    merges: list[tuple[str, str]] = []
    while len(tokens) < target - 1:  # -1: room for <mask>
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, n in counts.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:  # a merge seen once is memorisation, not a subword
            break
        merges.append(best)
        tokens.append(best[0] + best[1])
        counts = collections.Counter({_merge_word(w, best): n for w, n in counts.items()})
    tokens.append(BPE_MASK)
    return {t: i for i, t in enumerate(tokens)}, merges


@lru_cache(maxsize=4)
def _trained_vocabs(texts: tuple[str, ...]) -> tuple[dict, dict, list]:
    # cached: the BPE loop is the slow part and the result depends only on the text.
    # BART is cased but RAG-NQ questions are lowercase: learn merges for both spellings.
    bpe_vocab, merges = _byte_bpe(texts + tuple(t.lower() for t in texts), BPE_TARGET_VOCAB)
    return _wordpiece_vocab(texts), bpe_vocab, merges


def build_tokenizers(
    workdir: Path | str | None = None,
    texts: list[str] | None = None,
    *,
    question_max_length: int = 512,
    generator_max_length: int = 1024,
) -> tuple[DPRQuestionEncoderTokenizerFast, BartTokenizerFast]:
    """(question-encoder WordPiece tokenizer, generator byte-level BPE tokenizer), built offline.

    Trained on `texts` (default: the built-in CORPUS_TEXT). If `workdir` is given, the pair is
    also saved there as a RagTokenizer (`question_encoder_tokenizer/`, `generator_tokenizer/`).
    The max lengths become `model_max_length` (the real checkpoints use 512 and 1024).
    """
    key = tuple(texts) if texts is not None else (CORPUS_TEXT,)
    wp_vocab, bpe_vocab, merges = _trained_vocabs(key)
    # The transformers classes add the standard normaliser, pre-tokenizer and [CLS]/<s>
    # post-processor themselves, so the result matches what the Hub tokenizers do.
    q_tok = DPRQuestionEncoderTokenizerFast(vocab=dict(wp_vocab), do_lower_case=True,
                                            model_max_length=question_max_length)
    g_tok = BartTokenizerFast(vocab=dict(bpe_vocab), merges=list(merges),
                              model_max_length=generator_max_length)
    if workdir is not None:
        save_rag_tokenizer(RagTokenizer(question_encoder=q_tok, generator=g_tok), Path(workdir))
    return q_tok, g_tok


def ctx_tokenizer_like(q_tok: DPRQuestionEncoderTokenizerFast) -> DPRContextEncoderTokenizerFast:
    """The context-encoder tokenizer: same vocab as the question encoder's (as in real DPR)."""
    return DPRContextEncoderTokenizerFast(vocab=dict(q_tok.get_vocab()), do_lower_case=True,
                                          model_max_length=q_tok.model_max_length)


def _write_legacy_vocab(tok: PreTrainedTokenizerBase, folder: Path) -> None:
    """Also write the per-model vocab files the Hub checkpoints ship (vocab.txt; vocab.json +
    merges.txt). transformers 5 saves only tokenizer.json; these keep older loaders working."""
    vocab = tok.get_vocab()
    ordered = sorted(vocab, key=vocab.get)
    if isinstance(tok, BartTokenizerFast):
        (folder / "vocab.json").write_text(json.dumps({t: vocab[t] for t in ordered}, ensure_ascii=False),
                                           encoding="utf-8")
        model = json.loads(tok.backend_tokenizer.to_str())["model"]
        lines = ["#version: 0.2"] + [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
        (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        (folder / "vocab.txt").write_text("\n".join(ordered) + "\n", encoding="utf-8")


def save_rag_tokenizer(tok: RagTokenizer, folder: Path) -> None:
    """RagTokenizer.save_pretrained (two subfolders) plus the legacy vocab files."""
    tok.save_pretrained(str(folder))
    _write_legacy_vocab(tok.question_encoder, folder / "question_encoder_tokenizer")
    _write_legacy_vocab(tok.generator, folder / "generator_tokenizer")


# ----------------------------------------------------------------------------- models


def dpr_config(size: str, vocab_size: int) -> DPRConfig:
    return DPRConfig(vocab_size=vocab_size, pad_token_id=0, **SIZES[size]["dpr"])


def bart_config(size: str, vocab_size: int) -> BartConfig:
    # forced_eos_token_id=None: BART's default (2) adds a logits processor that rewrites
    # scores at max length, which would make our decoding differ from plain RAG math.
    return BartConfig(vocab_size=vocab_size, bos_token_id=0, pad_token_id=1, eos_token_id=2,
                      decoder_start_token_id=2, forced_eos_token_id=None, no_repeat_ngram_size=0,
                      **SIZES[size]["bart"])


def rag_config(q_cfg: DPRConfig, g_cfg: BartConfig, n_docs: int) -> RagConfig:
    # Top-level special ids copy the generator's, as in the Hub RAG configs; the retrieval
    # vector size is the encoder width so a FAISS index built from these models fits.
    return RagConfig.from_question_encoder_generator_configs(
        q_cfg, g_cfg, n_docs=n_docs, vocab_size=g_cfg.vocab_size,
        bos_token_id=g_cfg.bos_token_id, pad_token_id=g_cfg.pad_token_id,
        eos_token_id=g_cfg.eos_token_id, decoder_start_token_id=g_cfg.decoder_start_token_id,
        retrieval_vector_size=q_cfg.hidden_size,
    )


def _seeded(build: Callable[[], PreTrainedModel], seed: int) -> PreTrainedModel:
    # fork_rng: seed for reproducible weights without disturbing the caller's RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    return model.float().eval()


def _check_generation_config(model: PreTrainedModel) -> None:
    """Fail loudly if a score-altering default sneaks into a generation config (the RAG
    model's, where it has one -- RagSequenceForGeneration does not -- and the generator's)."""
    for gc in (getattr(model, "generation_config", None), model.rag.generator.generation_config):
        if gc is not None:
            _check_one_generation_config(gc)


def _check_one_generation_config(gc: GenerationConfig) -> None:
    bad = {k: getattr(gc, k, None) for k in ("forced_eos_token_id", "forced_bos_token_id",
                                             "no_repeat_ngram_size", "min_length", "min_new_tokens",
                                             "repetition_penalty", "bad_words_ids", "suppress_tokens",
                                             "begin_suppress_tokens")}
    bad = {k: v for k, v in bad.items() if v not in (None, 0, 1.0)}
    if bad:
        raise RuntimeError(f"random RAG generation_config alters scores: {bad}")


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_paths(root: Path, size: str) -> dict[str, Path]:
    root = Path(root)
    return {"rag_token": root / f"rag-token-{size}", "rag_sequence": root / f"rag-sequence-{size}",
            "ctx_encoder": root / f"dpr-ctx-{size}"}


def _recipe(name: str, size: str, seed: int, n_docs: int) -> dict:
    return {"name": name, "size": size, "seed": seed, "n_docs": n_docs, "format_version": FORMAT_VERSION}


def _is_complete(folder: Path, recipe: dict) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()) == recipe
    except (OSError, ValueError):
        return False


def _publish(folder: Path, recipe: dict, write: Callable[[Path], None]) -> None:
    """Write a checkpoint with the marker last, atomically (`publish_folder`): a reader never
    sees a half-written folder, and a stale or partial one is replaced."""

    def write_marked(tmp: Path) -> None:
        write(tmp)
        (tmp / MARKER).write_text(json.dumps(recipe))

    publish_folder(folder, write_marked, lambda f: _is_complete(f, recipe))


def _write_rag(model_cls: type[PreTrainedModel], cfg: RagConfig, seed: int, tok: RagTokenizer) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        model = _seeded(lambda: model_cls(cfg), seed)
        _check_generation_config(model)
        model.save_pretrained(str(folder))
        save_rag_tokenizer(tok, folder)
    return write


def _write_ctx(cfg: DPRConfig, seed: int, tok: DPRContextEncoderTokenizerFast) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        _seeded(lambda: DPRContextEncoder(cfg), seed).save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
        _write_legacy_vocab(tok, folder)
    return write


def make_random_rag_checkpoints(root: Path, size: str = "tiny", seed: int = 0, n_docs: int = 3) -> dict[str, Path]:
    """Build (or reuse) random RAG-Token, RAG-Sequence and DPR context-encoder checkpoints.

    Returns {"rag_token", "rag_sequence", "ctx_encoder"} -> folder under `root`, each loadable
    offline with `from_pretrained` exactly like its Hub counterpart. Seeds: RAG-Token `seed`,
    RAG-Sequence `seed + 1` (so the two differ, like the real ones), context encoder `seed + 2`.
    A folder whose marker matches (size, seed, n_docs, FORMAT_VERSION) is reused as is.
    """
    if size not in SIZES:
        raise ValueError(f"size={size!r} is unknown: use one of {', '.join(SIZES)}.")
    paths = checkpoint_paths(root, size)
    recipes = {name: _recipe(name, size, seed, n_docs) for name in paths}
    todo = [name for name, p in paths.items() if not _is_complete(p, recipes[name])]
    if not todo:
        return paths
    Path(root).mkdir(parents=True, exist_ok=True)

    dims = SIZES[size]
    q_tok, g_tok = build_tokenizers(
        None, question_max_length=dims["dpr"]["max_position_embeddings"],
        generator_max_length=dims["bart"]["max_position_embeddings"])
    q_cfg, g_cfg = dpr_config(size, len(q_tok)), bart_config(size, len(g_tok))
    cfg = rag_config(q_cfg, g_cfg, n_docs)
    rag_tok = RagTokenizer(question_encoder=q_tok, generator=g_tok)

    writers = {
        "rag_token": _write_rag(RagTokenForGeneration, cfg, seed, rag_tok),
        "rag_sequence": _write_rag(RagSequenceForGeneration, cfg, seed + 1, rag_tok),
        "ctx_encoder": _write_ctx(q_cfg, seed + 2, ctx_tokenizer_like(q_tok)),
    }
    for name in todo:
        _publish(paths[name], recipes[name], writers[name])
    return paths


# ----------------------------------------------------------------------------- a tiny SmolLM2-shaped generator


def tiny_smollm_generator(tokenizer_folder: Path, layers: int = 1, kv_heads: int = 2, seed: int = 0, hidden: int = 16):
    """SmolLM2's real tokenizer and chat template (a converted-model folder) on a tiny random
    Llama: prompts, stop tokens and spans are the real ones, decoding is cheap. For tests. (At
    hidden 16 most of the 49k tokens can never be the likeliest: a random output row is seldom
    extreme in 16 dimensions. A test that must teach it an exact answer asks for 64.)"""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rag_demo.models.decoder_only import DecoderOnlyGenerator

    tok = AutoTokenizer.from_pretrained(tokenizer_folder)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=kv_heads, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return DecoderOnlyGenerator(LlamaForCausalLM(cfg), tok, name="tiny-llama")
