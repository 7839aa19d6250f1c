"""The answer style setting (RagSettings.answer_style): validation, what each value changes in
the prompt, and that a stop token ends the answer while the answer's score stays exact."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.rag import engine  # noqa: E402
from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.knowledge.corpus import Passage  # noqa: E402
from rag_demo.rag.marginalize import doc_log_prior, rag_sequence_logprob, rag_token_logprob  # noqa: E402

DOC = Passage(id="p1", title="Veltrania", text="Veltrania is an imaginary island. Its capital is Port Amsel.")
Q = "What is the capital of Veltrania?"


# ---------------------------------------------------------------- SmolLM2's prompts and stop ids


@pytest.fixture(scope="module")
def smol_tiny(smollm_tokenizer_folder):
    """SmolLM2's real tokenizer and chat template on a tiny random Llama (random_models)."""
    from rag_demo.models.random_models import tiny_smollm_generator

    return tiny_smollm_generator(smollm_tokenizer_folder, layers=1, kv_heads=2)


def test_the_chat_format_needs_only_a_tokenizer(smollm_tokenizer_folder):
    """chat_format.ChatFormat on SmolLM2's tokenizer, no model: the prompt opens with the short
    style's cue, its passage tokens decode to the passage, and the stop rule ends at a period."""
    from transformers import AutoTokenizer

    from rag_demo.models.chat_format import ChatFormat
    from rag_demo.models.prompts import SHORT_ANSWER_CUE

    tok = AutoTokenizer.from_pretrained(smollm_tokenizer_folder)
    fmt = ChatFormat(tok, [tok.eos_token_id])
    p = fmt.prompt(Q, DOC, 192, "short")
    assert tok.decode(p).endswith(SHORT_ANSWER_CUE)
    a, b = p.passage
    assert tok.decode(p[a:b]).strip() == f"{DOC.title}: {DOC.text}"
    period = tok.encode(" Amsel.", add_special_tokens=False)
    assert fmt.stop_token_ids("short").ends_at(period, len(period) - 1)


def test_a_prompt_built_again_is_remembered_and_each_call_gets_its_own(smollm_tokenizer_folder, monkeypatch):
    """ChatFormat.prompt remembers what it built: the same arguments again render no chat template
    and give equal tokens, passage and opening; a caller changing its copy changes no later one;
    another passage's text is built anew; at most PROMPTS_KEPT are kept."""
    from transformers import AutoTokenizer

    from rag_demo.models import chat_format
    from rag_demo.models.chat_format import ChatFormat

    tok = AutoTokenizer.from_pretrained(smollm_tokenizer_folder)
    fmt = ChatFormat(tok, [tok.eos_token_id])
    rendered = []
    real = tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template", lambda *a, **k: rendered.append(1) or real(*a, **k))
    first = fmt.prompt(Q, DOC, 192, "short")
    built = len(rendered)
    again = fmt.prompt(Q, DOC, 192, "short")
    assert len(rendered) == built > 0
    assert again == first and again.passage == first.passage and again.opening == first.opening
    again.append(0)
    assert fmt.prompt(Q, DOC, 192, "short") == first
    other = Passage(id="p1", title=DOC.title, text=DOC.text.replace("Port Amsel", "Port Ilse"))
    assert fmt.prompt(Q, other, 192, "short") != first and len(rendered) > built
    closed = fmt.prompt(Q, None, 192, "short")
    assert fmt.prompt(Q, None, 192, "short").opening == closed.opening is not None
    monkeypatch.setattr(chat_format, "PROMPTS_KEPT", 2)
    fmt.prompt("Another question?", DOC, 192, "short")
    fmt.prompt("A third question?", DOC, 192, "short")
    n = len(rendered)
    assert fmt.prompt(Q, DOC, 192, "short") == first and len(rendered) > n  # dropped: built anew


def test_short_style_changes_the_prompt(smol_tiny):
    from rag_demo.models import prompts as P

    short, sentence = smol_tiny.messages(Q, DOC, 192, "short"), smol_tiny.messages(Q, DOC, 192, "sentence")
    assert short[0]["content"] == P.SHORT_SYSTEM_PROMPT and sentence[0]["content"] == P.SYSTEM_PROMPT
    assert "shortest phrase" in short[0]["content"]
    assert "Port Amsel" in short[-1]["content"] and Q in short[-1]["content"]
    assert smol_tiny.prompt(Q, DOC, 192, "short") != smol_tiny.prompt(Q, DOC, 192, "sentence")
    # short opens the assistant turn with the cue; sentence leaves it to the model
    cue = smol_tiny.tokenizer(P.SHORT_ANSWER_CUE, add_special_tokens=False)["input_ids"]
    for doc in (DOC, None):
        ids = smol_tiny.prompt(Q, doc, 192, "short")
        assert ids[-len(cue):] == cue
        assert smol_tiny.tokenizer.decode(ids).rstrip().endswith("assistant\n" + P.SHORT_ANSWER_CUE)
        assert not smol_tiny.tokenizer.decode(smol_tiny.prompt(Q, doc, 192, "sentence")).rstrip().endswith(P.SHORT_ANSWER_CUE)
    # closed-book asks for the same style, so the comparison with RAG stays fair
    cb_short, cb_sentence = smol_tiny.messages(Q, None, 192, "short"), smol_tiny.messages(Q, None, 192, "sentence")
    assert cb_short[0]["content"] == P.SHORT_CLOSED_BOOK_SYSTEM_PROMPT
    assert cb_sentence[0]["content"] == P.CLOSED_BOOK_SYSTEM_PROMPT
    assert "Port Amsel" not in cb_short[-1]["content"]


def test_short_style_stops_at_line_ends(smol_tiny):
    tok = smol_tiny.tokenizer
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == 1
    short, sentence = smol_tiny.stop_token_ids("short"), smol_tiny.stop_token_ids("sentence")
    assert sentence == smol_tiny.eos_token_ids
    assert set(smol_tiny.eos_token_ids) < set(short) and newline[0] in short
    period = tok(".", add_special_tokens=False)["input_ids"]
    assert len(period) == 1 and period[0] in short  # a sentence-final period ends a short answer
    for i in short:  # every stop id is EOS, ends a line (only whitespace after its newline) or is a period
        text = tok.decode([i])
        assert i in smol_tiny.eos_token_ids or ("\n" in text and not text.split("\n", 1)[1].strip()) or text.strip() == "."
    for word in (" Paris", ",", " 1889", " St"):
        assert tok(word, add_special_tokens=False)["input_ids"][0] not in short


def test_short_style_does_not_stop_at_the_period_of_an_initial(smol_tiny):
    """ "U.S. dollar", "J. K. Rowling", "St. Louis": a period right after an initial or a title's
    abbreviation does not end a short answer; after a word it does ("Paris.")."""
    tok, rule = smol_tiny.tokenizer, smol_tiny.stop_token_ids("short")
    for text in (" U.S. dollar.", " J. K. Rowling.", " St. Louis.", " Paris."):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        stops = [i for i in range(len(ids)) if rule.ends_at(ids, i)]
        assert stops == [len(ids) - 1], (text, [tok.decode([t]) for t in ids], stops)


def test_short_style_does_not_stop_at_a_decimal_point(smol_tiny):
    """ "68.5 million": a period right after a digit may be a decimal point, so it does not end a
    short answer (it was cut to "68." before); a year's final period then leaves the end to the
    model's own end of turn or newline, which every worked example shows after its answer."""
    tok, rule = smol_tiny.tokenizer, smol_tiny.stop_token_ids("short")
    for text, ends in ((" 68.5 million.", True), (" 8,848.86 m.", True), (" 1889.", False)):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        stops = [i for i in range(len(ids)) if rule.ends_at(ids, i)]
        assert stops == ([len(ids) - 1] if ends else []), (text, [tok.decode([t]) for t in ids], stops)
    year = tok(" 1889.\n", add_special_tokens=False)["input_ids"]
    assert [i for i in range(len(year)) if rule.ends_at(year, i)] == [len(year) - 1]  # the newline ends it


def _force_next(gen, token_id: int) -> torch.nn.Module:
    """Make `token_id` the argmax of every step (a large bias on its output logit); returns the
    original output layer."""
    old = gen.model.lm_head
    new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.zero_()
        new.bias[token_id] = 100.0
    gen.model.lm_head = new
    return old


def test_short_style_ends_generation_at_the_newline_and_scores_it(smol_tiny):
    """A model that always emits "\\n": short style stops after that one token (generated, kept
    and scored), sentence style runs on to max_new_tokens. RAG-Token's score is the exact
    marginal of the generated ids, newline included."""
    nl = smol_tiny.tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    saved = _force_next(smol_tiny, nl)
    try:
        s_short = RagSettings(preset="paper", answer_style="short", max_new_tokens=6).decoding
        s_sent = RagSettings(preset="paper", answer_style="sentence", max_new_tokens=6).decoding
        cb_short = engine.closed_book(smol_tiny, smol_tiny.prompt(Q, None, 192, "short"), s_short)
        cb_sent = engine.closed_book(smol_tiny, smol_tiny.prompt(Q, None, 192, "sentence"), s_sent)
        assert cb_short.tokens == [nl] and cb_sent.tokens == [nl] * 6
        first_lp, _ = smol_tiny.prefill([smol_tiny.prompt(Q, None, 192, "short")])
        assert cb_short.logprob == pytest.approx(float(first_lp[0, nl]), abs=1e-5)
        docs = [DOC, Passage(id="p2", title="Other", text="Something else entirely.")]
        prompts = [smol_tiny.prompt(Q, d, 192, "short") for d in docs]
        scores = torch.tensor([2.0, 0.5])
        tok_out = engine.rag_token(smol_tiny, prompts, scores, s_short)
        assert tok_out.tokens == [nl] and tok_out.doc_lp.shape == (2, 1)
        lp0, _ = smol_tiny.prefill(prompts)
        assert tok_out.logprob == pytest.approx(float(rag_token_logprob(lp0[:, [nl]], doc_log_prior(scores))), abs=1e-5)
        seq_out = engine.rag_sequence(smol_tiny, prompts, scores, s_short)
        assert seq_out.tokens == [nl]
        assert seq_out.logprob == pytest.approx(
            float(rag_sequence_logprob(lp0[:, [nl]].unsqueeze(0), doc_log_prior(scores).unsqueeze(0), torch.ones(1, 1))),
            abs=1e-5)
    finally:
        smol_tiny.model.lm_head = saved


# ---------------------------------------------------------------- stop ids in the engine (tiny BART)


@pytest.fixture(scope="module")
def tiny_bart(tiny_ckpts):
    from rag_demo.models.stacks import load_rag_checkpoint

    _, gen = load_rag_checkpoint(str(tiny_ckpts["rag_token"]), "token")
    return gen


def test_a_stop_token_ends_every_mode_and_the_score_stays_exact(tiny_bart, monkeypatch):
    """Greedy with EOS suppressed gives an 8-token answer y. Making one of y's tokens (its first
    new one after the start) a stop token cuts every mode's answer right after it (the stop
    token is generated and kept), and the score is the exact RAG marginal of the tokens kept:
    the same per-doc log-probs as the long run's first columns."""
    gen = tiny_bart
    prompts = [gen.prompt(Q, d, 64) for d in (DOC, Passage(id="p2", title="Other", text="Something else."))]
    scores = torch.tensor([1.0, 0.2])
    prior = doc_log_prior(scores)
    s = RagSettings(preset="paper", max_new_tokens=8, answer_style="sentence").decoding
    bias = gen.model.final_logits_bias.clone()
    gen.model.final_logits_bias[..., gen.eos_token_ids[0]] = -1e4  # the random model would stop at once
    try:
        _cut_at_stop(gen, prompts, scores, prior, s, monkeypatch)
    finally:
        gen.model.final_logits_bias.copy_(bias)


def _cut_at_stop(gen, prompts, scores, prior, s, monkeypatch):
    long_ = engine.rag_token(gen, prompts, scores, s)
    assert len(long_.tokens) == 8
    # the first token that did not occur before it (the random model repeats itself)
    j = next((j for j in range(1, 8) if long_.tokens[j] not in long_.tokens[:j]), 0)
    stop = long_.tokens[j]
    monkeypatch.setattr(type(gen), "stop_token_ids", lambda self, style="sentence": self.eos_token_ids + [stop])
    short = engine.rag_token(gen, prompts, scores, s)
    assert short.tokens == long_.tokens[: j + 1] and len(short.tokens) < 8
    assert torch.allclose(short.doc_lp, long_.doc_lp[:, : j + 1], atol=1e-5)
    assert short.logprob == pytest.approx(float(rag_token_logprob(long_.doc_lp[:, : j + 1], prior)), abs=1e-5)
    seq = engine.rag_sequence(gen, prompts, scores, s)
    for toks, _ in seq.candidates:  # every candidate ends at EOS, a stop token, or the length limit
        assert toks[-1] in (gen.eos_token_ids[0], stop) or len(toks) == 8
        assert stop not in toks[:-1]
    assert seq.logprob == pytest.approx(
        float(rag_sequence_logprob(seq.doc_lp.unsqueeze(0), prior.unsqueeze(0), torch.ones(1, seq.doc_lp.shape[1]))), abs=1e-5)
    cb = engine.closed_book(gen, gen.prompt(Q, None, 64), s)
    assert stop not in cb.tokens[:-1]


def test_the_stop_rule_and_the_chunker_read_one_abbreviation_list(smol_tiny):
    """models/abbreviations.py is the one list: a title's period ends neither a short answer nor a
    sentence ("Dr."), "Jr." may end an answer but splits no sentence, and "Gen." (a title the
    Vital Articles index was cut without) ends no answer but still splits a sentence."""
    from rag_demo.knowledge.chunking import split_sentences
    from rag_demo.models.abbreviations import ABBREVIATIONS

    tok, rule = smol_tiny.tokenizer, smol_tiny.stop_token_ids("short")

    def ends_early(text):  # the answer ends before its last token
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return any(rule.ends_at(ids, i) for i in range(len(ids) - 1))

    assert not ends_early(" Dr. Watson.") and not ends_early(" Gen. Grant.")
    assert ends_early(" King Jr. Day.")
    assert split_sentences("He met Dr. Watson. Then Jr. Smith came. Gen. Grant won.") == [
        "He met Dr. Watson.", "Then Jr. Smith came.", "Gen.", "Grant won."]
    assert not ABBREVIATIONS["Dr"].ends_answer and ABBREVIATIONS["Jr"].ends_answer
    assert not ABBREVIATIONS["Gen"].chunker_reads
