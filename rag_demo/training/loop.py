"""The training loop (paper §2.4): minimise −log p(y|x) marginalised over the retrieved passages,
the passage encoder and the index fixed.

Two stages, each one run of `python -m rag_demo train`:

  retriever  (--retriever-only) the generator frozen: p(y|x,z) of every passage in each question's
             pool (the frozen retriever's top `pool`) is scored once, then only the question map
             trains, its prior a softmax over the pool (a passage ranked 6th can only rise if the
             loss sees it). Minutes.
  reader     the generator, on the passages the retriever that ships finds (fixed: each example's
             prompts, prior and target are token ids, training/examples.Prepared, so the stage runs
             on any device with no corpus or index): every weight of its attention and MLP layers
             (tune="full"), or LoRA adapters (tune="lora"). An hour on two CPU cores, minutes on a GPU.

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
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from rag_demo.models.trained import ADAPTER_DIR, MAP_FILE, QuestionMap
from rag_demo.rag.marginalize import LOSSES, rag_nll
from rag_demo.training.steps import answer_logprobs, retrieve

STAGES = ("retriever", "reader")
TUNES = ("full", "lora")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TrainSettings:
    """Everything a run's result depends on besides its data and base weights."""

    stage: str = "reader"
    loss: str = "both"  # rag_nll: sequence, token, or their mean (one generator serves both modes)
    k: int = 5  # passages per question (the reader stage; the paper trains with 5 or 10)
    pool: int = 20  # retriever stage: the frozen top-N each question's prior is a softmax over
    epochs: float = 4.0
    accumulate: int = 4  # questions per optimizer step
    tune: str = "full"  # reader stage: every attention and MLP weight, or LoRA adapters on them
    lr: float = 3e-5  # the generator's (full; LoRA adapters want ~2e-4)
    map_lr: float = 1e-4  # the retriever stage's question map
    # LoRA's rank, or with tune="full" the rank the trained change of each weight is stored at
    # (models/trained.py: a rank-32 change of every layer is ~20 MB in float16)
    rank: int = 32
    lora_dropout: float = 0.05
    warmup: int = 10  # optimizer steps of linear warm-up, then cosine to a tenth
    eval_every: int = 25  # optimizer steps between held-out losses
    ckpt_every: int = 10  # optimizer steps between checkpoints
    seed: int = 0
    bf16: bool = False  # bfloat16 autocast (where the device multiplies it natively)
    heldout: float = 0.05  # the share of examples never trained on (the held-out loss)

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage={self.stage!r} is unknown: use one of {', '.join(STAGES)}.")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is unknown: use one of {', '.join(LOSSES)}.")
        if self.tune not in TUNES:
            raise ValueError(f"tune={self.tune!r} is unknown: use one of {', '.join(TUNES)}.")
        for name, lo in (("k", 1), ("pool", 1), ("accumulate", 1), ("rank", 1), ("eval_every", 1), ("ckpt_every", 1)):
            if getattr(self, name) < lo:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range: use {lo} or more.")
        if not self.epochs > 0:
            raise ValueError(f"epochs={self.epochs!r} is out of range: use a positive number.")

    @classmethod
    def for_stage(cls, stage: str, **given) -> "TrainSettings":
        """The stage's defaults, then what was given (None: the default). The retriever stage trains
        only a D x D map on precomputed scores, so it runs many cheap epochs at a larger rate; the
        reader stage's rate follows what trains (LoRA's adapters start at zero and want more)."""
        base = {"retriever": {"epochs": 24.0, "accumulate": 16, "eval_every": 37, "ckpt_every": 37, "heldout": 0.2},
                "reader": {"eval_every": 20, "ckpt_every": 20}}[stage]
        given = {k: v for k, v in given.items() if v is not None}
        if stage == "reader" and given.get("tune") == "lora" and "lr" not in given:
            given["lr"] = 2e-4
        return cls(stage=stage, **{**base, **given})


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


class Loop:
    """What both stages share: the examples split into trained and held out, the optimizer and its
    schedule, checkpoints and resuming, the epochs' order and the curve. A stage says what trains
    (`parameters`), the loss of one example (`loss_of`), what a checkpoint holds of its weights
    (`weights_state` / `load_weights_state`) and what ships (`export`)."""

    def __init__(self, examples: list, settings: TrainSettings, work: Path, data_hash: str = "") -> None:
        self.s = settings
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.data_hash = data_hash
        self.train = [e for e in examples if not e.heldout(settings.heldout)]
        self.held = [e for e in examples if e.heldout(settings.heldout)]
        if not self.train:
            raise ValueError("no training example is left after the held-out share: make more pairs.")
        self.total = max(1, math.ceil(len(self.train) * settings.epochs / settings.accumulate))
        self.step, self.seen, self.elapsed = 0, 0, 0.0
        self.curve = Curve()

    def _optimizer(self, groups: list[dict]) -> None:
        self.opt = torch.optim.AdamW(groups, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, _schedule(self.total, self.s.warmup))

    # -- what a stage defines ------------------------------------------------------
    def loss_of(self, ex) -> torch.Tensor:
        raise NotImplementedError

    def weights_state(self) -> dict:
        raise NotImplementedError

    def load_weights_state(self, state: dict) -> None:
        raise NotImplementedError

    def _train_mode(self, on: bool) -> None:
        raise NotImplementedError

    def _extra_row(self) -> dict:
        return {}

    # -- held out --------------------------------------------------------------------
    @torch.no_grad()
    def heldout_loss(self) -> float | None:
        if not self.held:
            return None
        self._train_mode(False)
        loss = sum(float(self.loss_of(e)) for e in self.held) / len(self.held)
        self._train_mode(True)
        return loss

    def _evaluate(self, train_loss: float) -> None:
        row = {"stage": self.s.stage, "step": self.step, "examples": self.seen, "train_loss": train_loss,
               "heldout_loss": self.heldout_loss(), "seconds": self.elapsed, **self._extra_row()}
        self.curve.add(**row)

    # -- checkpoints -------------------------------------------------------------
    @property
    def ckpt_path(self) -> Path:
        return self.work / f"ckpt-{self.s.stage}.pt"

    def _fingerprint(self) -> dict:
        return {"settings": asdict(self.s), "data": self.data_hash, "examples": len(self.train)}

    def save(self) -> None:
        state = {"fingerprint": self._fingerprint(), "step": self.step, "seen": self.seen, "elapsed": self.elapsed,
                 "weights": self.weights_state(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                 "rng": torch.get_rng_state(), "curve": self.curve.rows}
        _atomic_save(state, self.ckpt_path)

    def resume(self) -> bool:
        """Load this stage's checkpoint when it was made by the same settings and data; -> whether one was."""
        if not self.ckpt_path.is_file():
            return False
        state = torch.load(self.ckpt_path, weights_only=False, map_location="cpu")
        if state["fingerprint"] != self._fingerprint():
            raise ValueError(f"{self.ckpt_path} was made with other settings or data: delete it to start afresh, "
                             "or run with the settings it was made with.")
        self.load_weights_state(state["weights"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        torch.set_rng_state(state["rng"])
        self.step, self.seen, self.elapsed = state["step"], state["seen"], state["elapsed"]
        self.curve.rows = state["curve"]
        return True

    # -- the loop ------------------------------------------------------------------
    def order(self, epoch: int) -> list:
        """The training examples in epoch `epoch`'s order (a permutation fixed by the seed)."""
        if getattr(self, "_order", (None,))[0] != epoch:
            order = list(self.train)
            random.Random(self.s.seed * 1000 + epoch).shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def _before_run(self, show_bar: bool) -> None:
        pass

    def run(self, show_bar: bool = True, stop_after: int | None = None) -> Curve:
        """Train to the end (or, for tests, until `stop_after` optimizer steps in all, then return
        as a killed run would, its last checkpoint written). `elapsed` counts the seconds spent
        training over every process that resumed this run, not the time loading or evaluating."""
        self._before_run(show_bar)
        self._train_mode(True)
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
                t_eval = time.perf_counter()
                self._evaluate(total_loss)
                t0 += time.perf_counter() - t_eval  # held-out losses are not training time
            if self.step % self.s.ckpt_every == 0 or self.step == self.total:
                self.save()
            if stop_after is not None and self.step >= stop_after:
                break
        bar.close()
        return self.curve


class ReaderTrainer(Loop):
    """The reader stage: the generator trains on Prepared examples (training/examples.py).

    model: the causal LM in float32 (consumed: it is trained in place), on `device`; pad_id its
    padding token. tune="full" trains every weight of the layers' attention and MLP (LORA_TARGETS)
    and keeps the rest (embeddings, norms) fixed, so the trained change is one matrix per target
    that `export` stores at rank `rank`; tune="lora" trains peft's LoRA adapters on the same
    weights."""

    def __init__(self, model, pad_id: int, examples: list, settings: TrainSettings, work: Path,
                 data_hash: str = "", device: str = "cpu") -> None:
        super().__init__(examples, settings, work, data_hash)
        torch.manual_seed(settings.seed)
        self.device, self.pad_id = torch.device(device), int(pad_id)
        if any(w.dtype != torch.float32 for w in model.parameters()):
            raise ValueError("the reader stage trains float32 weights: load the generator with dtype=torch.float32.")
        # (no model.float(): transformers refuses it on a model it converted from GGUF, though it is float32)
        model = model.to(self.device)
        if settings.tune == "lora":
            from peft import LoraConfig, get_peft_model

            cfg = LoraConfig(r=settings.rank, lora_alpha=2 * settings.rank, lora_dropout=settings.lora_dropout,
                             target_modules=list(LORA_TARGETS), bias="none")
            with warnings.catch_warnings():  # peft asks transformers a renamed question (models/trained.py)
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = get_peft_model(model, cfg)
            self.body = self.model.base_model.model
            self.base = None
        else:
            self.model = self.body = model
            model.requires_grad_(False)
            targets = _target_weights(model)
            for w in targets.values():
                w.requires_grad_(True)
            # the base weights, to store the trained change (W - W0) and to resume a run
            self.base = {n: w.detach().to("cpu", copy=True) for n, w in targets.items()}
        self._optimizer([{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": settings.lr}])

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.s.bf16)

    def loss_of(self, ex) -> torch.Tensor:
        """−log p(y|x) of one Prepared example (rag_nll) with gradients to the generator."""
        with self._autocast():
            lp = answer_logprobs(self.body, ex.prompts, ex.target, self.pad_id)  # (K, T)
        prior = torch.tensor(ex.prior, dtype=torch.float32, device=lp.device)  # (K,)
        return rag_nll(lp.float(), prior, loss=self.s.loss)

    def _train_mode(self, on: bool) -> None:
        self.model.train(on)

    def weights_state(self) -> dict:
        if self.s.tune == "lora":
            from peft import get_peft_model_state_dict

            return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.model).items()}
        return {n: w.detach().cpu() for n, w in _target_weights(self.model).items()}

    def load_weights_state(self, state: dict) -> None:
        if self.s.tune == "lora":
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state)
            return
        with torch.no_grad():
            for n, w in _target_weights(self.model).items():
                w.copy_(state[n])

    def export(self, out: Path) -> dict:
        """Write the generator's trained change as a LoRA adapter in `out/adapter` (peft's two files,
        which models/trained.merge_adapter merges at load). LoRA: the adapters as trained. Full: each
        target's change ΔW = W - W0 at its best rank-r approximation (truncated SVD,
        ΔW ≈ B A with B = U_r S_r^½, A = S_r^½ V_r^T), stored in float16. -> what was stored: the
        rank, the bytes, how much of the change's energy the rank keeps and the held-out loss of the
        weights as trained and as stored."""
        out = Path(out)
        folder = out / ADAPTER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        trained_loss = self.heldout_loss()
        if self.s.tune == "lora":
            from safetensors.torch import load_file, save_file

            self.model.save_pretrained(str(folder))
            weights = folder / "adapter_model.safetensors"  # stored in float16, as the full change is
            half = {k: v.to(torch.float16).contiguous() for k, v in load_file(str(weights)).items()}
            save_file(half, str(weights))
            return {"tune": "lora", "rank": self.s.rank, "bytes": sum(t.numel() * 2 for t in half.values()),
                    "heldout_loss": {"trained": trained_loss}}
        svd = delta_svd(self.model, self.base)
        info = save_delta_adapter(svd, self.s.rank, folder)
        # the held-out loss of what ships (the base weights plus the rank-r change), and at other ranks
        stored = _target_weights(self.model)
        kept = {n: w.detach().clone() for n, w in stored.items()}
        losses = {"trained": trained_loss}
        for r in sorted({8, 16, self.s.rank, 2 * self.s.rank}):
            with torch.no_grad():
                for n, (U, S, Vh) in svd.items():
                    stored[n].copy_(self.base[n].to(stored[n].device) + (U[:, :r] * S[:r]) @ Vh[:r])
            losses[f"rank {r}" + (" (shipped)" if r == self.s.rank else "")] = self.heldout_loss()
        with torch.no_grad():
            for n, w in stored.items():
                w.copy_(kept[n])
        info["heldout_loss"] = losses
        return info


def _target_weights(model) -> dict[str, torch.nn.Parameter]:
    """The weight of every LORA_TARGETS linear layer of a causal LM, by its module's name."""
    return {name: mod.weight for name, mod in model.named_modules()
            if name.rsplit(".", 1)[-1] in LORA_TARGETS and isinstance(mod, torch.nn.Linear)}


def delta_svd(model, base: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each target weight's change from `base` (name -> W0) as its SVD, ΔW = U diag(S) Vh, float32
    on the model's device: (out, m), (m,), (m, in)."""
    out = {}
    for name, w in _target_weights(model).items():
        delta = w.detach().float() - base[name].to(w.device).float()  # (out, in)
        out[name] = torch.linalg.svd(delta, full_matrices=False)
    return out


def save_delta_adapter(svd: dict, rank: int, folder: Path) -> dict:
    """Store each weight's change (`delta_svd`) at its best rank-`rank` approximation as a peft LoRA
    adapter with scaling 1 (lora_alpha = r): ΔW ≈ B A, B = U_r S_r^½ (out, r), A = S_r^½ Vh_r (r, in),
    in float16. -> {"tune", "rank", "bytes", "energy_kept": Σ kept σ² / Σ σ² over every weight}."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors, kept, total = {}, 0.0, 0.0
    for name, (U, S, Vh) in svd.items():
        r = min(rank, S.numel())
        root = S[:r].sqrt()
        key = f"base_model.model.{name}"
        tensors[f"{key}.lora_A.weight"] = (root[:, None] * Vh[:r]).to(torch.float16).cpu().contiguous()  # (r, in)
        tensors[f"{key}.lora_B.weight"] = (U[:, :r] * root).to(torch.float16).cpu().contiguous()  # (out, r)
        kept, total = kept + float((S[:r] ** 2).sum()), total + float((S ** 2).sum())
    LoraConfig(r=rank, lora_alpha=rank, target_modules=list(LORA_TARGETS), bias="none").save_pretrained(str(folder))
    save_file(tensors, str(Path(folder) / "adapter_model.safetensors"))
    return {"tune": "full", "rank": rank, "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "energy_kept": round(kept / total, 4) if total else 1.0}


class RetrieverTrainer(Loop):
    """The retriever stage: only the question map trains, over each example's pool scored once by
    the frozen generator (`score_pools`).

    gen: the generator (models.decoder_only.DecoderOnlyGenerator) the demo answers with, its prompts
    the paper preset's; embeddings (N, D) the fixed index's passage vectors; passages the corpus's
    rows; qmap: the map to start from (None: a new one, the frozen retriever); end_of_turn: the
    token every target ends with (training/examples.target_ids)."""

    def __init__(self, gen, embeddings, passages, examples: list, settings: TrainSettings, work: Path, scale: float,
                 end_of_turn: int, qmap: QuestionMap | None = None, data_hash: str = "") -> None:
        from rag_demo.training.examples import target_ids

        super().__init__(examples, settings, work, data_hash)
        torch.manual_seed(settings.seed)
        self.gen, self.passages, self.scale = gen, passages, scale
        self.E = torch.tensor(np.asarray(embeddings), dtype=torch.float32)  # (N, D) a copy: the index's may be read-only
        self.qmap = qmap if qmap is not None else QuestionMap(self.E.shape[1])
        self.targets = {e.question: target_ids(gen.tokenizer, e.target, end_of_turn) for e in examples}
        self.pool_lp: dict[str, torch.Tensor] = {}
        self.best: tuple[int, dict] | None = None  # (held-out hits@5, the map) of the best evaluation
        self._optimizer([{"params": list(self.qmap.parameters()), "lr": settings.map_lr}])

    def _prompts(self, question: str, rows) -> list[list[int]]:
        from rag_demo.config import Decoding, ReaderAids
        from rag_demo.reader.reading import prompt

        return [prompt(self.gen, question, self.passages[int(r)], Decoding(), ReaderAids()) for r in rows]

    def loss_of(self, ex) -> torch.Tensor:
        """−log p(y|x) over the example's pool, the prior from the current map (rag_nll)."""
        qvec = torch.as_tensor(ex.qvec, dtype=torch.float32)  # (D,)
        pool = torch.tensor(ex.pool[: self.s.pool])  # (P,)
        rows, prior = retrieve(self.qmap, qvec, self.E, min(self.s.pool, len(pool)), self.scale, pool)  # (P,), (P,)
        where = {int(r): i for i, r in enumerate(pool)}
        lp = self.pool_lp[ex.question][[where[int(r)] for r in rows]]  # (P, T) scored once, no gradient
        return rag_nll(lp, prior, loss=self.s.loss)

    def _train_mode(self, on: bool) -> None:
        self.qmap.train(on)

    def weights_state(self) -> dict:
        return {"qmap": self.qmap.state_dict(), "best": self.best}

    def load_weights_state(self, state: dict) -> None:
        self.qmap.load_state_dict(state["qmap"])
        self.best = state["best"]

    def _before_run(self, show_bar: bool) -> None:
        if not self.pool_lp:
            self.score_pools(show_bar)

    @torch.inference_mode()
    def score_pools(self, show_bar: bool = True) -> None:
        """lp (P, T) of every example's pool under the frozen generator, once, the way the engine
        teacher-forces an answer (`gen.prefill` of the P prompts, then `decoding.score_candidates`);
        kept in the work folder, so a killed run scores only what it had not."""
        from rag_demo.rag.decoding import score_candidates

        path = self.work / "pool_scores.pt"
        key = {"data": self.data_hash, "pool": self.s.pool, "generator": self.gen.name, "target": "end of turn"}
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

    @torch.no_grad()
    def heldout_hits(self, k: int = 5) -> int:
        """How many held-out questions have a passage holding their answer in the tower's top k of
        the whole index (the stage keeps the map with the most)."""
        from rag_demo.questions import has_answer, passage_text

        if not self.held:
            return 0
        q = self.qmap(torch.as_tensor(np.stack([e.qvec for e in self.held]), dtype=torch.float32))  # (H, D)
        top = torch.topk(q @ self.E.T, k, dim=-1).indices  # (H, k)
        return sum(any(has_answer(passage_text(self.passages[int(r)]), [e.target]) for r in row)
                   for e, row in zip(self.held, top.tolist()))

    def _extra_row(self) -> dict:
        hits = self.heldout_hits()
        if self.best is None or hits > self.best[0]:  # ties keep the earlier, smaller change
            self.best = (hits, {k: v.clone() for k, v in self.qmap.state_dict().items()})
        return {"heldout_recall@5": hits / max(1, len(self.held))}

    def export(self, out: Path) -> dict:
        """Write the question map of the best held-out recall@5 into `out`; -> what was stored."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if self.best is not None:
            self.qmap.load_state_dict(self.best[1])
        self.qmap.eval()
        self.qmap.save(out / MAP_FILE)
        return {"file": MAP_FILE}


def write_curve(rows: list[dict], path: Path, stage: str) -> None:
    """curve.jsonl: the rows of other stages kept, this stage's replaced."""
    path = Path(path)
    old = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    keep = [r for r in old if r.get("stage") != stage] + rows
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
