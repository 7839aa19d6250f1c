"""The least time an answer could take on this CPU, from the work it really did: `bench` reports
each mode's measured time as a multiple of it, so CPUs 2-3x apart compare on one scale.

Two rates of this CPU, measured with the generator's own layers in its own precision (`rates`):
matrix-multiply FLOP/s at the shapes it runs (a prefill's ~1,000 rows, a decoding step's ~10), and
how fast it reads weights (the output layer applied to a decoding step's rows). And the work of
each model call, counted by hooks on the model's body and its output layer (`WorkCounter`): a call
over R rows of L new tokens, attending to S positions, does

    body:  FLOPs = 2·P·R·L + 4·layers·(heads·d)·R·L·S      bytes read = P·b
    head:  FLOPs = 2·V·H·n  (n positions with logits)       bytes read = V·H·b

(P the body's linear weights, b bytes per weight). The keys and values a call reads are left out of
its bytes: the prompts' shared opening is held once for every row (DESIGN §5), so counting it per
row would overstate the least work, and a bound must not. A call cannot be faster than
max(FLOPs / rate, bytes / read rate); the bound is the sum over the calls, and the prefill bound
that sum over the calls before the first decoding step (a call with L = 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rag_demo.models.machine import best_of

PREFILL_ROWS, DECODE_ROWS = 1024, 10  # the shapes rates() measures at: a K = 5 prefill's rows, a step's rows


@dataclass(frozen=True)
class Rates:
    """This CPU's speed for one precision: FLOP/s at prefill and at decoding shapes, bytes/s read."""

    prefill_flops: float
    decode_flops: float
    read_bytes: float

    def to_dict(self) -> dict:
        return {"prefill_gflops": self.prefill_flops / 1e9, "decode_gflops": self.decode_flops / 1e9,
                "read_gbs": self.read_bytes / 1e9}


@dataclass(frozen=True)
class Dims:
    """What the work of a call depends on: the body's linear weights P, layers, the attention's
    query width (heads x head dim) and key width, the output layer V x H, bytes per weight."""

    body_params: int
    layers: int
    q_width: int
    kv_width: int
    vocab: int
    hidden: int
    weight_bytes: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Dims":
        cfg = model.config
        body = sum(m.weight.numel() for name, m in model.model.named_modules() if isinstance(m, torch.nn.Linear))
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        head = model.get_output_embeddings().weight
        return cls(body, cfg.num_hidden_layers, cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim,
                   head.shape[0], head.shape[1], head.element_size())


@dataclass(frozen=True)
class Call:
    kind: str  # "body" or "head"
    rows: int
    queries: int  # new tokens a row (body); positions with logits in all (head: rows = 1)
    keys: int = 0  # positions attended to (body)

    def flops(self, d: Dims) -> float:
        if self.kind == "head":
            return 2.0 * d.vocab * d.hidden * self.queries
        tokens = self.rows * self.queries
        return 2.0 * d.body_params * tokens + 4.0 * d.layers * d.q_width * tokens * self.keys

    def bytes(self, d: Dims) -> float:
        if self.kind == "head":
            return float(d.vocab * d.hidden * d.weight_bytes)
        return float(d.body_params * d.weight_bytes)

    def seconds(self, d: Dims, r: Rates) -> float:
        """The least time this call can take: max(compute at its shape's rate, reading its bytes)."""
        rate = r.prefill_flops if self.rows * self.queries >= 64 else r.decode_flops
        return max(self.flops(d) / rate, self.bytes(d) / r.read_bytes)


@dataclass
class WorkCounter:
    """Hooks on a causal LM's body (`model.model`) and output layer that record every call's shape
    while active (`with WorkCounter(model) as work: ...`)."""

    model: torch.nn.Module
    calls: list[Call] = field(default_factory=list)

    def __enter__(self) -> "WorkCounter":
        self._hooks = [self.model.model.register_forward_pre_hook(self._body, with_kwargs=True),
                       self.model.get_output_embeddings().register_forward_pre_hook(self._head)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()

    def _body(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"][..., 0]
        rows, queries = ids.shape[0], ids.shape[1]
        mask = kwargs.get("attention_mask")
        cache = kwargs.get("past_key_values")
        if mask is not None and mask.dim() == 2:
            keys = mask.shape[1]
        else:
            keys = queries + (cache.get_seq_length() if cache is not None else 0)
        self.calls.append(Call("body", rows, queries, keys))

    def _head(self, module, args) -> None:
        x = args[0]
        self.calls.append(Call("head", 1, x.numel() // x.shape[-1]))

    def bound(self, d: Dims, r: Rates) -> tuple[float, float]:
        """(the least seconds of every call, of the calls before the first decoding step)."""
        total = sum(c.seconds(d, r) for c in self.calls)
        first = next((i for i, c in enumerate(self.calls) if c.kind == "body" and c.queries == 1), len(self.calls))
        return total, sum(c.seconds(d, r) for c in self.calls[:first])


MAX_CALLS = 256
PEAK_SIDE = 2048  # the square matrix product the machine's peak is measured on: large enough to run at full rate
PEAK_READ_BYTES = 256 * 2**20  # the array the peak read streams through: far beyond any cache


@torch.inference_mode()
def rates(model: torch.nn.Module, repeats: int = 5) -> Rates:
    """This CPU's rates in the model's precision, through the model's own modules (float32 through
    its oneDNN linear layers, bfloat16 through torch's): its widest linear layer at PREFILL_ROWS
    and at DECODE_ROWS rows, and its output layer at DECODE_ROWS rows for reading weights."""
    lin = max((m for m in model.model.modules() if isinstance(m, torch.nn.Linear)), key=lambda m: m.weight.numel())
    head = model.get_output_embeddings()
    dtype = lin.weight.dtype
    out_f, in_f = lin.weight.shape
    rate = {}
    for rows in (PREFILL_ROWS, DECODE_ROWS):
        x = torch.randn(rows, in_f, dtype=dtype)
        # ~2 GFLOP a timing, long enough to time; at most MAX_CALLS calls, so a tiny test model's
        # timing is not a million Python calls (SmolLM2 needs about a hundred)
        n = max(1, min(MAX_CALLS, int(2e9 // (2 * rows * in_f * out_f))))
        rate[rows] = n * 2.0 * rows * in_f * out_f / best_of(lambda: [lin(x) for _ in range(n)], repeats)
    x = torch.randn(DECODE_ROWS, head.weight.shape[1], dtype=dtype)
    read = head.weight.numel() * head.weight.element_size() / best_of(lambda: head(x), repeats)
    return Rates(rate[PREFILL_ROWS], rate[DECODE_ROWS], read)


@torch.inference_mode()
def machine_peak(dtype: torch.dtype, repeats: int = 5) -> Rates:
    """The machine's own best in `dtype`, apart from any model: the sustained FLOP/s of a
    PEAK_SIDE-square matrix product (as both the prefill and the decoding rate) and the bytes/s of
    streaming once through a PEAK_READ_BYTES array (a sum reads every byte once). A second bound:
    the model-shape bound (`rates`) says what torch's kernels reach at the generator's shapes, this
    one what the machine could do at best."""
    a = torch.randn(PEAK_SIDE, PEAK_SIDE).to(dtype)
    b = torch.randn(PEAK_SIDE, PEAK_SIDE).to(dtype)
    flops = 2.0 * PEAK_SIDE ** 3 / best_of(lambda: torch.mm(a, b), repeats)
    x = torch.ones(PEAK_READ_BYTES // torch.finfo(dtype).bits * 8, dtype=dtype)
    read = x.numel() * x.element_size() / best_of(lambda: x.sum(), repeats)
    return Rates(flops, flops, read)
