"""The reader's settings: prior temperature, question position, passage sentences, and
the prefill shared by RAG-Token and RAG-Sequence. Validation, what each value changes, and that
sharing changes nothing but the time. Offline stack made of real MiniLM (retriever and
sentence chooser) and a tiny random Llama with SmolLM2's real tokenizer, over a 3-passage corpus."""
from __future__ import annotations

import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_demo.models import generators as G  # noqa: E402
from rag_demo.models import kv_cache as KV  # noqa: E402
from rag_demo.models import prompts as P  # noqa: E402
from rag_demo.config import KNOBS, RagSettings
from rag_demo.models.stack_spec import StackSpec  # noqa: E402
from rag_demo.knowledge.corpus import Passage, corpus_from_documents  # noqa: E402
from rag_demo.knowledge.chunking import split_sentences  # noqa: E402
from rag_demo.reader.focus import closest_sentences, focus_passages  # noqa: E402
from rag_demo.rag.hooks import PAPER  # noqa: E402
from rag_demo.reader.aided import prompt  # noqa: E402

Q = "Who discovered penicillin?"
FLEMING = Passage(
    id="f#0", title="Alexander Fleming",
    text=("Sir Alexander Fleming was a Scottish physician. He was born in Ayrshire in 1881. "
          "In 1928 he discovered penicillin, the first broadly effective antibiotic. "
          "He shared the Nobel Prize in 1945."),
)
DOCS = [
    ("Alexander Fleming", FLEMING.text),
    ("Mount Kilimanjaro", "Mount Kilimanjaro is a dormant volcano in Tanzania. It is the highest mountain in Africa."),
    ("Hamlet", "Hamlet is a tragedy by William Shakespeare. It was written around 1600. It is set in Denmark."),
]


# ---------------------------------------------------------------- validation


# ---------------------------------------------------------------- sentences


def test_split_sentences_worked_examples():
    assert split_sentences(FLEMING.text) == [
        "Sir Alexander Fleming was a Scottish physician.",
        "He was born in Ayrshire in 1881.",
        "In 1928 he discovered penicillin, the first broadly effective antibiotic.",
        "He shared the Nobel Prize in 1945.",
    ]
    # initials, titles and "U.S." do not end a sentence; ?, ! and a closing quote do
    assert split_sentences('J. R. R. Tolkien lived in St. Louis. Dr. No was filmed in the U.S. in 1962. "Why?" he asked! Yes.') == [
        "J. R. R. Tolkien lived in St. Louis.",
        "Dr. No was filmed in the U.S. in 1962.",
        '"Why?" he asked!',
        "Yes.",
    ]
    assert split_sentences("no end mark") == ["no end mark"] and split_sentences("  ") == []
    # the pieces are the text, up to white space
    text = DOCS[2][1]
    assert " ".join(split_sentences(text)) == text


def test_closest_sentences_keeps_the_answer_sentence_in_passage_order(minilm):
    qv = minilm.encode_questions([Q])[0]  # (D,)
    short = Passage(id="k#0", title=DOCS[1][0], text=DOCS[1][1])  # two sentences
    chosen = closest_sentences(qv, [FLEMING, short], minilm, 2)
    assert 2 in chosen[0] and len(chosen[0]) == 2 and chosen[0] == sorted(chosen[0])  # the penicillin sentence
    assert chosen[1] == [0, 1]  # n or fewer sentences: all kept
    (one,), _ = focus_passages(qv, [FLEMING], minilm, 1)
    assert one.text == "In 1928 he discovered penicillin, the first broadly effective antibiotic."
    assert (one.id, one.title) == (FLEMING.id, FLEMING.title)
    same, kept = focus_passages(qv, [FLEMING], minilm, 0)
    assert same == [FLEMING] and kept == [[0, 1, 2, 3]]


# ---------------------------------------------------------------- a tiny offline stack


@pytest.fixture(scope="module")
def tiny_offline(minilm, smollm_tokenizer_folder, tmp_path_factory):
    """The offline stack's shape: MiniLM retrieves (scale 20), one tiny random Llama with
    SmolLM2's tokenizer generates for all three modes (as SmolLM2 does)."""
    from rag_demo.knowledge.index import load_or_build_index
    from rag_demo.pipeline import RagPipeline
    from rag_demo.models.random_models import tiny_smollm_generator
    from rag_demo.models.stacks import MINILM_SCORE_SCALE, LoadedStack, ModeModels

    gen = tiny_smollm_generator(smollm_tokenizer_folder, layers=2, kv_heads=1)
    spec = StackSpec(cache_dir=tmp_path_factory.mktemp("cache"))
    stack = LoadedStack(spec, minilm, {m: ModeModels(minilm, gen, MINILM_SCORE_SCALE)
                                       for m in ("token", "sequence", "closed-book")}, 0.0)
    corpus = corpus_from_documents("three", [(t, x, None) for t, x in DOCS])
    index, info = load_or_build_index(corpus, minilm, spec.cache_dir)
    return RagPipeline(stack, index, RagSettings(preset="aided", k=3, max_new_tokens=5), info)


def test_prior_temperature_is_the_softmax_of_scaled_scores_over_t(tiny_offline):
    got = {t: tiny_offline.answer(Q, "token", prior_temperature=t, question_weight=0) for t in (0.5, 1.0, 4.0)}
    scores = torch.tensor([d.score for d in got[1.0].docs])
    for t, a in got.items():
        want = torch.softmax(scores * 20.0 / t, 0)
        # float32 softmax of the same numbers: equal within a few ulps (measured 0); 1e-6 is margin
        assert [d.prior for d in a.docs] == pytest.approx(want.tolist(), abs=1e-6)
    top = [got[t].docs[0].prior for t in (0.5, 1.0, 4.0)]
    assert top[0] > top[1] > top[2]  # sharper below 1, flatter above
    assert got[1.0].docs[0].title == "Alexander Fleming"  # the retrieval itself is unchanged
    # the tempered prior is the one the math uses: the token posteriors differ with it
    assert got[0.5].token_doc_posteriors != got[4.0].token_doc_posteriors


def test_prior_temperature_tempers_the_readers_vote_too():
    """p(z|x) = softmax((c·s + w·log p_G(x|z)) / T) (reader.vote.voted_prior): were T applied to
    the retriever's logits alone, the vote would stay whole. Without the vote the engine's prior is
    the retriever's logits over T (rag.engine.prefill with the paper's reader)."""
    from types import SimpleNamespace

    from rag_demo.rag.engine import prefill
    from rag_demo.reader.vote import voted_prior

    question_lp = torch.tensor([-3.0, -15.0, -8.0])  # (K,) log p_G(x|z), far apart as SmolLM2's are
    scores = torch.tensor([3.0, 1.0, 2.0])  # (K,) retriever logits
    for t in (0.5, 1.0, 2.0):
        want = torch.log_softmax((scores + 0.5 * question_lp) / t, 0)
        torch.testing.assert_close(voted_prior(scores, question_lp, 0.5, t), want, atol=1e-6, rtol=0)

    class Stub:  # the prefill alone
        def prefill(self, prompts, keep_prompt_logprobs=0):
            return torch.zeros(3, 5), SimpleNamespace(prompt_lp=None)  # (K, V), state

        def stop_token_ids(self, style):
            return [0]

    q = prefill(Stub(), [[1]] * 3, scores, RagSettings(preset="paper", prior_temperature=2.0).decoding, PAPER)
    torch.testing.assert_close(q.prior, torch.log_softmax(scores / 2.0, 0), atol=1e-6, rtol=0)
    assert q.extras == {}


def test_question_position_both_puts_the_question_before_the_passage(tiny_offline):
    gen = tiny_offline.stack.modes["token"].generator
    after, both = gen.messages(Q, FLEMING, 192, "short", "after"), gen.messages(Q, FLEMING, 192, "short", "both")
    assert after[-1]["content"].count(Q) == 1 and both[-1]["content"].count(Q) == 2
    assert both[-1]["content"].startswith(f"Question: {Q}\n\n{FLEMING.title}: ")
    assert both[-1]["content"].endswith(after[-1]["content"])
    # closed-book has no passage: unchanged
    assert gen.messages(Q, None, 192, "short", "both") == gen.messages(Q, None, 192, "short", "after")
    a = tiny_offline.answer(Q, "token", question_position="both")
    b = tiny_offline.answer(Q, "token")
    assert a.sequence_logprob != b.sequence_logprob  # another prompt, another model input


def test_passage_sentences_feed_only_the_chosen_sentences(tiny_offline, monkeypatch):
    seen = []
    gen = tiny_offline.stack.modes["token"].generator
    real = type(gen).prompt
    monkeypatch.setattr(type(gen), "prompt", lambda self, q, doc, *a: seen.append(doc) or real(self, q, doc, *a))
    a = tiny_offline.answer(Q, "token", passage_sentences=1)
    fleming = next(d for d in a.docs if d.title == "Alexander Fleming")
    assert fleming.read_sentences == [2] and fleming.text == FLEMING.text  # the UI still gets the whole passage
    fed = next(p for p in seen if p.title == "Alexander Fleming")
    assert fed.text == "In 1928 he discovered penicillin, the first broadly effective antibiotic."
    assert all(len(split_sentences(p.text)) == 1 for p in seen)
    assert "focus" in a.timings
    whole = tiny_offline.answer(Q, "token")
    assert all(d.read_sentences is None for d in whole.docs) and "focus" not in whole.timings


def test_shared_prefill_runs_once_and_changes_no_number(tiny_offline, monkeypatch):
    counts = []
    real_init = G.SharedPrefill.__init__

    def spy(self, gen):
        real_init(self, gen)
        counts.append(self)

    monkeypatch.setattr(G.SharedPrefill, "__init__", spy)
    for s in (RagSettings(preset="aided", k=3, max_new_tokens=5), RagSettings(preset="aided", k=3, max_new_tokens=5, num_beams=2)):
        both = tiny_offline.answers(Q, ["token", "sequence"], s)
        assert len(counts) == 1 and counts[0].prefills == 1  # one wrapper, one prefill, two modes
        counts.clear()
        for mode in ("token", "sequence"):
            alone = tiny_offline.answer(Q, mode, s)
            counts.clear()
            assert both[mode].token_ids == alone.token_ids
            # the same float32 computation on a copied state: equal (measured 0 difference); 1e-6 margin
            assert both[mode].sequence_logprob == pytest.approx(alone.sequence_logprob, abs=1e-6)
            torch.testing.assert_close(torch.tensor(both[mode].token_doc_posteriors),
                                       torch.tensor(alone.token_doc_posteriors), atol=1e-6, rtol=0)


def _is_span(tokens: list[int], span: list[int]) -> bool:
    t = len(tokens)
    return any(span[j: j + t] == tokens for j in range(len(span) - t + 1))


def test_span_ids_mark_whole_words_and_numbers_with_smollm2s_tokenizer(gen):
    """SmolLM2 writes numbers a digit a token: " 68.5 million" is " ", "6", "8", ".", "5",
    " million". A copy may end after "million", never after "6", "8", "." or "5" (a number's
    magnitude is part of it) and may not open at "8"; "Reykjavik" (four tokens) is not a word after "Rey"."""
    from rag_demo.reader.spans import SpanConstraint

    tok = gen.tokenizer
    span = gen.span_ids(Passage("p", "France", "About 68.5 million people; capital Reykjavik."), 192)
    pieces = tok.convert_ids_to_tokens(list(span))
    at = {p: i for i, p in enumerate(pieces)}  # last position of each piece
    assert [pieces[at["6"]], pieces[at["6"] + 1], pieces[at["6"] + 2], pieces[at["6"] + 3]] == ["6", "8", ".", "5"]
    six = at["6"]
    assert six in span.starts and six + 1 not in span.starts and at["Ġpeople"] in span.starts
    assert at["Ġmillion"] not in span.starts  # the magnitude is part of its number
    assert pieces[six + 4] == "Ġmillion"
    assert not {six + 1, six + 2, six + 3, six + 4} & span.stops and six + 5 in span.stops and len(span) in span.stops
    assert pieces[at["ĠRey"] + 1] == "k" and not {at["ĠRey"] + 1, at["ĠRey"] + 2} & span.stops
    eos = gen.stop_token_ids("short")
    c = SpanConstraint([span], [[0]], eos)
    for j in (six + 1, six + 2, six + 3):  # copied " 6", " 68", " 68.": only the next digit or "." (a soft end after a digit)
        assert c.allowed(0, list(span[six - 1: j])) == [span[j]]
    assert c.allowed(0, list(span[six - 1: six + 4])) == [span[six + 4]]  # " 68.5": only " million"
    assert set(eos) <= set(c.allowed(0, list(span[six - 1: six + 5])))  # " 68.5 million" may end


def test_extractive_answers_copy_a_span_of_the_passages(tiny_offline):
    gen = tiny_offline.stack.modes["token"].generator
    ends = set(gen.stop_token_ids("short"))
    for mode in ("token", "sequence"):
        a = tiny_offline.answer(Q, mode, extractive=True, answer_style="short", max_new_tokens=6)
        spans = [gen.span_ids(Passage(d.id, d.title, d.text), 192) for d in a.docs]
        body = [t for t in a.token_ids if t not in ends]
        assert body and any(_is_span(body, sp) for sp in spans), (mode, a.text)
        if mode == "sequence":  # every doc's candidate copies from that doc's own passage
            for c in a.candidates:
                text = c["text"].strip().rstrip(".").strip()
                assert text and any(text in f"{d.title}: {d.text}" for d in a.docs), c
        # the random tiny model left free writes tokens from all over its 49k vocabulary
        free = tiny_offline.answer(Q, mode, extractive=False, answer_style="short", max_new_tokens=6,
                                   title_candidates=False)  # a title is a span of its passage too
        assert not any(_is_span([t for t in free.token_ids if t not in ends], sp) for sp in spans)


def test_copy_sources_are_the_passages_holding_the_floor_of_p_z_x_and_the_top_one():
    from rag_demo.reader.spans import copy_sources

    log_prior = torch.tensor([0.25, 0.70, 0.04, 0.01]).log()  # (K,)
    assert copy_sources(log_prior, 0.05) == [0, 1]
    assert copy_sources(log_prior, 0.0) == [0, 1, 2, 3]
    assert copy_sources(log_prior, 1.0) == [1]  # the most likely passage, whatever the floor


def test_rag_token_copies_only_from_the_passages_over_the_floor(tiny_offline, monkeypatch):
    """The pipeline's RAG-Token search is handed one copy group: the K passages with floor 0, the
    most likely passage alone with floor 1; its answer is then a span of that passage (the
    mixture's own search: token_drafts off, whose per-doc drafts copy each doc's own passage)."""
    import rag_demo.reader.spans as E

    gen = tiny_offline.stack.modes["token"].generator
    ends = set(gen.stop_token_ids("short"))
    groups = []
    real = E.SpanConstraint
    monkeypatch.setattr(E, "SpanConstraint", lambda spans, g, e: groups.append(g) or real(spans, g, e))
    for floor in (0.0, 1.0):
        groups.clear()
        a = tiny_offline.answer(Q, "token", extractive=True, answer_style="short", max_new_tokens=6,
                                copy_min_prior=floor, num_beams=1, echo_retries=0, token_drafts=False)
        top = max(range(len(a.docs)), key=lambda z: a.docs[z].prior)
        assert groups and all(g == ([list(range(len(a.docs)))] if floor == 0 else [[top]]) for g in groups), groups
        if floor == 1.0:
            body = [t for t in a.token_ids if t not in ends]
            d = a.docs[top]
            assert body and _is_span(body, gen.span_ids(Passage(d.id, d.title, d.text), 192)), a.text


# ---------------------------------------------------------------- the reader's vote on p(z|x)


def _question_logprob(gen, prompt: list[int], question: str) -> float:
    """log p_G(question | what precedes it in `prompt`), from one plain forward pass of the
    whole prompt (no cache, no padding): the reference the prefill's tail is checked against."""
    n_q, n_after = gen.question_tail(prompt, question)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        lp = torch.log_softmax(gen.model(input_ids=ids).logits[0].float(), -1)  # (S, V)
    start = len(prompt) - n_after - n_q
    return float(sum(lp[j - 1, prompt[j]] for j in range(start, start + n_q)))


def test_question_tail_finds_the_question_after_the_passage(tiny_offline):
    gen = tiny_offline.stack.modes["token"].generator
    q_ids = gen.tokenizer(f" {Q}", add_special_tokens=False)["input_ids"]
    for style in ("short", "sentence"):
        for position in ("after", "both"):
            prompt = gen.prompt(Q, FLEMING, 192, style, position)
            n_q, n_after = gen.question_tail(prompt, Q)
            assert n_q == len(q_ids) and prompt[len(prompt) - n_after - n_q: len(prompt) - n_after] == q_ids
            # the last occurrence: the question after the passage, never the one before it
            before_passage = len(gen.tokenizer(FLEMING.text, add_special_tokens=False)["input_ids"])
            assert n_after < before_passage
    assert gen.question_tail(gen.prompt("Other words", FLEMING, 192, "short"), Q) is None


def test_prefill_scores_the_prompt_tail_as_a_plain_forward_pass(tiny_offline):
    gen = tiny_offline.stack.modes["token"].generator
    passages = [Passage(id=f"d#{i}", title=t, text=x) for i, (t, x) in enumerate(DOCS)]
    prompts = [gen.prompt(Q, p, 192, "short") for p in passages]  # different lengths: left padding
    n_q, n_after = gen.question_tail(prompts[0], Q)
    first_lp, state = gen.prefill(prompts, keep_prompt_logprobs=n_q + n_after)
    plain_first, plain_state = gen.prefill(prompts)
    assert plain_state.prompt_lp is None and state.prompt_lp.shape == (3, n_q + n_after)
    # float32, same weights, padded batch vs one unpadded row: measured differences ~1e-6; 1e-4 margin
    torch.testing.assert_close(first_lp, plain_first, atol=1e-4, rtol=0)
    for i, one in enumerate(prompts):
        want = _question_logprob(gen, one, Q)
        assert float(state.prompt_lp[i, :n_q].sum()) == pytest.approx(want, abs=1e-3)
    with pytest.raises(ValueError, match="keep_prompt_logprobs=999 is out of range"):
        gen.prefill(prompts, keep_prompt_logprobs=999)
    shared = G.SharedPrefill(gen)
    _, a = shared.prefill(prompts, keep_prompt_logprobs=n_q + n_after)
    _, b = shared.prefill(prompts, keep_prompt_logprobs=n_q + n_after)
    assert shared.prefills == 1 and torch.equal(a.prompt_lp, state.prompt_lp) and a.prompt_lp is not b.prompt_lp
    shared.prefill(prompts[:1])  # another prompt set between the two modes (context contrast's)
    _, c = shared.prefill(prompts, keep_prompt_logprobs=n_q + n_after)
    assert shared.prefills == 2 and torch.equal(c.prompt_lp, state.prompt_lp)  # the K prompts were kept


def test_question_weight_adds_the_readers_log_likelihood_to_the_prior(tiny_offline):
    """p(z|x) = softmax(20 * cos / T + w * log p_G(x|z)), for both RAG modes, and every formula
    uses it: w = 0 is the retriever's prior (test above), w > 0 moves mass to the passages
    after which the generator finds the question likely."""
    gen = tiny_offline.stack.modes["token"].generator
    base = tiny_offline.answer(Q, "token", question_weight=0)
    scores = torch.tensor([d.score for d in base.docs])
    assert all(d.question_logprob is None for d in base.docs)
    s = tiny_offline.settings
    prompts = [prompt(gen, Q, Passage(id=d.id, title=d.title, text=d.text), s.decoding, s.aids) for d in base.docs]
    q_lp = torch.tensor([_question_logprob(gen, p, Q) for p in prompts])  # (K,)
    for w in (0.5, 2.0):
        for mode in ("token", "sequence"):
            a = tiny_offline.answer(Q, mode, question_weight=w)
            assert [d.question_logprob for d in a.docs] == pytest.approx(q_lp.tolist(), abs=1e-3)
            want = torch.softmax(scores * 20.0 + w * q_lp, 0)
            # float32 softmax of inputs equal within 1e-3 (above), times w <= 2: 5e-3 is margin
            assert [d.prior for d in a.docs] == pytest.approx(want.tolist(), abs=5e-3)
            assert a.token_doc_posteriors != base.token_doc_posteriors or mode == "sequence"
    # the passage the generator finds the question most likely after gains on the least likely:
    # their log-odds move by exactly w times their log p_G(x|z) gap
    a = tiny_offline.answer(Q, "token", question_weight=2.0)
    best, worst = int(q_lp.argmax()), int(q_lp.argmin())
    odds = lambda ans: math.log(ans.docs[best].prior) - math.log(ans.docs[worst].prior)  # noqa: E731
    assert q_lp[best] > q_lp[worst]
    # float32 priors near 1 lose ~1e-7 relative: the log-odds within 0.05 (w * gap here is ~1-10)
    assert odds(a) - odds(base) == pytest.approx(2.0 * float(q_lp[best] - q_lp[worst]), abs=0.05)


def test_encoder_decoder_generators_do_not_predict_their_input(tiny_ckpts):
    from rag_demo.models.stacks import load_rag_checkpoint

    _, gen = load_rag_checkpoint(str(tiny_ckpts["rag_token"]), "token")
    prompt = gen.prompt(Q, FLEMING, 64)
    assert gen.question_tail(prompt, Q) is None
    with pytest.raises(ValueError, match="keep_prompt_logprobs=3: an encoder-decoder generator reads its input"):
        gen.prefill([prompt], keep_prompt_logprobs=3)


def test_the_shared_prompt_prefix_runs_once_and_each_row_reads_its_own_prompt(tiny_offline):
    """The K prompts share their opening (system prompt, chat header): prefill runs it once and
    copies its cache. Each row's next-token log-probs, then and after one more token, equal
    that prompt prefilled alone (one row: its opening then comes from the kept prefix)."""
    gen = tiny_offline.stack.modes["token"].generator
    passages = [Passage(id=f"d#{i}", title=t, text=x) for i, (t, x) in enumerate(DOCS)]
    prompts = [gen.prompt(Q, p, 192, "short") for p in passages]
    P = KV.shared_prefix(prompts)
    assert P >= KV.MIN_SHARED_PREFIX and all(p[:P] == prompts[0][:P] for p in prompts)
    assert prompts[0][P] != prompts[1][P] or prompts[0][P] != prompts[2][P]  # the longest shared prefix
    assert KV.shared_prefix(prompts[:1]) == 0 and KV.shared_prefix([[1] * 40, [1] * 40], keep=1) == 39
    assert KV.shared_prefix([[1] * 10 + [2], [1] * 10 + [3]]) == 0  # under MIN_SHARED_PREFIX: not worth a call
    calls = []
    real = gen.model.model.forward
    gen.model.model.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or real(*a, **k)
    gen.openings.kept = []  # nothing kept from earlier tests (test_prefix_cache.py covers what is kept)
    gen.hidden_cache.clear()  # nor their prompts' hidden states (read instead of run: test_kept_states.py)
    try:
        first, state = gen.prefill(prompts)
    finally:
        gen.model.model.forward = real
    assert calls[0] == (1, P) and calls[1][0] == 3  # the prefix as one row, then the rest of each prompt
    nxt = torch.tensor([[5], [6], [7]])
    after = gen.advance(state, nxt)[:, -1]  # (3, V)
    for i, p in enumerate(prompts):
        alone_first, alone = gen.prefill([p])
        # float32, the same prompt computed in two pieces vs one: measured ~1e-6; 1e-4 margin
        torch.testing.assert_close(first[i], alone_first[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(after[i], gen.advance(alone, nxt[i:i + 1])[0, -1], atol=1e-4, rtol=0)


def test_worked_examples_open_every_prompt_in_the_answer_style(tiny_offline):
    gen = tiny_offline.stack.modes["token"].generator

    from rag_demo.reader.examples import WORKED_EXAMPLES

    assert KNOBS["worked_examples"].hi == len(WORKED_EXAMPLES)  # the knob reaches every example there is
    (t1, x1, q1, span1, sent1), (t2, _, q2, span2, _) = WORKED_EXAMPLES[:2]
    for style, answer in (("short", f"{P.SHORT_ANSWER_CUE} {span1}."), ("sentence", sent1)):
        none, one, two = (gen.messages(Q, FLEMING, 192, style, examples=WORKED_EXAMPLES[:n]) for n in (0, 1, 2))
        assert len(none) == 2 and len(one) == 4 and len(two) == 6
        assert one[0] == none[0] and one[-1] == none[-1] and two[:3] == one[:3]  # examples go between
        assert one[1]["role"] == "user" and one[1]["content"].startswith(f"{t1}: {x1}") and q1 in one[1]["content"]
        assert one[2] == {"role": "assistant", "content": answer}
        assert two[3]["content"].startswith(f"{t2}: ") and q2 in two[3]["content"]
        # closed-book: the same examples without their passages
        cb = gen.messages(Q, None, 192, style, examples=WORKED_EXAMPLES[:1])
        assert cb[1]["content"] == f"Question: {q1}" and cb[2] == one[2] and cb[-1]["content"] == f"Question: {Q}"
    # the K prompts share the examples: they lie inside the prefix computed once
    prompts = [gen.prompt(Q, Passage(id=f"d#{i}", title=t, text=x), 192, "short", examples=WORKED_EXAMPLES[:2])
               for i, (t, x) in enumerate(DOCS)]
    opening = gen.tokenizer.apply_chat_template(gen.messages(Q, FLEMING, 192, "short", examples=WORKED_EXAMPLES[:2])[:5], tokenize=True)
    opening = opening["input_ids"] if hasattr(opening, "keys") else opening
    assert KV.shared_prefix(prompts) >= len(opening) - 1
    a, b = tiny_offline.answer(Q, "token", worked_examples=0), tiny_offline.answer(Q, "token", worked_examples=2)
    assert a.sequence_logprob != b.sequence_logprob  # another model input


def test_recase_question_hands_the_generator_the_passages_casing(tiny_offline, monkeypatch):
    seen = []
    gen = tiny_offline.stack.modes["token"].generator
    real = type(gen).prompt
    monkeypatch.setattr(type(gen), "prompt", lambda self, q, doc, *a, **kw: seen.append((q, doc)) or real(self, q, doc, *a, **kw))
    typed = "who discovered penicillin in ayrshire"
    out = tiny_offline.answers(typed, ["token", "closed-book"], recase_question=True)
    a = out["token"]
    assert {q for q, doc in seen if doc is not None} == {"Who discovered penicillin in Ayrshire?"}
    assert {q for q, doc in seen if doc is None} == {"Who discovered penicillin in ayrshire?"}  # no passages
    assert a.question == typed and a.read_question == "Who discovered penicillin in Ayrshire?"
    assert out["closed-book"].read_question == "Who discovered penicillin in ayrshire?"
    seen.clear()
    b = tiny_offline.answer(typed, "token", recase_question=False)
    assert {q for q, _ in seen} == {typed} and b.read_question == ""
    assert [d.id for d in a.docs] == [d.id for d in b.docs]  # retrieval and p(z|x) unchanged
    assert [d.prior for d in a.docs] == pytest.approx([d.prior for d in b.docs], abs=1e-6)
    assert a.sequence_logprob != b.sequence_logprob  # another prompt, another model input


def test_length_penalty_reaches_every_beam_search(tiny_offline, monkeypatch):
    """RagSettings.length_penalty is the one beam search ranks finished answers by, in both RAG
    modes and closed-book (decoding's own tests check what it does with it)."""
    from rag_demo.rag import engine

    seen = []
    real = engine.search
    monkeypatch.setattr(engine, "search", lambda *a, **kw: seen.append(a[3].length_penalty) or real(*a, **kw))
    for lp in (0.0, 2.0):
        seen.clear()
        tiny_offline.answers(Q, ["token", "sequence", "closed-book"], num_beams=2, length_penalty=lp)
        assert len(seen) >= 3 and set(seen) == {lp}


# ---------------------------------------------------------------- RAG-Token with each doc's drafts


def test_token_drafts_ranks_the_beams_and_each_docs_drafts_by_rag_token_log_p(tiny_offline):
    """token_drafts: RAG-Token's candidates are its own beams plus RAG-Sequence's per-doc drafts
    (same settings, so the same drafts), each scored by the exact RAG-Token log p(y|x); the answer
    is the best of them, so it never scores below the plain search's answer, whose score the
    drafts path must reproduce."""
    questions = [Q, "What is the highest mountain in Africa?", "Who wrote Hamlet?"]
    changed = 0
    for q in questions:
        kw = dict(num_beams=2, max_new_tokens=6, answer_style="short")
        plain = tiny_offline.answer(q, "token", token_drafts=False, **kw)
        wide = tiny_offline.answer(q, "token", token_drafts=True, **kw)
        seq = tiny_offline.answer(q, "sequence", **kw)
        assert not plain.candidates and "drafts" not in plain.decoding
        assert wide.decoding == "beam=2, with each doc's drafts"
        scores = {c["text"]: c["logprob"] for c in wide.candidates}
        bounds = {c["text"] for c in wide.candidates if c.get("upper_bound")}
        assert {c["text"] for c in seq.candidates} <= set(scores)  # every doc's drafts competed
        # the same tokens scored in a batch of candidates (padded rows) and alone: float32 sums of
        # ~-21 nats on the random model agree to ~1e-3, whichever CPU; a candidate left behind
        # early reports an upper bound of its score
        assert plain.text in scores
        if plain.text in bounds:
            assert scores[plain.text] >= plain.sequence_logprob - 5e-3
        else:
            assert math.isclose(scores[plain.text], plain.sequence_logprob, abs_tol=5e-3)
        assert wide.text not in bounds and math.isclose(scores[wide.text], wide.sequence_logprob, abs_tol=5e-3)
        assert all(scores[t] <= wide.sequence_logprob + 5e-3 for t in scores if t not in bounds)
        assert wide.sequence_logprob >= plain.sequence_logprob - 5e-3
        changed += wide.text != plain.text
        # the answer's attribution is its own: the token posteriors' rows are distributions over K
        assert len(wide.token_doc_posteriors) == len(wide.tokens)
        assert all(math.isclose(sum(row), 1.0, abs_tol=1e-4) for row in wide.token_doc_posteriors)
    assert changed, "no question's answer changed: the drafts never won on the tiny model"


def test_token_drafts_are_drafted_once_for_both_modes_and_change_nothing(tiny_offline, monkeypatch):
    """Asked in both RAG modes, the K docs' drafts run once (generators.SharedPrefill.shared): the
    RAG-Token answer with drafts is the one it gives alone, and RAG-Sequence's is unchanged."""
    from rag_demo.rag import engine

    groups = []
    real = engine.search
    monkeypatch.setattr(engine, "search", lambda *a, **kw: groups.append(a[2]) or real(*a, **kw))
    kw = dict(num_beams=2, max_new_tokens=6, answer_style="short", token_drafts=True, echo_retries=0)
    both = tiny_offline.answers(Q, ["sequence", "token"], **kw)
    k = len(both["token"].docs)
    assert groups.count(k) == 1, groups  # one search with a group per doc: the drafts, shared
    groups.clear()
    alone = tiny_offline.answer(Q, "token", **kw)
    assert groups.count(k) == 1 and alone.text == both["token"].text
    assert math.isclose(alone.sequence_logprob, both["token"].sequence_logprob, abs_tol=1e-4)
    assert tiny_offline.answer(Q, "sequence", **kw).text == both["sequence"].text


def test_the_cost_estimate_counts_token_drafts_once_per_question(tiny_offline):
    """pipeline.estimate: RAG-Token's drafts cost their decoding when it asks alone, only their
    ranking when RAG-Sequence (same generator) drafts them in the same request, nothing when off."""
    def token_s(modes, **kw):
        return tiny_offline.estimate(Q, modes, RagSettings(preset="aided", **kw)).per_mode["token"]

    alone, shared, off = token_s(["token"]), token_s(["sequence", "token"]), token_s(["token"], token_drafts=False)
    assert alone > shared > off
    assert token_s(["token"], token_drafts=True, context_contrast=1.0) == pytest.approx(
        token_s(["token"], token_drafts=False, context_contrast=1.0))  # contrast turns the drafts off


def test_title_candidates_add_each_passages_title_as_an_answer_of_its_doc(tiny_offline):
    """title_candidates (short answers): every retrieved passage's title, " Title.", competes among
    RAG-Sequence's candidates (and RAG-Token's, with its drafts), scored under its own doc: its
    fast score is log p(z|x) + log p(title | x, z); off, the random model never drafts a title."""
    gen = tiny_offline.stack.modes["token"].generator
    kw = dict(num_beams=1, max_new_tokens=6, answer_style="short", echo_retries=0)
    on = tiny_offline.answers(Q, ["sequence", "token"], title_candidates=True, **kw)
    off = tiny_offline.answers(Q, ["sequence", "token"], title_candidates=False, **kw)
    titles = {f"{d.title}." for d in on["sequence"].docs}
    for mode in ("sequence", "token"):
        assert titles <= {c["text"] for c in on[mode].candidates}, (mode, on[mode].candidates)
        assert not titles & {c["text"] for c in off[mode].candidates}
    # in the engine, a title's fast score is log p(z|x) + log p(title | x, z): checked against a
    # plain forward pass of prompt z followed by the title (no cache, no padding)
    from aids import aided
    from rag_demo.rag.engine import rag_sequence

    passages = [Passage(f"d{i}", t, x) for i, (t, x) in enumerate(DOCS)]
    prompts = [gen.prompt(Q, d, 192, "short") for d in passages]
    titles = [gen.title_answer_ids(d.title) for d in passages]
    assert gen.decode(titles[0]) == "Alexander Fleming." and titles[0] == gen.title_answer_ids(" Alexander Fleming. ")
    scores = torch.tensor([2.0, 0.5, 0.0])
    s = RagSettings(preset="paper", k=3, max_new_tokens=4, answer_style="short", sequence_decoding="fast",
                    title_candidates=True)
    g = rag_sequence(gen, prompts, scores, s.decoding, aided(gen, s, prompts, Q, passages))
    prior = torch.log_softmax(scores, -1)
    for z, t in enumerate(titles):
        with torch.inference_mode():
            lp = torch.log_softmax(gen.model(input_ids=torch.tensor([prompts[z] + t])).logits[0].float(), -1)
        want = float(prior[z]) + sum(float(lp[len(prompts[z]) - 1 + i, tok]) for i, tok in enumerate(t))
        got = next(sc for toks, sc in g.candidates if toks == t)
        assert math.isclose(got, want, abs_tol=5e-3), (z, got, want)
