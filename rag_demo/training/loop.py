"""The training loop (paper §2.4): minimise −log p(y|x) marginalised over the retrieved passages,
the passage encoder and the index fixed, the question tower and the generator trained.

Two stages, each one run of `python -m rag_demo train`:

  retriever  (--retriever-only) the generator frozen: p(y|x,z) of every passage in each question's
             pool (the frozen retriever's top `pool`) is scored once, then only the question map
             trains, its prior a softmax over the pool (a passage ranked 6th can only rise if the
             loss sees it). Minutes.
  reader     LoRA adapters on the generator (peft) and, jointly, the question map: each step
             retrieves the top K with the current tower and backpropagates through both. Hours.

Read top to bottom as nanoGPT's train.py: the settings, the batches, a held-out loss every
`eval_every` steps, a checkpoint every `ckpt_every` steps that holds everything the next step
needs (weights, optimizer, schedule, RNG, the curve so far), and a run that finds a checkpoint
resumes from it and ends in the same weights as one never stopped.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from rag_demo.config import Decoding, ReaderAids
from rag_demo.models.trained import ADAPTER_DIR, MAP_FILE, QuestionMap
from rag_demo.rag.decoding import score_candidates
from rag_demo.rag.marginalize import LOSSES, rag_nll
from rag_demo.reader.reading import prompt
from rag_demo.training.examples import Example
from rag_demo.training.steps import answer_logprobs, retrieve

STAGES = ("retriever", "reader")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TrainSettings:
    """Everything a run's result depends on besides its data and base weights."""

    stage: str = "reader"
    loss: str = "both"  # rag_nll: sequence, token, or their mean (one generator serves both modes)
    k: int = 5  # passages per question (the reader stage; the paper trains with 5 or 10)
    pool: int = 20  # retriever stage: the frozen top-N each question's prior is a softmax over
    epochs: float = 1.0
    accumulate: int = 4  # questions per optimizer step
    lr: float = 2e-4  # the LoRA adapters'
    map_lr: float = 1e-4  # the question map's (the retriever stage uses more: see `for_stage`)
    train_map: bool = True  # reader stage: the question tower trains jointly (paper); False freezes it
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    # adapters on the top share of the layers only: nothing below them needs a gradient, so the
    # backward pass stops there (a third less work a step with a half)
    lora_top: float = 0.5
    warmup: int = 10  # optimizer steps of linear warm-up, then cosine to a tenth
    eval_every: int = 25  # optimizer steps between held-out losses
    ckpt_every: int = 10  # optimizer steps between checkpoints
    seed: int = 0
    bf16: bool = False  # bfloat16 autocast (where the CPU multiplies it natively)
    heldout: float = 0.05  # the share of examples never trained on (the held-out loss)

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage={self.stage!r} is unknown: use one of {', '.join(STAGES)}.")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is unknown: use one of {', '.join(LOSSES)}.")
        for name, lo in (("k", 1), ("pool", 1), ("accumulate", 1), ("lora_r", 1), ("eval_every", 1), ("ckpt_every", 1)):
            if getattr(self, name) < lo:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range: use {lo} or more.")
        if not 0 < self.lora_top <= 1:
            raise ValueError(f"lora_top={self.lora_top!r} is out of range: use a share of the layers, above 0 up to 1.")
        if not self.epochs > 0:
            raise ValueError(f"epochs={self.epochs!r} is out of range: use a positive number.")

    @classmethod
    def for_stage(cls, stage: str, **given) -> "TrainSettings":
        """The stage's defaults, then what was given (None: the default). The retriever stage trains
        only a D x D map on precomputed scores, so it runs many cheap epochs at a larger rate."""
        base = {"retriever": {"epochs": 24.0, "accumulate": 16, "map_lr": 1e-4, "eval_every": 37, "ckpt_every": 37,
                              "heldout": 0.2},
                "reader": {"eval_every": 40, "map_lr": 3e-5}}[stage]
        return cls(stage=stage, **{**base, **{k: v for k, v in given.items() if v is not None}})


@dataclass
class Curve:
    """The training curve, one row per held-out evaluation (what the Results tab draws)."""

    rows: list[dict] = field(default_factory=list)

    def add(self, **row) -> None:
        self.rows.append({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()})


def _schedule(total: int, warmup: int) -> Callable[[int], float]:
    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return lr_at


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Trainer:
    """One stage of training over `examples` (training/examples.py).

    gen: the generator (models.decoder_only.DecoderOnlyGenerator) on float32 weights, its prompts the
    paper preset's; embeddings (N, D) the fixed index's passage vectors; passages the corpus's rows;
    qmap: the question map to start from (None: a new one, the frozen retriever); work: the folder
    for checkpoints and the retriever stage's precomputed scores."""

    def __init__(self, gen, embeddings, passages, examples: list[Example], settings: TrainSettings, work: Path,
                 scale: float, qmap: QuestionMap | None = None, data_hash: str = "") -> None:
        self.gen, self.passages, self.s, self.scale = gen, passages, settings, scale
        self.E = torch.tensor(np.asarray(embeddings), dtype=torch.float32)  # (N, D) a copy: the index's may be read-only
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.data_hash = data_hash
        self.train = [e for e in examples if not e.heldout(settings.heldout)]
        self.held = [e for e in examples if e.heldout(settings.heldout)]
        if not self.train:
            raise ValueError("no training example is left after the held-out twentieth: make more pairs.")
        torch.manual_seed(settings.seed)
        self.qmap = qmap if qmap is not None else QuestionMap(self.E.shape[1])
        self.qmap.train()
        self.targets = {e.question: gen.tokenizer.encode(f" {e.target}.", add_special_tokens=False) for e in examples}
        self.model = None  # the generator with LoRA adapters (reader stage)
        self.pool_lp: dict[str, torch.Tensor] = {}
        params = [{"params": list(self.qmap.parameters()), "lr": settings.map_lr}]
        if settings.stage == "reader":
            self.model = self._lora(gen.model)
            lora = [p for p in self.model.parameters() if p.requires_grad]
            params = [{"params": lora, "lr": settings.lr}] + (params if settings.train_map else [])
            if not settings.train_map:
                self.qmap.requires_grad_(False)
        self.opt = torch.optim.AdamW(params, weight_decay=0.0)
        self.total = max(1, math.ceil(len(self.train) * settings.epochs / settings.accumulate))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, _schedule(self.total, settings.warmup))
        self.step, self.seen, self.elapsed = 0, 0, 0.0
        self.curve = Curve()
        self.best: tuple[int, dict] | None = None  # retriever stage: (held-out hits@5, the map) of the best evaluation

    # -- the model -------------------------------------------------------------
    def _lora(self, model):
        from peft import LoraConfig, get_peft_model

        n = model.config.num_hidden_layers
        layers = list(range(min(n - 1, int(n * (1 - self.s.lora_top))), n))  # the top share, at least one
        cfg = LoraConfig(r=self.s.lora_r, lora_alpha=self.s.lora_alpha, lora_dropout=self.s.lora_dropout,
                         target_modules=list(LORA_TARGETS), layers_to_transform=layers, bias="none")
        return get_peft_model(model, cfg)

    def _body(self):
        """The causal LM whose .model / .lm_head answer_logprobs runs (the LoRA-wrapped one)."""
        return self.model.base_model.model if self.model is not None else self.gen.model

    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.s.bf16)

    def _prompts(self, question: str, rows) -> list[list[int]]:
        return [prompt(self.gen, question, self.passages[int(r)], Decoding(), ReaderAids()) for r in rows]

    # -- the loss of one example ---------------------------------------------
    def loss_of(self, ex: Example) -> torch.Tensor:
        """−log p(y|x) of one example (rag_nll), with gradients to whatever trains in this stage."""
        qvec = torch.as_tensor(ex.qvec, dtype=torch.float32)  # (D,)
        target = self.targets[ex.question]
        if self.s.stage == "retriever":
            pool = torch.tensor(ex.pool[: self.s.pool])  # (P,)
            rows, prior = retrieve(self.qmap, qvec, self.E, min(self.s.pool, len(pool)), self.scale, pool)  # (P,), (P,)
            where = {int(r): i for i, r in enumerate(pool)}
            lp = self.pool_lp[ex.question][[where[int(r)] for r in rows]]  # (P, T) scored once, no gradient
            return rag_nll(lp, prior, loss=self.s.loss)
        rows, prior = retrieve(self.qmap, qvec, self.E, self.s.k, self.scale)  # (K,), (K,)
        with self._autocast():
            lp = answer_logprobs(self._body(), self._prompts(ex.question, rows), target, self.gen.pad_token_id)  # (K, T)
        return rag_nll(lp.float(), prior, loss=self.s.loss)

    @torch.no_grad()
    def heldout_loss(self) -> float | None:
        if not self.held:
            return None
        was = self.qmap.training
        self.qmap.eval()
        if self.model is not None:
            self.model.eval()
        loss = sum(float(self.loss_of(e)) for e in self.held) / len(self.held)
        self.qmap.train(was)
        if self.model is not None:
            self.model.train()
        return loss

    # -- the retriever stage's scores, once -------------------------------------
    @torch.inference_mode()
    def score_pools(self, show_bar: bool = True) -> None:
        """lp (P, T) of every example's pool under the frozen generator, once, the way the engine
        teacher-forces an answer (`gen.prefill` of the P prompts, then `decoding.score_candidates`);
        kept in the work folder, so a killed run scores only what it had not."""
        path = self.work / "pool_scores.pt"
        key = {"data": self.data_hash, "pool": self.s.pool, "generator": self.gen.name}
        kept = torch.load(path) if path.is_file() else {}
        if kept.get("key") != key:
            kept = {"key": key, "lp": {}}
        todo = [e for e in self.train + self.held if e.question not in kept["lp"]]
        with tqdm(total=len(self.train) + len(self.held), initial=len(kept["lp"]), desc="scoring pools",
                  unit="question", disable=not show_bar) as bar:
            for i, ex in enumerate(todo):
                first_lp, state = self.gen.prefill(self._prompts(ex.question, ex.pool[: self.s.pool]))  # (P, V)
                lp, _ = score_candidates(self.gen, state, first_lp, [self.targets[ex.question]], self.gen.pad_token_id)
                kept["lp"][ex.question] = lp[:, 0].float()  # (P, T)
                bar.update(1)
                if (i + 1) % 25 == 0:
                    _atomic_save(kept, path)
        _atomic_save(kept, path)
        self.pool_lp = kept["lp"]

    # -- checkpoints -------------------------------------------------------------
    @property
    def ckpt_path(self) -> Path:
        return self.work / f"ckpt-{self.s.stage}.pt"

    def _fingerprint(self) -> dict:
        return {"settings": asdict(self.s), "data": self.data_hash, "examples": len(self.train)}

    def save(self) -> None:
        state = {"fingerprint": self._fingerprint(), "step": self.step, "seen": self.seen, "elapsed": self.elapsed,
                 "qmap": self.qmap.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                 "rng": torch.get_rng_state(), "curve": self.curve.rows, "best": self.best}
        if self.model is not None:
            from peft import get_peft_model_state_dict

            state["lora"] = get_peft_model_state_dict(self.model)
        _atomic_save(state, self.ckpt_path)

    def resume(self) -> bool:
        """Load this stage's checkpoint when it was made by the same settings and data; -> whether one was."""
        if not self.ckpt_path.is_file():
            return False
        state = torch.load(self.ckpt_path, weights_only=False)
        if state["fingerprint"] != self._fingerprint():
            raise ValueError(f"{self.ckpt_path} was made with other settings or data: delete it to start afresh, "
                             "or run with the settings it was made with.")
        self.qmap.load_state_dict(state["qmap"])
        if self.model is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state["lora"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        torch.set_rng_state(state["rng"])
        self.step, self.seen, self.elapsed = state["step"], state["seen"], state["elapsed"]
        self.curve.rows = state["curve"]
        self.best = state.get("best")
        return True

    # -- the loop ------------------------------------------------------------------
    def order(self, epoch: int) -> list[Example]:
        """The training examples in epoch `epoch`'s order (a permutation fixed by the seed)."""
        if getattr(self, "_order", (None,))[0] != epoch:
            order = list(self.train)
            random.Random(self.s.seed * 1000 + epoch).shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def run(self, show_bar: bool = True, stop_after: int | None = None) -> Curve:
        """Train to the end (or, for tests, until `stop_after` optimizer steps in all, then return
        as a killed run would, its last checkpoint written)."""
        if self.s.stage == "retriever" and not self.pool_lp:
            self.score_pools(show_bar)
        if self.model is not None:
            self.model.train()
        n = len(self.train)
        micro_total = self.total * self.s.accumulate
        if self.step == 0 and not self.curve.rows:
            self._evaluate(0.0)
        bar = tqdm(total=self.total, initial=self.step, desc=f"training ({self.s.stage})", unit="step",
                   disable=not show_bar)
        t0, ema = time.perf_counter() - self.elapsed, None
        while self.step < self.total:
            self.opt.zero_grad(set_to_none=True)
            total_loss = 0.0
            for _ in range(self.s.accumulate):
                if self.seen >= micro_total:
                    break
                ex = self.order(self.seen // n)[self.seen % n]
                loss = self.loss_of(ex)
                (loss / self.s.accumulate).backward()
                total_loss += loss.item() / self.s.accumulate
                self.seen += 1
            torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], 1.0)
            self.opt.step()
            self.sched.step()
            self.step += 1
            ema = total_loss if ema is None else 0.9 * ema + 0.1 * total_loss
            self.elapsed = time.perf_counter() - t0
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}")
            if self.step % self.s.eval_every == 0 or self.step == self.total:
                self._evaluate(total_loss)
            if self.step % self.s.ckpt_every == 0 or self.step == self.total:
                self.save()
            if stop_after is not None and self.step >= stop_after:
                break
        bar.close()
        return self.curve

    @torch.no_grad()
    def heldout_hits(self, k: int = 5) -> int:
        """How many held-out questions have a passage holding their answer in the tower's top k of
        the whole index (the retriever stage keeps the map with the most)."""
        from rag_demo.measure.metrics import has_answer, passage_text

        if not self.held:
            return 0
        q = self.qmap(torch.as_tensor(np.stack([e.qvec for e in self.held]), dtype=torch.float32))  # (H, D)
        top = torch.topk(q @ self.E.T, k, dim=-1).indices  # (H, k)
        return sum(any(has_answer(passage_text(self.passages[int(r)]), [e.target]) for r in row)
                   for e, row in zip(self.held, top.tolist()))

    def _evaluate(self, train_loss: float) -> None:
        row = {"stage": self.s.stage, "step": self.step, "examples": self.seen, "train_loss": train_loss,
               "heldout_loss": self.heldout_loss(), "seconds": self.elapsed}
        if self.s.stage == "retriever":
            hits = self.heldout_hits()
            row["heldout_recall@5"] = hits / max(1, len(self.held))
            if self.best is None or hits > self.best[0]:  # ties keep the earlier, smaller change
                self.best = (hits, {k: v.clone() for k, v in self.qmap.state_dict().items()})
        self.curve.add(**row)

    # -- what ships ------------------------------------------------------------------
    def export(self, out: Path) -> list[Path]:
        """Write what ships into `out`: the question map, and after the reader stage the adapter;
        -> the files written."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if self.best is not None:  # the retriever stage ships the map of its best held-out recall@5
            self.qmap.load_state_dict(self.best[1])
        self.qmap.eval()
        self.qmap.save(out / MAP_FILE)
        written = [out / MAP_FILE]
        if self.model is not None:
            self.model.save_pretrained(str(out / ADAPTER_DIR))
            written += [out / ADAPTER_DIR / "adapter_config.json", out / ADAPTER_DIR / "adapter_model.safetensors"]
        return written


def write_curve(rows: list[dict], path: Path, stage: str) -> None:
    """curve.jsonl: the rows of other stages kept, this stage's replaced."""
    path = Path(path)
    old = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    keep = [r for r in old if r.get("stage") != stage] + rows
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
