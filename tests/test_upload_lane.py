"""An upload beside a class: read and embedded in the server's one upload lane, priced from its first
batch, and each batch a model call of its own at the shared gate, so no visitor's answer waits on
it for more than one batch (serving/admission.py, serving/session.py). Real MiniLM encoder."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from rag_demo.knowledge.corpus import Corpus, Passage
from rag_demo.models.encoders import PASSAGE_BATCH
from rag_demo.serving.admission import Serving
from rag_demo.serving.budget import Budget
from rag_demo.serving.scheduler import StepScheduler
from rag_demo.serving.session import embed_corpus
from rag_demo.web import validation


def _corpus(n: int) -> Corpus:
    return Corpus("Your documents: notes.txt", [
        Passage(f"notes-{i}", f"Note {i}", f"Passage number {i} says that the river {i} floods in spring "
                                           f"and the town of Place{i} keeps boats ready for it.")
        for i in range(n)])


def _base(encoder):
    return SimpleNamespace(stack=SimpleNamespace(ctx_encoder=encoder))


def _quiet(*args, **kwargs) -> None:
    return None


def test_a_visitors_step_waits_on_an_upload_for_one_batch_at_most(minilm):
    """A visitor's model call that arrives while an upload's first batch runs goes next, before the
    upload's second batch; the upload's batches are calls of their own ("embed"), one per batch."""
    sched = StepScheduler()
    in_batch, other_queued = threading.Event(), threading.Event()

    class Watched(Serving):
        def embed_turn(self):
            turn = super().embed_turn()

            @contextmanager
            def watched():
                with turn as run:
                    if not in_batch.is_set():  # the first batch holds the model
                        in_batch.set()
                        assert other_queued.wait(30)
                    yield run
            return watched()

    serving = Watched(budget=Budget(), gate=sched)
    corpus = _corpus(3 * PASSAGE_BATCH)

    def other_visitor() -> None:
        assert in_batch.wait(30)
        threading.Thread(target=lambda: other_queued.set() if sched.wait_queued(1, 30) else None).start()
        with sched.step(0, what="a visitor's prefill"):
            pass

    t = threading.Thread(target=other_visitor)
    t.start()
    index = embed_corpus(_base(minilm), corpus, _quiet, serving)
    t.join(30)
    order = [b.what for b in sched.recent]
    assert order == ["embed", "a visitor's prefill", "embed", "embed"], order
    assert len(index.corpus) == len(corpus)


def test_an_upload_over_the_budget_is_refused_after_its_first_batch(minilm):
    sched = StepScheduler()
    serving = Serving(budget=Budget(max_upload_seconds=1e-6), gate=sched)
    with pytest.raises(ValueError) as e:
        embed_corpus(_base(minilm), _corpus(3 * PASSAGE_BATCH), _quiet, serving)
    msg = str(e.value)
    assert f"hold {3 * PASSAGE_BATCH} passages" in msg and "over the limit of 0 s" in msg, msg
    assert "upload fewer or smaller files" in msg
    assert [b.what for b in sched.recent] == ["embed"]  # priced on its first batch, the rest never ran
    # within the budget: every batch runs
    ok = Serving(budget=Budget(), gate=StepScheduler())
    assert len(embed_corpus(_base(minilm), _corpus(PASSAGE_BATCH + 1), _quiet, ok).corpus) == PASSAGE_BATCH + 1


def test_the_upload_lane_holds_one_upload_and_a_second_waits_its_turn():
    serving = Serving(budget=Budget(time_limit_s=30))
    told, released = threading.Event(), threading.Event()
    got = []

    def second() -> None:
        with serving.upload_lane(wait=told.set) as held:
            got.append(held)

    with serving.upload_lane() as held:
        assert held
        with serving.upload_lane(block=False) as free:  # a validator does not wait
            assert free is False
        t = threading.Thread(target=second)
        t.start()
        assert told.wait(30)  # the second upload was told it waits
        assert got == []
        released.set()
    t.join(30)
    assert got == [True]
    with serving.upload_lane(block=False) as free:  # released again
        assert free


def test_a_second_upload_that_waits_past_the_time_limit_gets_a_message():
    serving = Serving(budget=Budget(time_limit_s=0.05))
    with serving.upload_lane():
        box = []

        def second() -> None:
            try:
                with serving.upload_lane():
                    box.append("ran")
            except ValueError as e:
                box.append(str(e))
        t = threading.Thread(target=second)
        t.start()
        t.join(30)
    assert "one upload at a time: try again in a minute" in box[0], box


def test_the_validator_reads_the_files_only_in_the_upload_lane(tmp_path):
    """While another upload holds the lane the validator checks what needs no reading (count, sizes,
    types) and leaves the reading to the handler, which waits its turn; with the lane free it reads."""
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    exe = tmp_path / "program.exe"
    exe.write_bytes(b"MZ" * 10)
    serving = Serving(budget=Budget())
    assert "looks binary" in validation.validate_upload([str(binary)], None, serving)[0]["message"]
    with serving.upload_lane():
        busy = validation.validate_upload([str(binary)], None, serving)
        assert busy[0]["is_valid"]  # not read here: the handler reads it in its turn
        assert "unsupported type .exe" in validation.validate_upload([str(exe)], None, serving)[0]["message"]
    with pytest.raises(ValueError, match="looks binary"):
        validation.check_upload([str(binary)])


def test_every_kind_of_request_gives_its_freed_memory_back(monkeypatch):
    """Every endpoint is wrapped by logs_refusals, which trims the heap however the request ends:
    returned, refused, failed, streamed to its end or refused mid-stream."""
    import gradio as gr

    from rag_demo.serving import memory

    trims = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(1) or True)

    @validation.logs_refusals
    def upload(x):
        if x == "refuse":
            raise gr.Error("no", print_exception=False)
        if x == "fail":
            raise RuntimeError("pypdf broke")
        return x

    @validation.logs_refusals
    def choose_corpus(x):
        yield 1
        if x == "refuse":
            raise ValueError("refused mid-stream")
        yield 2

    assert upload("ok") == "ok" and len(trims) == 1
    for bad in ("refuse", "fail"):
        with pytest.raises(gr.Error):
            upload(bad)
    assert len(trims) == 3
    assert list(choose_corpus("ok")) == [1, 2] and len(trims) == 4
    with pytest.raises(gr.Error):
        list(choose_corpus("refuse"))
    assert len(trims) == 5


def test_with_a_model_thread_an_uploads_batches_and_an_edits_passage_are_embedded_on_it(minilm):
    """Each batch of an upload runs on the server's model thread (where every model call runs, with
    torch's intra-op threads), not in the visitor's thread; the vectors are those it gets without."""
    from rag_demo.serving.model_thread import ModelThread
    from rag_demo.serving.session import Edits

    mt = ModelThread()
    ran_on = []

    class Watched(type(minilm)):
        def passage_vectors(self, passages):
            ran_on.append(threading.get_ident())
            return super().passage_vectors(passages)

    encoder = object.__new__(Watched)
    encoder.__dict__.update(minilm.__dict__)
    serving = Serving(budget=Budget(), gate=StepScheduler(model_thread=mt))
    corpus = _corpus(PASSAGE_BATCH + 1)
    index = embed_corpus(_base(encoder), corpus, _quiet, serving)
    assert ran_on and set(ran_on) == {mt.ident}, ran_on  # two batches, both on the model thread
    alone = embed_corpus(_base(minilm), corpus, _quiet, None)
    assert abs(index.embeddings - alone.embeddings).max() < 1e-5

    ran_on.clear()  # an edit's passage, as the page's edit_passage embeds it, inside the upload turn
    with serving.embed_turn() as run:
        edited = run(Edits(index).then, "notes-0", "The river floods in autumn.", None, encoder)
    assert ran_on == [mt.ident]
    assert "autumn" in edited.index(encoder).corpus.passages[0].text
    with Serving(budget=Budget()).embed_turn() as run:  # no gate: nothing to run through, run it here
        assert run is None
