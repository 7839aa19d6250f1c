"""Answers the reader rejects, decoded again (ReaderAids.echo_retries): the `review` hook's work.

An answer that only repeats the question, names nothing, names only the question's subject or
copies a worked example's invented name (the tests are rag_demo/reader/echo.py) cannot be right,
so its group searches again from the prefill state with the rejected first tokens banned at the
first step (`BanFirst`). Scores stay the model's own log-probs of what was chosen, so the
marginals and attributions stay exact.
"""
from __future__ import annotations

from typing import Callable

import torch

from rag_demo.rag.decoding import BAN, NEG, Hyp, LogitsProcessor
from rag_demo.rag.hooks import Search
from rag_demo.reader.part import Aid

Rejects = Callable[[list[int]], bool]  # does the reader reject this answer (token ids)?


class BanFirst(LogitsProcessor):
    """At the first step, group g may not choose the tokens banned[g]."""

    stage = BAN

    def __init__(self, banned: list[list[int]]):
        self.banned = banned

    def __call__(self, groups: list[int], tokens: list[list[int]], scores: torch.Tensor) -> torch.Tensor:
        if any(tokens):
            return scores
        scores = scores.clone()  # (N, V): at the first step every group is still searching
        for i, g in enumerate(groups):
            scores[i, self.banned[g]] = NEG
        return scores


def retry_rejected(search: Search, hyps: list[list[Hyp]], rejects: Rejects, rounds: int) -> list[list[Hyp]]:
    """The search's hypotheses with rejected answers decoded again.

    hyps: each group's hypotheses, best first. Beam search: a group drops its rejected hypotheses
    when it has another; a group whose every hypothesis is rejected is retried like greedy's, with
    the first tokens of all of them banned. Greedy: the groups whose answer is rejected run again
    (`search.again`, greedily), with the first token of every rejected answer they produced so far
    banned at the first step; at most `rounds` rounds, and not after the request was stopped. A
    group keeps its first answer that is not rejected; a group rejected every time keeps its
    original hypotheses (the model's own choice)."""
    if search.q.d.num_beams > 1:
        out, rejected = [], {}
        for g, group in enumerate(hyps):
            fine = [h for h in group if not rejects(h.tokens)]
            out.append(fine or group)
            if group and not fine:
                rejected[g] = group
    else:
        out = list(hyps)
        rejected = {g: group[:1] for g, group in enumerate(hyps) if group and rejects(group[0].tokens)}
    banned: dict[int, list[int]] = {g: [] for g in rejected}
    rows = search.rows
    for _ in range(rounds):
        # an empty answer has no first token to ban
        rejected = {g: firsts for g, hs in rejected.items() if (firsts := [h.tokens[0] for h in hs if h.tokens])}
        if not rejected or rows.stopped:
            break
        for g, firsts in rejected.items():
            banned[g].extend(t for t in dict.fromkeys(firsts) if t not in banned[g])
        todo = sorted(rejected)
        found = search.again(todo, [BanFirst([banned[g] for g in todo])])
        if rows.stopped:  # a retry cut short by the deadline: keep the whole answers already made
            break
        rejected = {}
        for g, h in zip(todo, found):
            h.group = g
            if rejects(h.tokens):
                rejected[g] = [h]
            else:
                out[g] = [h]
    return out


class EchoRetries(Aid):
    """review: answers `rejects` refuses, decoded again (`retry_rejected`), at most `rounds` rounds."""

    knob, hooks, keeps_prefill = "echo_retries", ("review",), True

    def __init__(self, rejects: Rejects, rounds: int):
        self.rejects, self.rounds = rejects, rounds

    def review(self, search: Search, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        return retry_rejected(search, hyps, self.rejects, self.rounds)
