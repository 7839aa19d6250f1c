"""A class asks at once: the StepScheduler serves every waiting visitor's decoding step in one model
call (serving/scheduler.py, models/batched_step.py). Each visitor must get the answer it gets alone,
one visitor's Stop or bad step must leave the others' answers as they were, and priorities and
one-call-at-a-time must still hold. Threads are ordered by events and the scheduler's own queue,
never by sleeps."""
from __future__ import annotations

import os
import threading

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.rag import engine  # noqa: E402
from rag_demo.rag.hooks import PAPER  # noqa: E402
from rag_demo.serving.model_thread import ModelThread  # noqa: E402
from rag_demo.serving.scheduler import StepScheduler  # noqa: E402
from tests.aids import aided  # noqa: E402
from tests.test_passage_cache import ATOL, DOCS, QUESTIONS, SCORES, _prompts, _same_generation  # noqa: E402


def _gen(folder, dtype=torch.float32):
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(folder, layers=2, kv_heads=1, seed=4, hidden=32)
    gen.model.to(dtype)
    gen.hidden_cache.resize(0)  # every step runs the model: what is batched is what is compared
    gen.passage_cache.resize(0)
    return gen


def _answer(gen, mode: str, q: str, docs, s: RagSettings, stop=None):
    if mode == "closed-book":
        return engine.closed_book(gen, gen.prompt(q, None, 192, s.decoding.answer_style), s.decoding, PAPER if s.preset == "paper" else aided(gen, s, [gen.prompt(q, None, 192, s.decoding.answer_style)], q, []), stop)
    prompts = _prompts(gen, q, s, docs)
    reader = aided(gen, s, prompts, q, docs) if s.preset == "aided" else PAPER
    fn = engine.rag_token if mode == "token" else engine.rag_sequence
    return fn(gen, prompts, SCORES[: len(docs)], s.decoding, reader, stop)


def _together(jobs, scheduler: StepScheduler):
    """Each job(gated generator) in its own thread, all through `scheduler`; -> their results (an
    exception is returned in its job's place)."""
    got: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait()
        gated = jobs[i][0]
        try:
            got[i] = jobs[i][1](gated)
        except Exception as e:  # noqa: BLE001 - returned, compared by the test
            got[i] = e
        finally:
            gated.leave()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a visitor never finished"
    return got


def _prefilled(gen, q, docs, s):
    return gen.prefill(_prompts(gen, q, s, docs))


@pytest.mark.parametrize("garbage", [False, True])
def test_two_states_in_one_forward_give_what_each_gets_alone(smollm_tokenizer_folder, garbage, monkeypatch):
    """advance_many over two questions' rows (K 3 and K 4, different lengths) gives each state the
    log-probs advance gives it alone, step after step of greedy decoding; also when every buffer
    made without a fill holds NaN (garbage): padding and spare room are never read as numbers."""
    if garbage:
        new_empty = torch.Tensor.new_empty

        def nan_empty(self, *args, **kwargs):
            out = new_empty(self, *args, **kwargs)
            return out.fill_(float("nan")) if out.is_floating_point() else out

        monkeypatch.setattr(torch.Tensor, "new_empty", nan_empty)
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", answer_style="short")
    (lp_a, st_a), (lp_b, st_b) = _prefilled(gen, QUESTIONS[0], DOCS[:3], s), _prefilled(gen, QUESTIONS[1], DOCS, s)
    # the two questions open alike: their caches hold the same opening tensors, read once for both
    assert st_a.cache.layers[0].prefix_k is st_b.cache.layers[0].prefix_k
    alone_a, alone_b = gen.select(st_a, torch.arange(3)), gen.select(st_b, torch.arange(4))
    tok_a, tok_b = lp_a.argmax(-1, keepdim=True), lp_b.argmax(-1, keepdim=True)  # (R, 1)
    for _ in range(5):
        together = gen.advance_many([(st_a, tok_a), (st_b, tok_b)])
        want = [gen.advance(alone_a, tok_a), gen.advance(alone_b, tok_b)]
        for got, w in zip(together, want):
            assert got.shape == w.shape
            torch.testing.assert_close(got, w, atol=1e-5, rtol=0)
        tok_a, tok_b = together[0][:, -1].argmax(-1, keepdim=True), together[1][:, -1].argmax(-1, keepdim=True)


def test_a_teacher_forced_pass_in_the_same_forward_as_decoding_steps(smollm_tokenizer_folder):
    """advance_many with one state decoding a token and another teacher-forcing a 4-token answer
    (lengths 1 and 4 in one forward): the step's log-probs are those advance gives alone, and the
    pass's are those advance_gather gives alone; both caches then hold what they hold alone."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", answer_style="short")
    (lp_a, st_a), (_lp_b, st_b) = _prefilled(gen, QUESTIONS[0], DOCS[:3], s), _prefilled(gen, QUESTIONS[1], DOCS, s)
    alone_a, alone_b = gen.select(st_a, torch.arange(3)), gen.select(st_b, torch.arange(4))
    tok_a = lp_a.argmax(-1, keepdim=True)  # (3, 1)
    answer = torch.tensor([[11, 12, 13, 14, 15]]).expand(4, -1)  # (4, 5) one answer under each doc
    got_a, got_b = gen.advance_many([(st_a, tok_a), (st_b, answer[:, :-1], answer[:, 1:])])
    want_a, want_b = gen.advance(alone_a, tok_a), gen.advance_gather(alone_b, answer[:, :-1], answer[:, 1:])
    assert got_a.shape == (3, 1, gen.vocab_size) and got_b.shape == (4, 4)
    torch.testing.assert_close(got_a, want_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_b, want_b, atol=1e-5, rtol=0)
    nxt = got_a[:, -1].argmax(-1, keepdim=True)  # (3, 1): one more step from the caches each call left
    torch.testing.assert_close(gen.advance_many([(st_a, nxt), (st_b, answer[:, -1:])]),
                               [gen.advance(alone_a, nxt), gen.advance(alone_b, answer[:, -1:])], atol=1e-5, rtol=0)


def test_a_class_s_steps_bring_few_distinct_row_counts_to_the_linear_layers():
    """Steps of 1 to 320 tokens run the linear layers over at most 36 distinct row counts (each count
    compiles its own kernels), never fewer rows than tokens and never 16 more; a visitor's own step
    (up to 16 tokens) runs exactly its rows."""
    from rag_demo.models.batched_step import padded_tokens

    counts = {padded_tokens(n) for n in range(1, 321)}
    assert len(counts) <= 36
    assert all(n <= padded_tokens(n) < n + 16 for n in range(1, 321))
    assert all(padded_tokens(n) == n for n in range(1, 17))


def test_a_visitors_scoring_joins_anothers_decoding_step(smollm_tokenizer_folder):
    """Through the scheduler, a teacher-forced pass (advance_gather) waiting beside a decoding step
    runs in the same model call, and each gets what it gets alone."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", answer_style="short")
    (lp_a, st_a), (_lp_b, st_b) = _prefilled(gen, QUESTIONS[0], DOCS[:3], s), _prefilled(gen, QUESTIONS[1], DOCS, s)
    tok_a = lp_a.argmax(-1, keepdim=True)  # (3, 1)
    answer = torch.tensor([[11, 12, 13]]).expand(4, -1)  # (4, 3)
    want = [gen.advance(gen.select(st_a, torch.arange(3)), tok_a),
            gen.advance_gather(gen.select(st_b, torch.arange(4)), answer[:, :-1], answer[:, 1:])]
    sched = StepScheduler()
    with sched.step():  # the model busy: both calls queue, then run as one
        got = [None, None]
        ga, gb = sched.gated(gen), sched.gated(gen)
        ta = threading.Thread(target=lambda: got.__setitem__(0, ga.advance(st_a, tok_a)))
        tb = threading.Thread(target=lambda: got.__setitem__(1, gb.advance_gather(st_b, answer[:, :-1], answer[:, 1:])))
        ta.start()
        tb.start()
        assert sched.wait_queued(2, timeout=60)
    ta.join(60)
    tb.join(60)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    last = sched.recent[-1]
    assert (last.members, last.forced, last.rows) == (2, 1, 3 + 4 * 2)


def test_a_bad_step_gets_its_error_and_the_others_run(smollm_tokenizer_folder):
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", answer_style="short")
    (lp_a, st_a), (_lp_b, st_b) = _prefilled(gen, QUESTIONS[0], DOCS[:3], s), _prefilled(gen, QUESTIONS[1], DOCS, s)
    alone = gen.select(st_a, torch.arange(3))
    tok = lp_a.argmax(-1, keepdim=True)  # (3, 1)
    bad = torch.full((4, 1), gen.vocab_size + 7)  # an id outside the vocabulary
    got = gen.advance_many([(st_a, tok), (st_b, bad)])
    assert isinstance(got[1], ValueError) and str(gen.vocab_size - 1) in str(got[1])
    torch.testing.assert_close(got[0], gen.advance(alone, tok), atol=1e-5, rtol=0)
    # a teacher-forced pass whose targets cannot be scored (ids outside the vocabulary, or not one a token)
    nxt = got[0][:, -1].argmax(-1, keepdim=True)  # (3, 1)
    answer = torch.tensor([[11, 12, 13]]).expand(4, -1)  # (4, 3)
    got = gen.advance_many([(st_a, nxt), (st_b, answer[:, :-1], torch.full((4, 2), gen.vocab_size)),
                            (st_b, answer[:, :-1], answer[:, 1:2])])
    assert isinstance(got[1], ValueError) and str(gen.vocab_size - 1) in str(got[1])
    assert isinstance(got[2], ValueError) and "one target id" in str(got[2])
    torch.testing.assert_close(got[0], gen.advance(alone, nxt), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_thread", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset", ["paper", "aided"])
def test_visitors_batched_get_the_answers_they_get_alone(smollm_tokenizer_folder, preset, dtype, model_thread):
    """Three visitors at once (RAG-Token, RAG-Sequence, closed-book, two questions) through one
    scheduler: every answer equals the one it gets alone, and steps really were batched; also with
    every model call on the model's own thread."""
    gen = _gen(smollm_tokenizer_folder, dtype)
    s = RagSettings(preset=preset, max_new_tokens=6, answer_style="short")
    jobs = [("token", QUESTIONS[0], DOCS[:3]), ("sequence", QUESTIONS[1], DOCS), ("closed-book", QUESTIONS[1], ()),
            ("token", QUESTIONS[1], DOCS[1:])]
    want = [_answer(gen, m, q, d, s) for m, q, d in jobs]
    # a batch waits for everyone still decoding: the test's order
    sched = StepScheduler(gather_s=10.0, model_thread=ModelThread() if model_thread else None)
    got = _together([(sched.gated(gen), lambda g, j=j: _answer(g, *j, s)) for j in jobs], sched)
    for g, w in zip(got, want):
        assert not isinstance(g, Exception), g
        _same_generation(g, w, ATOL[dtype])
    assert max(b.members for b in sched.recent) >= 2  # decoding steps of several visitors in one call


def test_one_visitor_stopped_leaves_the_others_unchanged(smollm_tokenizer_folder):
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", max_new_tokens=8, answer_style="sentence")
    eos = gen.eos_token_ids

    def no_eos(module, args, out):  # answers run to max_new_tokens: the stop comes while the other decodes
        out[..., eos] = -1e4
        return out

    gen.model.lm_head.register_forward_hook(no_eos)
    want = _answer(gen, "token", QUESTIONS[1], DOCS, s)
    sched = StepScheduler(gather_s=10.0)

    def stop():  # the visitor presses Stop once its steps have been batched with the other's
        return "cancelled" if any(b.members == 2 for b in list(sched.recent)) else None

    got = _together([(sched.gated(gen), lambda g: _answer(g, "token", QUESTIONS[0], DOCS[:3], s, stop)),
                     (sched.gated(gen), lambda g: _answer(g, "token", QUESTIONS[1], DOCS, s))], sched)
    assert got[0].stopped == "cancelled" and 1 <= len(got[0].tokens) < 8
    _same_generation(got[1], want, ATOL[torch.float32])
    assert len(got[1].tokens) == 8


def test_one_visitors_error_does_not_touch_the_batch(smollm_tokenizer_folder):
    """A visitor whose step cannot run gets its ValueError in its own thread; the visitor batched
    with it gets its answer as alone."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", max_new_tokens=6, answer_style="short")
    want = _answer(gen, "token", QUESTIONS[1], DOCS, s)
    sched = StepScheduler(gather_s=10.0)

    def broken(g):
        lp, st = g.prefill(_prompts(g, QUESTIONS[0], s, DOCS[:3]))
        g.advance(st, lp.argmax(-1, keepdim=True))  # a good step first: it joins the batch
        return g.advance(st, torch.full((3, 1), gen.vocab_size))  # then one outside the vocabulary

    got = _together([(sched.gated(gen), broken),
                     (sched.gated(gen), lambda g: _answer(g, "token", QUESTIONS[1], DOCS, s))], sched)
    assert isinstance(got[0], ValueError) and "vocabulary" in str(got[0])
    _same_generation(got[1], want, ATOL[torch.float32])


def test_cheap_before_expensive_and_one_call_at_a_time():
    """While one call runs, an expensive request queues, then a cheap one: the cheap one, later,
    goes first, and nobody is ever inside with another."""
    sched = StepScheduler()
    order: list[str] = []
    inside = []
    entered, release = threading.Event(), threading.Event()

    def holder():
        with sched.step(1):
            entered.set()
            assert release.wait(10)
            order.append("first")

    def worker(name: str, prio: int):
        with sched.step(prio):
            inside.append(name)
            assert len(inside) == 1
            order.append(name)
            inside.remove(name)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert entered.wait(10)
    for name, prio, queued in (("expensive", 1, 1), ("cheap", 0, 2)):
        threads.append(threading.Thread(target=worker, args=(name, prio)))
        threads[-1].start()
        assert sched.wait_queued(queued, 10)
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["first", "cheap", "expensive"]


def test_a_turn_wakes_the_call_whose_turn_it_is_not_every_waiting_one(monkeypatch):
    """Twenty calls queue behind a held one: each is woken about once, when its turn comes (one
    condition for all woke every waiting call at every turn: up to N²/2 wakeups), and all run, in order."""
    wakeups = []
    wait = threading.Condition.wait

    def counted(self, timeout=None):  # every condition's wait, the scheduler's included
        got = wait(self, timeout)
        wakeups.append(1)
        return got

    monkeypatch.setattr(threading.Condition, "wait", counted)
    sched = StepScheduler()
    order: list[int] = []
    entered, release = threading.Event(), threading.Event()

    def holder():
        with sched.step(0):
            entered.set()
            assert release.wait(10)

    def worker(i: int):
        with sched.step(0):
            order.append(i)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert entered.wait(10)
    n = 20
    for i in range(n):
        threads.append(threading.Thread(target=worker, args=(i,)))
        threads[-1].start()
        assert sched.wait_queued(i + 1, 10)
    wakeups.clear()  # wait_queued's own
    release.set()
    for t in threads:
        t.join(10)
    assert order == list(range(n))
    assert len(wakeups) <= 2 * n, len(wakeups)


def test_a_batch_holds_one_priority_and_at_most_max_rows(smollm_tokenizer_folder):
    """Steps queued behind a held call: the cheap ones run together first (as many rows as fit),
    the expensive one after them, alone."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", answer_style="short")
    states = [_prefilled(gen, QUESTIONS[i % 2], DOCS[:3], s) for i in range(4)]
    sched = StepScheduler(max_rows=6)  # two visitors of 3 rows
    entered, release = threading.Event(), threading.Event()
    got: dict = {}

    def holder():
        with sched.step(0):
            entered.set()
            assert release.wait(10)

    def step(i: int, prio: int):
        lp, st = states[i]
        got[i] = sched.gated(gen, prio).advance(st, lp.argmax(-1, keepdim=True))

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert entered.wait(10)
    for n, (i, prio) in enumerate([(0, 1), (1, 0), (2, 0), (3, 0)], start=1):
        threads.append(threading.Thread(target=step, args=(i, prio)))
        threads[-1].start()
        assert sched.wait_queued(n, 10)
    release.set()
    for t in threads:
        t.join(30)
    served = [b.members for b in sched.recent]
    assert served == [1, 2, 1, 1], served  # the held call; two cheap (6 rows); the third cheap; the expensive
    assert len(got) == 4


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_rows=0"):
        StepScheduler(max_rows=0)
    with pytest.raises(ValueError, match="gather_s=-1"):
        StepScheduler(gather_s=-1)


def test_waiting_for_other_visitors_is_not_charged_to_the_time_limit(monkeypatch):
    """A mode's share of the time limit counts its own time, not the time it waited while the model
    served other visitors (Run.waited: the scheduler's WaitClock)."""
    from rag_demo import runs

    now, waited = [100.0], [0.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: now[0])
    stop = runs.Run(seconds={"token": 10.0}, waited=lambda: waited[0]).stop_for("token")
    now[0] += 15.0
    waited[0] += 8.0  # 15 s have passed, 8 of them in the queue
    assert stop() is None
    now[0] += 4.0  # 11 s of its own
    assert stop() == "time_limit"


def test_the_scheduler_clocks_what_a_request_waits():
    """A call queued behind another's is clocked to its request; the call that ran at once is not."""
    sched = StepScheduler()
    mine, theirs = sched.clock(), sched.clock()
    entered, release = threading.Event(), threading.Event()

    def holder():
        with sched.step(0, clock=theirs):
            entered.set()
            assert release.wait(10)

    def waiter():
        with sched.step(0, clock=mine):
            pass

    a = threading.Thread(target=holder)
    a.start()
    assert entered.wait(10)
    b = threading.Thread(target=waiter)
    b.start()
    assert sched.wait_queued(1, 10)
    release.set()
    a.join(10)
    b.join(10)
    assert mine() > 0.0 and theirs() < mine()


def test_with_a_model_thread_every_model_call_runs_on_it_and_the_other_threads_take_one(smollm_tokenizer_folder):
    """Prefills, batched steps and teacher-forced passes all run on the model's thread, with its own
    intra-op threads, while the visitors' threads, started after it was made with others=1, run
    their own work on one; a model call's error is raised in the visitor's thread."""
    gen = _gen(smollm_tokenizer_folder)
    before = torch.get_num_threads()
    try:
        mt = ModelThread(threads=2, others=1)
        sched = StepScheduler(gather_s=10.0, model_thread=mt)
        s = RagSettings(preset="paper", max_new_tokens=4, answer_style="short")
        ran_on, counts, visitors = set(), [], []
        for name in ("prefill", "advance", "advance_many", "advance_gather"):
            def spy(*a, _f=getattr(gen, name), **k):
                ran_on.add(threading.get_ident())
                counts.append(torch.get_num_threads())
                return _f(*a, **k)
            setattr(gen, name, spy)

        def job(g, mode, q, docs):
            visitors.append(torch.get_num_threads())
            return _answer(g, mode, q, docs, s)

        got = _together([(sched.gated(gen), lambda g: job(g, "token", QUESTIONS[0], DOCS[:3])),
                         (sched.gated(gen), lambda g: job(g, "sequence", QUESTIONS[1], DOCS))], sched)
        assert not any(isinstance(g, Exception) for g in got), got
        assert ran_on == {mt.ident} and set(counts) == {2} and visitors == [1, 1]
        with pytest.raises(ZeroDivisionError):
            mt.run(lambda: 1 / 0)
        with pytest.raises(ValueError, match="threads=0"):
            ModelThread(threads=0)
    finally:
        torch.set_num_threads(before)


def test_a_pool_with_a_model_thread_warms_up_on_it_and_the_page_runs_its_model_calls_there(three_passage_pipe):
    """The app's wiring: the pool's warm-up (which calibrates the budget's speed) runs on the model
    thread, as every answer's model calls will, and the page's StepScheduler runs its calls there."""
    from rag_demo.serving.pool import PipelinePool
    from rag_demo.web.page import build_app

    mt = ModelThread()
    warmed_on = []

    class Pipe:  # loads at once; its warm-up records where it ran
        def warm_up(self, progress=None):
            warmed_on.append(threading.get_ident())
            return 0.0

    pool = PipelinePool(lambda stack, progress: Pipe(), unavailable=lambda s: None, corpora={}, model_thread=mt)
    pool.get("offline", timeout=30)
    assert warmed_on == [mt.ident]
    page_pool = PipelinePool.of(three_passage_pipe)
    page_pool.model_thread = mt
    gate = build_app(page_pool).rag_serving.gate
    assert gate.model_thread is mt and gate.call(threading.get_ident) == mt.ident
    assert build_app(PipelinePool.of(three_passage_pipe)).rag_serving.gate.model_thread is None  # none given


def test_closed_book_questions_share_their_opening_so_their_steps_batch_as_one_group(smollm_tokenizer_folder, monkeypatch):
    """A closed-book prompt holds once only the opening every question shares (system prompt, the last
    turn's header: Prompt.opening), not its whole self: two questions' states then read the same prefix
    tensors and a batched step attends over it once for both, each state getting what it gets alone."""
    import rag_demo.models.batched_step as batched_step

    gen = _gen(smollm_tokenizer_folder)
    p1, p2 = (gen.prompt(q, None, 192) for q in QUESTIONS[:2])
    assert p1.opening and p1.opening == p2.opening and list(p1[:p1.opening]) == list(p2[:p2.opening])
    assert list(p1[p1.opening:]) != list(p2[p2.opening:])  # the questions come after it
    (_, s1), (_, s2) = gen.prefill([p1]), gen.prefill([p2])
    assert s1.cache.layers[0].prefix_k is s2.cache.layers[0].prefix_k  # one opening, held once
    alone = [gen.advance(gen.select(st, torch.arange(1)), torch.tensor([[7]])) for st in (s1, s2)]  # (1, 1, V)
    groups = []
    real = batched_step.prefix_group_attention
    monkeypatch.setattr(batched_step, "prefix_group_attention",
                        lambda layer, qs, *a, **k: groups.append(len(qs)) or real(layer, qs, *a, **k))
    both = gen.advance_many([(s1, torch.tensor([[7]])), (s2, torch.tensor([[7]]))])
    assert groups and set(groups) == {2}, groups  # every layer: both states in one group
    for a, b in zip(alone, both):
        assert torch.allclose(a, b, atol=1e-5)
