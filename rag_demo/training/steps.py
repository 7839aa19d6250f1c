"""One training step's two halves, with gradients: the doc prior from the question tower, and the
generator's log-probs of the target answer under each retrieved passage. The loss joining them is
the paper's (rag.marginalize.rag_nll), the same functions the demo answers with.

    log p(z|x)  = log_softmax_z (c · q'(x)·d(z))  over the K passages q'(x) ranks highest
    lp[z, i]    = log p(y_i | prompt_z, y_<i)       teacher-forced, the prompt the paper preset reads
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from rag_demo.models.trained import QuestionMap


def retrieve(qmap: QuestionMap, qvec: torch.Tensor, embeddings: torch.Tensor, k: int, scale: float,
             rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k passages under the question tower, with the doc log-prior over them:

        s_z = q'(x) · d(z),   log p(z|x) = log_softmax_z (scale · s_z)   over the top k,

    searched among `rows` (a pool of passage rows; None: every row of `embeddings`). The index
    is fixed, so the gradient reaches only the tower. qvec (D,), embeddings (N, D) ->
    (rows (k,), log-prior (k,))."""
    q = qmap(qvec.unsqueeze(0))[0]  # (D,)
    cand = embeddings if rows is None else embeddings[rows]  # (M, D)
    scores = cand @ q  # (M,)
    top = torch.topk(scores.detach(), k).indices  # (k,) ranked by the current tower
    picked = top if rows is None else rows[top]  # (k,) passage rows
    return picked, F.log_softmax(scale * scores[top], dim=-1)  # (k,), (k,)


def answer_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]], target: Sequence[int],
                    pad_id: int) -> torch.Tensor:
    """lp[z, i] = log p(target_i | prompts[z], target_<i) (K, T), teacher-forced in one batch.

    Row z is prompts[z] + target, right-padded; positions count from each row's first token, as in
    a prompt prefilled alone. Only the T positions that predict the target go through the output
    layer, so no (K, S, V) logits exist. `model` is a causal LM (a peft model is unwrapped by the
    caller or works as one: `.model` the body, `.lm_head` the head)."""
    T = len(target)
    dev = next(model.parameters()).device
    rows = [list(p) + list(target) for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (K, S)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (K, S)
    for z, r in enumerate(rows):
        ids[z, : len(r)] = torch.tensor(r)
        mask[z, : len(r)] = 1
    hidden = model.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state  # (K, S, H)
    at = torch.tensor([[len(p) - 1 + i for i in range(T)] for p in prompts], device=dev)  # (K, T) positions predicting y_i
    h = hidden.gather(1, at.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (K, T, H)
    logits = model.lm_head(h).float()  # (K, T, V)
    tgt = torch.tensor(list(target), device=dev).expand(len(rows), T)  # (K, T)
    return logits.gather(2, tgt.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (K, T)
