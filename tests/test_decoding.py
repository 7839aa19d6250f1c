"""Decoding specification: greedy and beam search (rag_demo.rag.decoding) on lookup-table generators,
every expected answer worked out by hand.

The generator is a table p(next token | doc, prefix) over the vocabulary {A, B, EOS} (the pad
test adds PAD). Every row is a distribution (it sums to 1); the tables list every (doc, prefix)
the searches read, and reading any other row is an error. Notation: ln is the natural log,
[A, EOS] is a token sequence, ".5 * .4" multiplies table entries along a path.

Beam search follows transformers' `_beam_search` (num_beams = B):
  * each step takes the top 2B (beam, token) candidates by running score = sum of log-probs;
  * a candidate that emits EOS, or reaches max_new_tokens, is *finished*, but only if it is
    among the top B candidates; its score is sum_logprob / length ** length_penalty;
  * the best B candidates that did not finish keep running;
  * the search stops when B hypotheses are finished and the best running beam's score divided
    by (current length) ** length_penalty cannot beat the worst finished score (the
    early_stopping=False heuristic), or when every candidate finished.
A group returns its finished hypotheses, best score first; `Hyp.logprob` is the raw sum.
The search is told pad = PAD (id 3): the 3-token tables never produce it, it only fills the
unused tail of a finished beam's token row.

Table S (one doc): beam search finds a likelier answer than greedy.
    ()   : A .5   B .4   EOS .1
    (A)  : A .35  B .25  EOS .4
    (B)  : A .06  B .04  EOS .9

Table L (one doc): length normalisation ranks a longer, less likely answer first.
    ()     : A .5   B .4   EOS .1
    (A)    : A .12  B .08  EOS .8
    (B)    : A .05  B .9   EOS .05
    (B,B)  : A .06  B .04  EOS .9
    (A,A)  : A .2   B .3   EOS .5

Table H (one doc): the stop rule compares per-token scores.
    ()     : A .5   B .1   EOS .4
    (A)    : A .5   B .1   EOS .4
    (B)    : A .25  B .15  EOS .6
    (A,A)  : A .12  B .08  EOS .8
    (A,B)  : A .3   B .2   EOS .5

Table E (one doc): an EOS outside the top B candidates never finishes.
    ()   : A .4   B .35  EOS .25
    (A)  : A .3   B .2   EOS .5
    (B)  : A .3   B .2   EOS .5

Table G (two docs, searched as two independent groups, RAG-Sequence style):
    doc 0  ()      : A .3   B .1   EOS .6
           (EOS)   : A .7   B .2   EOS .1     (read only because group 1 is still running)
           (EOS,A) : A .2   B .3   EOS .5
    doc 1  ()      : A .7   B .2   EOS .1
           (A)     : A .3   B .6   EOS .1
           (A,B)   : A .15  B .05  EOS .8

Table F (three docs, prior p(z|x) = [.2, .3, .5]; RAG-Sequence fast vs thorough decoding):
    doc 0  ()   : A .6   B .3   EOS .1
           (A)  : A .06  B .04  EOS .9
           (B)  : A .3   B .2   EOS .5
    doc 1  ()   : A .45  B .5   EOS .05
           (A)  : A .06  B .04  EOS .9
           (B)  : A .12  B .08  EOS .8
    doc 2  ()   : A .45  B .5   EOS .05
           (A)  : A .06  B .04  EOS .9
           (B)  : A .1   B .06  EOS .84

Table F also ranks RAG-Token candidates (engine.rank_by_rag_token) with the priors [.9, .05, .05]
and [1/3, 1/3, 1/3].

Table M (two docs, prior p(z|x) = [1/4, 3/4] from scores [0, ln 3]; RAG-Token mixing):
    doc 0  ()   : A .7   B .25  EOS .05        doc 1  ()   : A .05  B .45  EOS .5
           (A)  : A .3   B .1   EOS .6                (A)  : A .2   B .1   EOS .7
           (B)  : A .06  B .04  EOS .9                (B)  : A .12  B .08  EOS .8
                                                     (EOS): A .4   B .3   EOS .3   (doc 1 searched alone)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import pytest
import torch

from rag_demo.config import Decoding, RagSettings
from rag_demo.models.stopping import StopRule
from rag_demo.rag import engine
from rag_demo.rag.decoding import Hyp, Rows, search
from rag_demo.rag.hooks import PAPER
from rag_demo.reader.drafts import rank_by_rag_token
from rag_demo.reader.spans import SpanConstraint
from rag_demo.models.generators import Generator
from rag_demo.models.prompts import Span
from rag_demo.rag.marginalize import doc_log_prior

A, B, EOS, PAD = 0, 1, 2, 3
NAMES = {A: "A", B: "B", EOS: "EOS", PAD: "PAD"}

S = {(0, ()): (.5, .4, .1), (0, (A,)): (.35, .25, .4), (0, (B,)): (.06, .04, .9)}
L = {
    (0, ()): (.5, .4, .1), (0, (A,)): (.12, .08, .8), (0, (B,)): (.05, .9, .05),
    (0, (B, B)): (.06, .04, .9), (0, (A, A)): (.2, .3, .5),
}
H = {
    (0, ()): (.5, .1, .4), (0, (A,)): (.5, .1, .4), (0, (B,)): (.25, .15, .6),
    (0, (A, A)): (.12, .08, .8), (0, (A, B)): (.3, .2, .5),
}
E = {(0, ()): (.4, .35, .25), (0, (A,)): (.3, .2, .5), (0, (B,)): (.3, .2, .5)}
G = {
    (0, ()): (.3, .1, .6), (0, (EOS,)): (.7, .2, .1), (0, (EOS, A)): (.2, .3, .5),
    (1, ()): (.7, .2, .1), (1, (A,)): (.3, .6, .1), (1, (A, B)): (.15, .05, .8),
}
M = {
    (0, ()): (.7, .25, .05), (0, (A,)): (.3, .1, .6), (0, (B,)): (.06, .04, .9),
    (1, ()): (.05, .45, .5), (1, (A,)): (.2, .1, .7), (1, (B,)): (.12, .08, .8), (1, (EOS,)): (.4, .3, .3),
}
F = {
    (0, ()): (.6, .3, .1), (0, (A,)): (.06, .04, .9), (0, (B,)): (.3, .2, .5),
    (1, ()): (.45, .5, .05), (1, (A,)): (.06, .04, .9), (1, (B,)): (.12, .08, .8),
    (2, ()): (.45, .5, .05), (2, (A,)): (.06, .04, .9), (2, (B,)): (.1, .06, .84),
}
PRIOR_M = doc_log_prior(torch.tensor([0.0, math.log(3.0)]))  # (2,) ln [1/4, 3/4]


# ---------------------------------------------------------------- the lookup-table generator


@dataclass
class TableState:
    """GenState-like rows: the doc each row is conditioned on and the tokens it was fed."""

    docs: list[int]  # (R,)
    prefixes: list[tuple[int, ...]]  # (R,)

    @property
    def rows(self) -> int:
        return len(self.docs)


class TableGenerator(Generator):
    """A language model read from a table: probs(doc, prefix) -> p(next token) (V,)."""

    kind = "table"
    name = "lookup table"
    eos_token_ids = [EOS]
    pad_token_id = PAD

    def __init__(self, probs: dict | Callable[[int, tuple[int, ...]], Sequence[float]]):
        self.probs = (lambda doc, prefix: probs[(doc, prefix)]) if isinstance(probs, dict) else probs
        self.advance_calls = 0
        self.read: set[tuple[int, tuple[int, ...]]] = set()  # every (doc, prefix) row looked up

    def _lp(self, doc: int, prefix: tuple[int, ...]) -> torch.Tensor:
        p = self.probs(doc, prefix)  # a KeyError here: the search read a row the hand trace never reaches
        self.read.add((doc, prefix))
        assert abs(sum(p) - 1) < 1e-12, (doc, prefix)  # a table row is a distribution (exact decimals)
        return torch.tensor(p, dtype=torch.float64).log().float()  # (V,)

    def prefill(self, prompts: Sequence[Sequence[int]], keep_prompt_logprobs: int = 0) -> tuple[torch.Tensor, TableState]:
        """One row per prompt; a prompt is [doc] -> first-step log-probs (R, V) and the state."""
        docs = [p[0] for p in prompts]
        return torch.stack([self._lp(d, ()) for d in docs]), TableState(docs, [()] * len(docs))

    vocab_size = 3

    def _hidden(self, state: TableState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed tokens (R, L), in place -> next-token log-probs after each of them (R, L, V), as
        the "hidden state": `_logits` is the identity, and log_softmax leaves log-probs unchanged,
        so the generator's own `advance` and `advance_gather` run on the table."""
        self.advance_calls += 1
        out = []
        for r, row in enumerate(tokens.tolist()):
            steps = []
            for tok in row:
                state.prefixes[r] = state.prefixes[r] + (tok,)
                steps.append(self._lp(state.docs[r], state.prefixes[r]))
            out.append(torch.stack(steps))
        return torch.stack(out)  # (R, L, V)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def select(self, state: TableState, rows: torch.Tensor) -> TableState:
        rows = rows.tolist()
        return TableState([state.docs[r] for r in rows], [state.prefixes[r] for r in rows])


def run(table, docs=(0,), num_beams=1, max_new_tokens=5, length_penalty=1.0, prior=None, pad=PAD, spans=None,
        eos=(EOS,)):
    """Search `table` the way the engine does -> (hypotheses per group, the generator).
    prior None: one group per doc (RAG-Sequence, closed-book); else one RAG-Token group over all docs."""
    gen = TableGenerator(table)
    gen.pad_token_id = pad
    lp, state = gen.prefill([[d] for d in docs])  # (K, V)
    procs = []
    if spans is not None:  # extractive: each group copies from its own doc's span, RAG-Token from all
        procs = [SpanConstraint(spans, [[z] for z in range(len(docs))] if prior is None else [list(range(len(docs)))],
                                [EOS])]
    if prior is None:
        rows, groups = Rows(gen, state, per_beam=1, prior=None, processors=procs), len(docs)
    else:
        rows, groups = Rows(gen, state, per_beam=len(docs), prior=prior, processors=procs), 1
    d = Decoding(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty)
    hyps = search(rows, lp, groups, d, eos if isinstance(eos, StopRule) else list(eos))
    return hyps, gen


def toks(hyps: list[Hyp]) -> list[list[str]]:
    return [[NAMES[t] for t in h.tokens] for h in hyps]


def ln(*probs: float) -> float:
    return sum(math.log(p) for p in probs)


def lp_close(got: float, want: float) -> bool:
    """Scores are float32 sums of float32 logs of the table's entries (and, for RAG-Token,
    float32 logsumexp/log_softmax): within 1.0e-7 of the exact value here (measured, at most 5
    terms of magnitude < 5); 1e-6 absolute is 10x that and far below any gap the tests tell apart
    (> 1e-2 between the scores of different answers)."""
    return got == pytest.approx(want, rel=0, abs=1e-6)


# ---------------------------------------------------------------- greedy vs beam search


def test_greedy_takes_the_locally_best_token():
    """Table S, greedy: step 1 argmax A (.5 > .4 > .1); after A argmax EOS (.4 > .35 > .25).
    Answer [A, EOS] (EOS included), log p = ln(.5 * .4) = ln .2 = -1.609; it stopped at EOS,
    so the generator advanced once (to read row (A))."""
    (hyps,), gen = run(S, max_new_tokens=3)
    assert toks(hyps) == [["A", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.5, .4))
    assert gen.advance_calls == 1


def test_beam_search_finds_the_likelier_answer_greedy_misses():
    """Table S, num_beams=2, length_penalty=1, max_new_tokens=3.

    step 1: candidates A .5, B .4, EOS .1 (+ 3 from the idle second beam at -1e9). [EOS] is
            3rd, outside the top B = 2, so it does not finish. Running: [A] .5, [B] .4.
    step 2: [A]: [A,A] .5*.35 = .175, [A,B] .125, [A,EOS] .2
            [B]: [B,A] .4*.06 = .024, [B,B] .016, [B,EOS] .36
            top 4: [B,EOS] .36, [A,EOS] .2, [A,A] .175, [A,B] .125. Both EOS candidates are in
            the top 2: finished with scores ln .36 / 2 = -0.511 and ln .2 / 2 = -0.805.
            Running: [A,A] .175, [A,B] .125.
            Stop: 2 finished, and the best running ln .175 / 2 = -0.872 < worst finished -0.805.
    Answer [B, EOS] (raw log p ln .36 = -1.022) before greedy's [A, EOS] (ln .2). The search
    stopped before max_new_tokens: one advance (to read rows (A) and (B)).
    """
    (hyps,), gen = run(S, num_beams=2, max_new_tokens=3)
    assert toks(hyps) == [["B", "EOS"], ["A", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.4, .9)) and lp_close(hyps[1].logprob, ln(.5, .4))
    assert gen.advance_calls == 1 and gen.read == set(S)


def test_beam_search_normalises_scores_by_length():
    """Table L, num_beams=2, length_penalty=1 (score = sum_logprob / length), max_new_tokens=4.

    step 1: A .5, B .4, EOS .1; [EOS] is 3rd: not finished. Running [A] .5, [B] .4.
    step 2: [A,A] .06, [A,B] .04, [A,EOS] .4, [B,A] .02, [B,B] .36, [B,EOS] .02.
            top 4: [A,EOS] .4, [B,B] .36, [A,A] .06, [A,B] .04. [A,EOS] finishes with
            ln .4 / 2 = -0.458. Running [B,B] .36, [A,A] .06. Only 1 of 2 finished: go on.
    step 3: [B,B]: [B,B,A] .36*.06 = .0216, [B,B,B] .0144, [B,B,EOS] .324
            [A,A]: [A,A,A] .012, [A,A,B] .018, [A,A,EOS] .03
            top 4: [B,B,EOS] .324, [A,A,EOS] .03, [B,B,A] .0216, [A,A,B] .018. Both EOS
            candidates finish: ln .324 / 3 = -0.376, ln .03 / 3 = -1.169. The best 2 finished:
            [B,B,EOS] -0.376, [A,EOS] -0.458. Stop: best running ln .0216 / 3 = -1.278 < -0.458.
    Answer [B, B, EOS] although its raw log p ln .324 = -1.127 is below [A, EOS]'s ln .4 = -0.916:
    per token it is likelier. Greedy picks A then EOS (.8): [A, EOS], ln .4.
    """
    (beam,), gen = run(L, num_beams=2, max_new_tokens=4)
    assert toks(beam) == [["B", "B", "EOS"], ["A", "EOS"]]
    assert lp_close(beam[0].logprob, ln(.4, .9, .9)) and lp_close(beam[1].logprob, ln(.5, .8))
    assert gen.advance_calls == 2 and gen.read == set(L)  # each running beam fed its own last token
    (greedy,), _ = run(L, max_new_tokens=4)
    assert toks(greedy) == [["A", "EOS"]] and lp_close(greedy[0].logprob, ln(.5, .8))


def test_without_length_normalisation_the_raw_sum_decides():
    """Table L, length_penalty=0 (score = sum_logprob): the same steps, but [A, EOS] finishes
    with ln .4 = -0.916 and [B, B, EOS] with ln .324 = -1.127, so [A, EOS] ranks first, as greedy's."""
    (hyps,), _ = run(L, num_beams=2, max_new_tokens=4, length_penalty=0.0)
    assert toks(hyps) == [["A", "EOS"], ["B", "B", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.5, .8)) and lp_close(hyps[1].logprob, ln(.4, .9, .9))


def test_search_goes_on_while_the_best_running_beam_could_still_win_per_token():
    """Table H, num_beams=2, length_penalty=1, max_new_tokens=4.

    step 1: A .5, EOS .4, B .1: [EOS] is 2nd, in the top 2: finished with ln .4 / 1 = -0.916.
            Running [A] .5, [B] .1.
    step 2: [A,A] .25, [A,EOS] .2, [B,EOS] .06, [A,B] .05 are the top 4 ([B,A] .025, [B,B] .015
            follow). [A,EOS] (2nd) finishes with ln .2 / 2 = -0.805; [B,EOS] is 3rd: dropped.
            Running [A,A] .25, [A,B] .05. Two finished, worst -0.916, but the best running
            beam per token, ln .25 / 2 = -0.693, beats it: go on (its raw ln .25 = -1.386 would not).
    step 3: [A,A,EOS] .2, [A,A,A] .03, [A,B,EOS] .025, [A,A,B] .02: [A,A,EOS] finishes with
            ln .2 / 3 = -0.536. Best 2 finished: [A,A,EOS] -0.536, [A,EOS] -0.805 ([EOS] drops out).
            Stop: best running ln .03 / 3 = -1.169 < -0.805.
    """
    (hyps,), gen = run(H, num_beams=2, max_new_tokens=4)
    assert toks(hyps) == [["A", "A", "EOS"], ["A", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.5, .5, .8)) and lp_close(hyps[1].logprob, ln(.5, .4))
    assert gen.advance_calls == 2 and gen.read == set(H)


def test_an_eos_outside_the_top_beams_never_finishes():
    """Table E, num_beams=2, length_penalty=0 (score = raw sum), max_new_tokens=2.

    step 1: A .4, B .35, EOS .25: [EOS] is 3rd, outside the top 2, so it is dropped, although
            its ln .25 = -1.386 would beat every answer finished later. Running [A] .4, [B] .35.
    step 2 (the limit): [A,EOS] .2, [B,EOS] .175, [A,A] .12, [B,A] .105 top the list; the top 2
            finish: [A,EOS] ln .2 = -1.609, [B,EOS] ln .175 = -1.743.
    """
    (hyps,), gen = run(E, num_beams=2, max_new_tokens=2, length_penalty=0.0)
    assert toks(hyps) == [["A", "EOS"], ["B", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.4, .5)) and lp_close(hyps[1].logprob, ln(.35, .5))


# ---------------------------------------------------------------- EOS and max_new_tokens


def test_greedy_cuts_each_group_after_its_eos():
    """Table G, greedy, two groups (doc 0, doc 1), max_new_tokens=5.

    step 1: doc 0 EOS (.6): group 0 is done; doc 1 A (.7).
    step 2: group 0 keeps decoding (rows are independent, no per-step masking): A (.7);
            doc 1 after A: B (.6).
    step 3: group 0: EOS (.5); doc 1 after A, B: EOS (.8). All done: stop (2 advances).
    Group 0's tokens after its first EOS are cut: [EOS], log p = ln .6 (the later .7 and .5 are
    not counted). Group 1: [A, B, EOS], ln(.7 * .6 * .8) = ln .336. Each hypothesis carries its
    row's log-prob of each kept token (attribution): [[ln .6]] and [[ln .7, ln .6, ln .8]].
    """
    (g0,), (g1,) = run(G, docs=(0, 1), max_new_tokens=5)[0]
    assert [toks([g0]), toks([g1])] == [[["EOS"]], [["A", "B", "EOS"]]]
    assert (g0.group, g1.group) == (0, 1)
    assert lp_close(g0.logprob, ln(.6)) and lp_close(g1.logprob, ln(.7, .6, .8))
    assert g0.row_lp.shape == (1, 1) and g1.row_lp.shape == (1, 3)
    assert all(lp_close(float(g), w) for g, w in zip(g1.row_lp[0], (ln(.7), ln(.6), ln(.8))))
    assert lp_close(float(g0.row_lp[0, 0]), ln(.6))


def test_a_soft_end_right_after_an_initial_does_not_end_the_answer():
    """StopRule: B ends an answer, except right after A (as "." after "U" in "U.S."). Table G,
    doc 1, greedy: A (.7), then B (.6), then EOS (.8). With B a plain end the answer is [A, B]
    (B after A ends it); with B soft after A, B goes on and EOS ends it: [A, B, EOS],
    ln(.7 * .6 * .8). Beam search (2 beams; Table G's doc 1, other rows A .25 B .25 EOS .5) obeys
    the same rule."""
    (plain,), _ = run(G, docs=(1,), eos=(EOS, B))[0], None
    assert toks(plain) == [["A", "B"]]
    rule = StopRule([EOS, B], soft=[B], after=[A])
    (soft,), _ = run(G, docs=(1,), eos=rule)[0], None
    assert toks(soft) == [["A", "B", "EOS"]] and lp_close(soft[0].logprob, ln(.7, .6, .8))
    assert rule.hits(torch.tensor([B, B, EOS, A]), torch.tensor([A, -1, A, A])).tolist() == [False, True, True, False]
    assert [rule.ends_at([A, B, B], i) for i in range(3)] == [False, False, True]
    def table(doc, prefix):  # Table G's doc 1 where it has a row, else A .25 B .25 EOS .5
        return G.get((doc, prefix), (.25, .25, .5))

    (beams,), _ = run(table, docs=(1,), num_beams=2, eos=rule)
    assert all(h.tokens[-2:] != [A, B] for h in beams)  # no beam ends on B right after A
    (plain_beams,), _ = run(table, docs=(1,), num_beams=2, eos=(EOS, B))
    assert ["A", "B"] in toks(plain_beams) and ["A", "B"] not in toks(beams)


def test_greedy_stops_at_max_new_tokens_without_eos():
    """Table G, greedy, max_new_tokens=2: steps 1 and 2 as above, then the limit. Group 1 ends
    without EOS: [A, B], ln(.7 * .6) = ln .42; group 0 is still [EOS], ln .6. One advance."""
    hyps, gen = run(G, docs=(0, 1), max_new_tokens=2)
    assert [toks(h) for h in hyps] == [[["EOS"]], [["A", "B"]]]
    assert lp_close(hyps[0][0].logprob, ln(.6)) and lp_close(hyps[1][0].logprob, ln(.7, .6))
    assert gen.advance_calls == 1


def test_beam_search_finishes_beams_cut_by_max_new_tokens():
    """Table L, num_beams=2, max_new_tokens=2. Step 1 as before (running [A] .5, [B] .4).
    Step 2 is the last: every candidate stops. Top 4: [A,EOS] .4, [B,B] .36, [A,A] .06,
    [A,B] .04; the top 2 finish: [A,EOS] with ln .4 / 2 = -0.458 and [B,B], cut without EOS,
    with ln .36 / 2 = -0.511. [A,A] and [A,B] are outside the top 2 and are dropped."""
    (hyps,), gen = run(L, num_beams=2, max_new_tokens=2)
    assert toks(hyps) == [["A", "EOS"], ["B", "B"]]
    assert lp_close(hyps[0].logprob, ln(.5, .8)) and lp_close(hyps[1].logprob, ln(.4, .9))
    assert gen.advance_calls == 1


def test_one_token_limit():
    """max_new_tokens=1 on Table S: greedy [A], ln .5, no advance at all. Beam search: the
    top 2 of A .5, B .4, EOS .1 finish at the limit: [A] (ln .5), [B] (ln .4); [EOS] is 3rd."""
    (greedy,), gen = run(S, max_new_tokens=1)
    assert toks(greedy) == [["A"]] and lp_close(greedy[0].logprob, ln(.5)) and gen.advance_calls == 0
    (beam,), _ = run(S, num_beams=2, max_new_tokens=1)
    assert toks(beam) == [["A"], ["B"]]
    assert lp_close(beam[0].logprob, ln(.5)) and lp_close(beam[1].logprob, ln(.4))


# ---------------------------------------------------------------- padding in finished beams


def test_beam_search_trims_pad_tokens_the_model_chose_at_the_limit():
    """Table P (vocabulary A, B, EOS, PAD; one doc), num_beams=2, max_new_tokens=2:
        ()    : A .6   B .06  EOS .04  PAD .3
        (A)   : A .12  B .1   EOS .08  PAD .7
        (PAD) : A .5   B .12  EOS .08  PAD .3
    step 1: top 4 A .6, PAD .3, B .06, EOS .04 ([EOS] is 4th: not finished). Running [A], [PAD].
    step 2 (the limit): [A,PAD] .42, [PAD,A] .15, [PAD,PAD] .09, [A,A] .072 are the top 4; the
    top 2 finish. [A, PAD] is shown as [A] (trailing padding, as the reference's output is read),
    its score still counts the PAD step: ln(.6 * .7) = ln .42. [PAD, A] keeps its leading PAD.
    """
    P = {(0, ()): (.6, .06, .04, .3), (0, (A,)): (.12, .1, .08, .7), (0, (PAD,)): (.5, .12, .08, .3)}
    (hyps,), _ = run(P, num_beams=2, max_new_tokens=2)
    assert toks(hyps) == [["A"], ["PAD", "A"]]
    assert lp_close(hyps[0].logprob, ln(.6, .7)) and lp_close(hyps[1].logprob, ln(.3, .5))


@pytest.mark.parametrize("pad", [PAD, EOS])
def test_beam_search_cut_by_a_stop_has_no_phantom_eos(pad):
    """Table S, num_beams=2, stopped after step 1 (a deadline): the running beams [A] (.5) and
    [B] (.4) finish where they are, [A] first. Their token rows are padded after step 1; when the
    pad id is the EOS id (SmolLM2 pads with <|im_end|>) the padding must not read as an emitted
    EOS: the answers are [A] and [B], not [A, EOS], and the scores count step 1 only. Without
    the stop the same search finishes [B, EOS] (ln .36) first."""
    gen = TableGenerator(S)
    gen.pad_token_id = pad
    lp, state = gen.prefill([[0]])  # (1, V)
    rows = Rows(gen, state, per_beam=1, prior=None)
    (hyps,) = search(rows, lp, 1, Decoding(num_beams=2, max_new_tokens=5, length_penalty=1.0), [EOS],
                     stop=lambda: "time_limit")
    assert toks(hyps) == [["A"], ["B"]] and rows.stopped == "time_limit"
    assert lp_close(hyps[0].logprob, ln(.5)) and lp_close(hyps[1].logprob, ln(.4))
    (free,), _ = run(S, num_beams=2, pad=pad)
    assert toks(free)[0] == ["B", "EOS"] and lp_close(free[0].logprob, ln(.4, .9))


# ---------------------------------------------------------------- RAG-Token: mixing docs per token


def test_rag_token_mixture_picks_a_token_neither_doc_would():
    """Table M, RAG-Token greedy: p(y_i | x, y_<i) = sum_z p(z|x) p(y_i | x, z, y_<i), p(z|x) = [1/4, 3/4].

    step 1: A .25*.7 + .75*.05 = .2125, B .25*.25 + .75*.45 = .4, EOS .25*.05 + .75*.5 = .3875 -> B,
            although doc 0's argmax is A (.7) and doc 1's is EOS (.5).
    step 2: after B: A .25*.06 + .75*.12 = .105, B .01 + .06 = .07, EOS .225 + .6 = .825 -> EOS.
    Answer [B, EOS], log p = ln(.4 * .825) = ln .33. Attribution rows (each doc's log-prob of the
    chosen tokens): doc 0 [ln .25, ln .9], doc 1 [ln .45, ln .8].
    Each doc searched alone (no mixing): doc 0 gives [A, EOS] (.7, then .6), doc 1 gives [EOS]
    (it reads row (EOS) while doc 0 is still running; what it picks there is cut).
    With a uniform prior the mixture picks A (.375 > .35 > .275), then EOS (.65): the prior matters.
    """
    (hyps,), gen = run(M, docs=(0, 1), prior=PRIOR_M, max_new_tokens=4)
    assert toks(hyps) == [["B", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.4, .825))
    assert hyps[0].row_lp.shape == (2, 2)
    want = [[ln(.25), ln(.9)], [ln(.45), ln(.8)]]
    assert all(lp_close(float(hyps[0].row_lp[z, t]), want[z][t]) for z in range(2) for t in range(2))
    alone, _ = run(M, docs=(0, 1), max_new_tokens=4)
    assert [toks(h) for h in alone] == [[["A", "EOS"]], [["EOS"]]]
    (uniform,), _ = run(M, docs=(0, 1), prior=torch.log(torch.tensor([0.5, 0.5])), max_new_tokens=4)
    assert toks(uniform) == [["A", "EOS"]] and lp_close(uniform[0].logprob, ln(.375, .65))


def _doc_rule(doc: int, prefix: tuple[int, ...]) -> tuple[float, float, float]:
    """Two docs whose next-token distribution depends on the last token and the length (no ties
    among path probabilities, so the search's order is decided by more than float rounding)."""
    last = prefix[-1] if prefix else None
    rows = {
        (0, None): (.47, .31, .22), (0, A): (.23, .58, .19), (0, B): (.52, .17, .31),
        (1, None): (.29, .53, .18), (1, A): (.61, .14, .25), (1, B): (.21, .33, .46),
    }
    a, b, e = rows[(doc, last)]
    shift = min(.1 * len(prefix), min(a, b) - .01)  # longer prefixes lean towards EOS
    return (a - shift / 2, b - shift / 2, e + shift)


def test_rag_token_beam_search_is_beam_search_over_the_mixed_distribution():
    """RAG-Token beam search over K = 2 doc rows per beam (Rows(per_beam=2, prior)) must equal
    plain beam search over one row holding the mixture sum_z p(z|x) p(y_i | x, z, y_<i),
    computed here in float64. This checks that beam reordering moves each beam's K doc rows
    together (a beam must keep its own docs' caches), over 5 steps of 3 beams."""
    prior = (0.35, 0.65)

    def mixed(doc, prefix):
        p0, p1 = _doc_rule(0, prefix), _doc_rule(1, prefix)
        return tuple(prior[0] * x + prior[1] * y for x, y in zip(p0, p1))

    (rag,), _ = run(_doc_rule, docs=(0, 1), num_beams=3, max_new_tokens=5, prior=torch.tensor(prior).log())
    (ref,), _ = run(mixed, docs=(0,), num_beams=3, max_new_tokens=5)
    assert toks(rag) == toks(ref) and len(rag) == 3
    assert all(lp_close(h.logprob, r.logprob) for h, r in zip(rag, ref))


# ---------------------------------------------------------------- RAG-Sequence: fast vs thorough


def test_rag_token_ranking_leaves_candidates_behind_once_they_cannot_win():
    """Table F, RAG-Token log p(y|x) = sum_i ln sum_z p(z|x) q_zi of the candidates [A, EOS] and
    [B, EOS] (reader.drafts.rank_by_rag_token: docs read in order of p(z|x), bounds after each).

    Prior [.9, .05, .05]. After doc 0 (.9): [A, EOS] has per-token mass .9*.6 = .54, .9*.9 = .81,
    lower bound ln(.54 * .81) = ln .4374; [B, EOS] .9*.3 = .27, .9*.5 = .45, and with the .1 of
    prior not read yet at most ln((.27 + .1) * (.45 + .1)) = ln .2035 < ln .4374: [B, EOS] leaves
    the race unread under docs 1 and 2. [A, EOS] is then scored under them (attribution):
    (.54 + .05*.45 + .05*.45) * (.81 + .05*.9 + .05*.9) = .585 * .9 = .5265. [B, EOS]'s exact
    .32 * .532 = .17024 is below the ln .2035 reported for it, marked as a bound.

    Prior [1/3, 1/3, 1/3]: no bound decides before the last doc, so both are exact:
    [A, EOS] (1.5/3) * (2.7/3) = .45; [B, EOS] (1.3/3) * (2.14/3) = .30911...
    """
    cases = (([.9, .05, .05], [ln(.5265), ln(.2035)], {0}),
             ([1 / 3] * 3, [ln(.45), ln(1.3 / 3 * 2.14 / 3)], {0, 1, 2}))
    for prior, want, read_b in cases:
        gen = TableGenerator(F)
        lp, state = gen.prefill([[0], [1], [2]])  # (K, V)
        win, doc_lp, scores, bounded = rank_by_rag_token(gen, state, lp, [[A, EOS], [B, EOS]],
                                                                torch.tensor(prior).log())
        assert win == 0 and all(lp_close(a, b) for a, b in zip(scores, want)), (prior, scores)
        assert bounded == ({1} if read_b == {0} else set())
        assert {d for d, prefix in gen.read if prefix == (B,)} == read_b  # which docs [B, EOS] was read under
        assert torch.allclose(doc_lp.exp(), torch.tensor([[.6, .9], [.45, .9], [.45, .9]]))  # (K, T)


def test_rag_sequence_fast_uses_only_producing_docs():
    """Table F, RAG-Sequence, greedy search under each doc, prior p(z|x) = [.2, .3, .5].

    Searches: doc 0 -> [A, EOS] (.6 * .9 = .54); doc 1 -> [B, EOS] (.5 * .8 = .4);
              doc 2 -> [B, EOS] (.5 * .84 = .42). Candidates, first seen first: [A, EOS], [B, EOS].
    Each candidate under each doc (teacher-forced): [A, EOS]: .54, .45 * .9 = .405, .405;
                                                    [B, EOS]: .3 * .5 = .15, .4, .42.
    fast (paper 2.5): sum over only the docs whose search produced y of p(z|x) p(y|x,z):
        [A, EOS]: .2 * .54 = .108                      (doc 0 alone)
        [B, EOS]: .3 * .4 + .5 * .42 = .12 + .21 = .33 (docs 1 and 2) -> fast answers [B, EOS]
    thorough: the sum over every doc:
        [A, EOS]: .108 + .3 * .405 + .5 * .405 = .108 + .1215 + .2025 = .432
        [B, EOS]: .2 * .15 + .33 = .36                                 -> thorough answers [A, EOS]
    Leaving out docs 1 and 2's .324 of [A, EOS] flips the answer. fast's answer is then scored
    under every doc: log p(y|x) = ln .36, as thorough scores it. Attribution is over all docs in
    both: p(z | x, y) for fast's [B, EOS] is [.03, .12, .21] / .36 = [1/12, 1/3, 7/12], for
    thorough's [A, EOS] [.108, .1215, .2025] / .432 = [.25, .28125, .46875].
    """
    gen = TableGenerator(F)
    prompts, scores = [[0], [1], [2]], torch.log(torch.tensor([.2, .3, .5]))  # prior = softmax(scores)
    paper = RagSettings(preset="paper", k=3, max_new_tokens=4)
    fast = engine.rag_sequence(gen, prompts, scores, paper.merged(sequence_decoding="fast").decoding, PAPER)
    thorough = engine.rag_sequence(gen, prompts, scores, paper.merged(sequence_decoding="thorough").decoding, PAPER)
    assert [c for c, _ in fast.candidates] == [c for c, _ in thorough.candidates] == [[A, EOS], [B, EOS]]
    assert lp_close(fast.candidates[0][1], ln(.2 * .54)) and lp_close(fast.candidates[1][1], ln(.3 * .4 + .5 * .42))
    assert lp_close(thorough.candidates[0][1], ln(.432)) and lp_close(thorough.candidates[1][1], ln(.36))
    # fast ranks by .33 but the answer's log p(y|x) sums every doc: .36, the posteriors' denominator
    assert fast.tokens == [B, EOS] and lp_close(fast.logprob, ln(.36))
    assert thorough.tokens == [A, EOS] and lp_close(thorough.logprob, ln(.432))
    # posteriors: float32 softmax of the values above, within 1e-7 of exact (1e-6 as for scores)
    torch.testing.assert_close(fast.doc_posterior, torch.tensor([1 / 12, 1 / 3, 7 / 12]), rtol=0, atol=1e-6)
    torch.testing.assert_close(thorough.doc_posterior, torch.tensor([.25, .28125, .46875]), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- extractive decoding (SpanConstraint)


def test_span_constraint_allows_what_continues_a_copied_span():
    """Span [A, B, A]: at the start any of its tokens (no end: nothing copied yet); after [A] the
    token after either A that has a successor (B), or an end; after [A, B] its successor A, or an
    end; after a prefix that occurs nowhere only an end."""
    c = SpanConstraint([[A, B, A]], [[0]], [EOS])
    assert c.allowed(0, []) == [A, B]
    assert c.allowed(0, [A]) == [B, EOS]
    assert c.allowed(0, [A, B]) == [A, EOS]
    assert c.allowed(0, [A, B, A]) == [EOS] and c.allowed(0, [B, B]) == [EOS]
    two = SpanConstraint([[A], [B, A]], [[0], [1], [0, 1]], [EOS])
    assert two.allowed(0, []) == [A] and two.allowed(1, []) == [A, B] and two.allowed(2, [B]) == [A, EOS]
    m = two.mask([0, 1], [[], [B]], 3)  # (2, V)
    assert m[0].tolist() == [0.0, -1e9, -1e9] and m[1].tolist() == [0.0, -1e9, 0.0]


def _hand_span(pieces: list[str]):
    """A Span tokenized by hand: one id per distinct piece (10, 11, ...), offsets laid end to end."""
    ids, offsets, text = [], [], ""
    vocab: dict[str, int] = {}
    for piece in pieces:
        ids.append(vocab.setdefault(piece, 10 + len(vocab)))
        offsets.append((len(text), len(text) + len(piece)))
        text += piece
    return Span.from_offsets(ids, text, offsets), vocab


@pytest.mark.parametrize("marked, joined", [
    ("Can|berra", True), ("6|3", True), ("68|.5", True), ("68.|5", True), ("632|,702", True),
    ("68.5| million", True), ("O|'Brien", True), ("Dante'|s", True),
    ("Paris|, France", False), ("68.5 million| people", False), ("U.S.| dollar", False),
    ("Dante|'s Inferno", False), ("Dante|'s", False), ("Paris.|", False), ("|Paris", False),
])
def test_where_a_copy_may_stop(marked, joined):
    """| marks a token boundary: inside a word or a number (a copy may neither open nor end there) or
    not. The text's own edges are never inside."""
    left, right = marked.split("|")
    span, _ = _hand_span([x for x in (left, right) if x])
    if left and right:  # token 1 opens after the boundary; a copy ending with token 0 ends at it
        assert (1 not in span.starts) is joined and (1 not in span.stops) is joined
    else:
        assert 0 in span.starts and len(span) in span.stops and not joined


def test_span_constraint_copies_whole_words_and_whole_numbers():
    """" of 632,702 and 68.5 million people" a digit a token (as SmolLM2 splits numbers): a copy
    may open only where a word does (not at "3", ",", "7", ".", "5") and end only where one does:
    after " 6" the copy must go on (no end: "6" is inside 632 and 68.5), after " 63" too, after
    " 632" the only way on is ",702" (the comma joins digits), after " 68.5" only " million" (a
    number's magnitude is part of it), after " 68.5 million" it may end."""
    span, v = _hand_span([" of", " ", "6", "3", "2", ",", "7", "0", "2", " and", " ", "6", "8", ".", "5", " million",
                          " people"])
    c = SpanConstraint([span], [[0]], [EOS])
    ids = lambda *pieces: sorted(v[p] for p in pieces)  # noqa: E731
    assert c.allowed(0, []) == ids(" of", " ", "6", " and", " people")  # " million" belongs to 68.5
    assert c.allowed(0, [v[" "], v["6"]]) == ids("3", "8")
    assert c.allowed(0, [v[" "], v["6"], v["3"]]) == ids("2")
    assert c.allowed(0, [v[" "], v["6"], v["3"], v["2"]]) == ids(",")
    assert c.allowed(0, [v[" "], v["6"], v["8"], v["."]]) == ids("5")
    assert c.allowed(0, [v[" "], v["6"], v["8"], v["."], v["5"]]) == ids(" million")
    assert c.allowed(0, [v[" "], v["6"], v["8"], v["."], v["5"], v[" million"]]) == [EOS] + ids(" people")
    assert c.allowed(0, [v["6"], v["3"], v["2"], v[","], v["7"], v["0"], v["2"]]) == [EOS] + ids(" and")
    assert c.allowed(0, [v[" people"]]) == [EOS]  # the passage's end ends a word
    assert c.allowed(0, [v["3"]]) == [EOS]  # not a place a copy may open: it matches nothing, only an end is left


def test_extractive_greedy_picks_only_copyable_tokens_and_scores_them_unchanged():
    """Table S, greedy, the passage is [B]: free greedy says [A, EOS]; copying, step 1 may only
    take B (ln .4), then the span is used up and only EOS may follow (ln .9): [B, EOS], scored
    ln(.4 * .9) by the model's own table, the constraint adds nothing to the score."""
    (hyps,), _ = run(S, max_new_tokens=3, spans=[[B]])
    assert toks(hyps) == [["B", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.4, .9))


def test_extractive_beam_search_drops_beams_forced_off_the_span():
    """Table S, num_beams=2, passage [B]: at step 1 the second running beam can only be [A]
    (score ~ -1e9: forced off the span); after it only EOS is allowed. [A, EOS] finishes at
    ~ -1e9 and is dropped; [B, EOS] (ln .36) is the one hypothesis, with its exact score. (Beams
    off the span may still be expanded while a slot is free, so rows outside table S read a
    flat .2 / .2 / .6; at ~ -1e9 in float32 their order among themselves is arbitrary.)"""
    (hyps,), _ = run(lambda doc, prefix: S.get((doc, prefix), (.2, .2, .6)), num_beams=2, max_new_tokens=3,
                     spans=[[B]])
    assert toks(hyps) == [["B", "EOS"]]
    assert lp_close(hyps[0].logprob, ln(.4, .9))


def test_extractive_groups_copy_from_their_own_doc_and_rag_token_from_any():
    """Table G as two RAG-Sequence groups: doc 0 may copy [B], doc 1 [A]. Free, doc 0 says
    [EOS] at once; copying, it must start with B (ln .1), then end (the row (B) is not in table
    G: the test gives doc 0 a row for it). Doc 1 is unconstrained in effect ([A] then EOS or
    nothing): free it says [A, B, EOS]; copying [A] it must end after A: [A, EOS] (ln .7 + ln .1).
    Table M as RAG-Token (prior 1/4, 3/4) over docs whose spans are [B] and [A]: the mixture's
    first step is A .25*.7 + .75*.05 = .2125, B .25*.25 + .75*.45 = .4, EOS .3875; among the
    copyable {A, B} it takes B (free greedy would too); [B] continues neither span: only an end."""
    table = dict(G)
    table[(0, (B,))] = (.2, .2, .6)
    hyps, _ = run(table, docs=(0, 1), max_new_tokens=4, spans=[[B], [A]])
    assert [toks(h) for h in hyps] == [[["B", "EOS"]], [["A", "EOS"]]]
    assert lp_close(hyps[0][0].logprob, ln(.1, .6)) and lp_close(hyps[1][0].logprob, ln(.7, .1))
    (mixed,), _ = run(M, docs=(0, 1), max_new_tokens=3, prior=PRIOR_M, spans=[[B], [A]])
    assert toks(mixed)[0][0] == "B" and toks(mixed)[0][-1] == "EOS" and len(mixed[0].tokens) == 2


def test_beam_search_stops_reading_a_group_that_is_done():
    """Two groups (RAG-Sequence's docs), num_beams=2. Doc 0 says EOS at once (.8), and after A
    or B EOS (.9): after step 2 its finished set [EOS] (-0.22), [A, EOS] (-1.20) cannot be beaten
    by a running beam (ln(.1 * .05) / 2 = -2.65), so its rows leave the state and no prefix of
    doc 0 longer than 1 token is read, while doc 1 runs on to its 5th token. Each group's
    hypotheses are what it finds searched alone."""
    def table(doc, prefix):
        if doc == 0:
            return (.1, .1, .8) if not prefix else (.05, .05, .9)
        return (.5, .45, .05) if len(prefix) < 4 else (.1, .1, .8)

    (h0, h1), gen = run(table, docs=(0, 1), num_beams=2, max_new_tokens=6)
    assert max(len(p) for d, p in gen.read if d == 0) == 1
    assert max(len(p) for d, p in gen.read if d == 1) >= 4
    (alone0,), _ = run(table, docs=(0,), num_beams=2, max_new_tokens=6)
    (alone1,), _ = run(table, docs=(1,), num_beams=2, max_new_tokens=6)
    assert toks(h0) == toks(alone0) == [["EOS"], ["A", "EOS"]] and toks(h1) == toks(alone1)
    assert all(lp_close(a.logprob, b.logprob) for a, b in zip(h0 + h1, alone0 + alone1))
