"""The bound's arithmetic counts the work a call really did (measure/bound.py): FLOPs and bytes of
known shapes on a tiny model, so the multiple `bench` reports cannot be flattered."""
from __future__ import annotations

import pytest
import torch

from rag_demo.measure.bound import Call, Dims, Rates, WorkCounter


def tiny(folder):
    from rag_demo.models.random_models import tiny_smollm_generator

    return tiny_smollm_generator(folder, layers=2, kv_heads=1).model


def test_a_calls_flops_and_bytes_are_those_of_its_shape(smollm_tokenizer_folder):
    """hidden 16, 2 heads of 8, 1 kv head of 8, intermediate 32, 2 layers: per layer q 16x16 (256), k
    and v 16x8 (128 each), o 16x16 (256), gate, up 16x32 and down 32x16 (512 each) = 2,304 weights;
    4,608 in the body."""
    model = tiny(smollm_tokenizer_folder)
    d = Dims.of(model)
    assert (d.body_params, d.layers, d.q_width, d.kv_width, d.hidden, d.weight_bytes) == (4608, 2, 16, 8, 16, 4)
    body = Call("body", rows=3, queries=5, keys=7)
    assert body.flops(d) == 2 * 4608 * 15 + 4 * 2 * 16 * 15 * 7
    assert body.bytes(d) == 4608 * 4  # the weights once; keys and values not counted (a shared opening is held once)
    head = Call("head", 1, 15)
    assert head.flops(d) == 2 * d.vocab * 16 * 15 and head.bytes(d) == d.vocab * 16 * 4
    r = Rates(prefill_flops=1e9, decode_flops=1e8, read_bytes=1e9)
    assert body.seconds(d, r) == pytest.approx(max(body.flops(d) / 1e8, body.bytes(d) / 1e9))  # 15 tokens: decode rate


@torch.inference_mode()
def test_the_counter_records_each_model_call_a_prefill_then_a_step(smollm_tokenizer_folder):
    model = tiny(smollm_tokenizer_folder)
    ids = torch.randint(5, 100, (3, 6))
    with WorkCounter(model) as work:
        out = model(input_ids=ids, attention_mask=torch.ones(3, 6, dtype=torch.long), use_cache=True)
        model(input_ids=ids[:, :1], attention_mask=torch.ones(3, 7, dtype=torch.long),
              past_key_values=out.past_key_values, use_cache=True)
    assert [(c.kind, c.rows, c.queries, c.keys) for c in work.calls] == [
        ("body", 3, 6, 6), ("head", 1, 18, 0), ("body", 3, 1, 7), ("head", 1, 3, 0)]
    d, r = Dims.of(model), Rates(1e9, 1e9, 1e9)
    total, prefill = work.bound(d, r)
    assert prefill == pytest.approx(sum(c.seconds(d, r) for c in work.calls[:2]))  # before the first step
    assert total == pytest.approx(sum(c.seconds(d, r) for c in work.calls))
    model(input_ids=ids)  # the hooks are gone
    assert len(work.calls) == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_machine_peak_is_a_real_rate_that_prices_a_call(dtype, smollm_tokenizer_folder):
    """The machine's own peak in each precision: a positive FLOP rate and read rate, the same FLOP
    rate at both shapes; a call's least time at those rates is positive and finite."""
    from rag_demo.measure.bound import Dims, WorkCounter, machine_peak
    from rag_demo.models.random_models import tiny_smollm_generator

    peak = machine_peak(dtype, repeats=1)
    assert peak.prefill_flops == peak.decode_flops > 1e8 and peak.read_bytes > 1e8
    gen = tiny_smollm_generator(smollm_tokenizer_folder, layers=1, kv_heads=2)
    with WorkCounter(gen.model) as work:
        gen.prefill([[1, 2, 3, 4]])
    total, _ = work.bound(Dims.of(gen.model), peak)
    assert 0 < total < 1


def test_the_cpu_flags_are_this_machines():
    from rag_demo.models.machine import cpu_flags

    flags = cpu_flags()
    text = open("/proc/cpuinfo").read()
    assert all(f" {f}" in text for f in flags) and ("avx2" in flags) == (" avx2" in text)


def test_a_batched_steps_bound_reads_the_weights_once_for_every_visitors_rows(smollm_tokenizer_folder):
    """Two visitors of 5 rows (attending to 100 and 300 positions) in one step: the FLOPs of all 10
    rows, the weights' bytes once (not once per visitor, as two separate calls would cost)."""
    from rag_demo.measure.batched import step_bound

    d = Dims.of(tiny(smollm_tokenizer_folder))
    r = Rates(prefill_flops=1e9, decode_flops=1e8, read_bytes=1e6)  # reading dominates at these rates
    both = step_bound(d, r, [(5, 100), (5, 300)])
    body_flops = 2 * 4608 * 10 + 4 * 2 * 16 * (5 * 100 + 5 * 300)
    # FLOPs at the best rate measured (the prefill's), bytes at the read rate
    expected = max(body_flops / 1e9, 4608 * 4 / 1e6) + max(2 * d.vocab * 16 * 10 / 1e9, d.vocab * 16 * 4 / 1e6)
    assert both == pytest.approx(expected)
    apart = step_bound(d, r, [(5, 100)]) + step_bound(d, r, [(5, 300)])
    assert both < apart  # one read of the weights for both


def test_bench_times_a_batched_step_for_each_number_of_visitors(gen, three_passage_pipe):
    from rag_demo.config import RagSettings
    from rag_demo.measure.batched import batched_steps

    pipe = three_passage_pipe(gen, ["Paris is the capital of France.", "Berlin is in Germany.", "Rome is old."],
                              RagSettings(k=2))
    rate = Rates(prefill_flops=1e9, decode_flops=1e9, read_bytes=1e9)
    out = batched_steps(pipe, ["Where is Paris?", "Where is Berlin?", "Is Rome old?"], RagSettings(k=2), rate,
                        visitors=(1, 3), steps=2)
    assert set(out) == {1, 3} and out[1]["rows"] == 2 and out[3]["rows"] == 6
    assert all(v["step_s"] > 0 and v["bound_s"] > 0 and v["multiple"] == v["step_s"] / v["bound_s"] for v in out.values())
    with pytest.raises(ValueError, match="needs 3 questions"):
        batched_steps(pipe, ["Where is Paris?"], RagSettings(k=2), rate, visitors=(1, 3))
