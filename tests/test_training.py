"""Training (rag_demo/training/): the paper's loss falls on a tiny random generator for both
formulas, a killed run resumes to the same weights, the teacher-forced log-probs are the engine's,
and what ships (the adapter, the question map) loads, merges and is checked against its meta.

Tiny models and the three fixture passages for the logic; the shipped files' hashes and the trained
setting on the real offline stack (network off) at the end.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from rag_demo.models.trained import QuestionMap
from rag_demo.training.loop import Trainer, TrainSettings
from rag_demo.training.pairs import Pair

PAIRS = [
    Pair("Which river does Paris stand on?", ["Seine"], "year", "Paris#0"),
    Pair("Who painted The Starry Night?", ["Vincent van Gogh"], "agent", "The Starry Night#0"),
    Pair("Who flew in orbit while Armstrong and Aldrin walked on the Moon?", ["Michael Collins"], "agent", "Apollo 11#0"),
    Pair("Which museum holds The Starry Night?", ["Museum of Modern Art"], "agent", "The Starry Night#0"),
]
# Float32 on one CPU: the same operations in the same order give the same bits; 1e-6 leaves room
# for a different summation order in a BLAS call without hiding a skipped or repeated step (one
# step at lr 1e-2 moves the adapters by ~1e-3).
SAME = {"rtol": 0.0, "atol": 1e-6}


@pytest.fixture(scope="module")
def fixture_index(minilm, tmp_path_factory):
    from rag_demo.knowledge.corpus import corpus_from_documents
    from rag_demo.knowledge.index import load_or_build_index
    from rag_demo.models.random_models import fixture_passages

    corpus = corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()])
    index, _ = load_or_build_index(corpus, minilm, tmp_path_factory.mktemp("cache"))
    return index


@pytest.fixture(scope="module")
def examples(minilm, fixture_index):
    from rag_demo.training.examples import make_examples

    ex = make_examples(PAIRS, minilm, fixture_index, 3)
    assert [e.target for e in ex] == ["Seine", "Vincent van Gogh", "Michael Collins", "Museum of Modern Art"]
    return ex


def tiny_gen(folder, seed=0):
    """The tiny random Llama with its output layer scaled up: its final norm fixes the hidden state's
    length, and at the random init's scale (std 0.02) its logits span about ±0.3 whatever the
    adapters do, so no loss could fall far."""
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(folder, layers=2, kv_heads=1, seed=seed)
    with torch.no_grad():
        gen.model.lm_head.weight.mul_(50.0)
    return gen


def trainer(folder, index, examples, work, **given):
    settings = TrainSettings(**{"k": 2, "epochs": 4.0, "accumulate": 1, "lr": 3e-2, "map_lr": 1e-2, "eval_every": 2,
                                "ckpt_every": 2, "warmup": 1, **given})
    return Trainer(tiny_gen(folder), index.embeddings, index.corpus.passages, examples, settings, work, 20.0,
                   data_hash="fixture")


def mean_loss(tr, examples) -> float:
    tr.qmap.eval()
    if tr.model is not None:
        tr.model.eval()
    with torch.no_grad():
        return sum(float(tr.loss_of(e)) for e in examples) / len(examples)


@pytest.mark.parametrize("loss", ["sequence", "token"])
def test_a_tiny_generator_s_loss_falls_in_a_few_steps(smollm_tokenizer_folder, fixture_index, examples, tmp_path, loss):
    tr = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path, loss=loss)
    before = mean_loss(tr, examples)
    tr.run(show_bar=False)
    after = mean_loss(tr, examples)
    assert after < before - 5.0, (before, after)  # nats of −log p(y|x), summed over the answer's tokens
    assert [r["step"] for r in tr.curve.rows] == [0, 2, 4, 6, 8, 10, 12, 14, 16]


def test_the_retriever_stage_trains_only_the_question_map(smollm_tokenizer_folder, fixture_index, examples, tmp_path):
    """--retriever-only: every pool scored once by the frozen generator, then only the map moves
    (its loss falls); the generator's weights are the ones it started with."""
    tr = Trainer(tiny_gen(smollm_tokenizer_folder), fixture_index.embeddings, fixture_index.corpus.passages, examples,
                 TrainSettings.for_stage("retriever", pool=3, epochs=20.0, accumulate=2, map_lr=0.05, warmup=1),
                 tmp_path, 20.0, data_hash="fixture")
    weights = {n: p.clone() for n, p in tr.gen.model.named_parameters()}
    tr.score_pools(show_bar=False)
    before = mean_loss(tr, examples)
    tr.run(show_bar=False)
    assert mean_loss(tr, examples) < before
    assert tr.qmap.A.abs().max() > 0
    assert all(torch.equal(p, weights[n]) for n, p in tr.gen.model.named_parameters())
    assert (tmp_path / "pool_scores.pt").is_file()  # a killed run scores only what it had not


def test_a_killed_and_resumed_run_ends_in_the_same_weights(smollm_tokenizer_folder, fixture_index, examples, tmp_path):
    """Stopped after step 5 (its last checkpoint at step 4: step 5 is lost, as in a kill), then a new
    process resumes: the adapters, the map and the curve equal an uninterrupted run's."""
    from peft import get_peft_model_state_dict

    whole = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "whole")
    whole.run(show_bar=False)
    first = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "killed")
    first.run(show_bar=False, stop_after=5)
    assert first.step == 5
    again = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "killed")
    assert again.resume() and again.step == 4
    again.run(show_bar=False)
    a, b = get_peft_model_state_dict(whole.model), get_peft_model_state_dict(again.model)
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(b[name], a[name], **SAME)
    torch.testing.assert_close(again.qmap.A, whole.qmap.A, **SAME)
    assert [r["step"] for r in again.curve.rows] == [r["step"] for r in whole.curve.rows]
    with pytest.raises(ValueError, match="other settings or data"):
        trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "killed", lr=5e-3).resume()


def test_training_reads_the_log_probs_the_engine_scores_with(smollm_tokenizer_folder, fixture_index, examples):
    """answer_logprobs (one padded batch, with gradients) equals the engine's teacher-forcing of the
    same answer from the prefill (decoding.score_candidates) under the paper preset's prompts."""
    from rag_demo.config import Decoding, ReaderAids
    from rag_demo.rag.decoding import score_candidates
    from rag_demo.reader.reading import prompt
    from rag_demo.training.steps import answer_logprobs

    gen = tiny_gen(smollm_tokenizer_folder)
    ex = examples[0]
    prompts = [prompt(gen, ex.question, p, Decoding(), ReaderAids()) for p in fixture_index.corpus.passages]
    target = gen.tokenizer.encode(f" {ex.target}.", add_special_tokens=False)
    with torch.no_grad():
        ours = answer_logprobs(gen.model, prompts, target, gen.pad_token_id)  # (K, T)
    first, state = gen.prefill(prompts)
    engine, _ = score_candidates(gen, state, first, [target], gen.pad_token_id)  # (K, 1, T)
    torch.testing.assert_close(ours, engine[:, 0], rtol=0.0, atol=1e-4)  # float32, another attention kernel


def test_an_untrained_question_map_is_the_frozen_retriever():
    q = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    torch.testing.assert_close(QuestionMap(8)(q), q, rtol=0.0, atol=1e-7)


def test_an_adapter_merged_at_load_answers_as_the_adapter_did(smollm_tokenizer_folder, tmp_path):
    """merge_adapter gives the LoRA model's own outputs with no adapter left in it, and
    share_untouched makes the merged copy hold the base model's embeddings, not a copy."""
    from peft import LoraConfig, get_peft_model

    from rag_demo.models.trained import ADAPTER_DIR, adapter_targets, merge_adapter, share_untouched

    base = tiny_gen(smollm_tokenizer_folder).model
    lora = get_peft_model(tiny_gen(smollm_tokenizer_folder).model,
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # an adapter that changes something
    lora.save_pretrained(str(tmp_path / ADAPTER_DIR))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = lora.eval()(input_ids=ids).logits
        merged = merge_adapter(tiny_gen(smollm_tokenizer_folder).model, tmp_path)
        got = merged(input_ids=ids).logits
        assert not torch.allclose(base(input_ids=ids).logits, want, atol=1e-3)
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-5)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert share_untouched(merged, base, adapter_targets(tmp_path)) > 0
    assert merged.model.embed_tokens.weight is base.model.embed_tokens.weight


def test_the_shipped_files_hashes_match_their_meta(tmp_path):
    """assets/trained/meta.json names every shipped file's sha256; loading checks them, and a file
    changed after training is refused by name."""
    from rag_demo.models.trained import META_FILE, TRAINED_DIR, read_meta, shipped_files

    meta = read_meta(TRAINED_DIR)
    assert sorted(meta["files"]) == sorted(str(p.relative_to(TRAINED_DIR)) for p in shipped_files(TRAINED_DIR))
    assert {"retriever", "reader"} <= set(meta["stages"])
    copy = tmp_path / "trained"
    shutil.copytree(TRAINED_DIR, copy)
    (copy / "question_map.safetensors").write_bytes(b"not the trained map")
    with pytest.raises(ValueError, match="question_map.safetensors has sha256"):
        read_meta(copy)
    (copy / META_FILE).unlink()
    with pytest.raises(ValueError, match="holds no trained weights"):
        read_meta(copy)


def test_the_meta_says_how_the_data_was_made_and_never_names_a_report_question():
    """The pairs' meta counts each rule's pairs and the QA file's train split; none of the QA
    file's calibrate or report questions is in what trained (by id)."""
    from rag_demo.measure.qa_files import load_qa
    from rag_demo.models.trained import TRAINED_DIR
    from rag_demo.splits import split_of

    meta = json.loads((TRAINED_DIR / "meta.json").read_text())
    reader = meta["stages"]["reader"]
    pairs = reader["data"]["pairs_meta"]
    assert pairs["qa"]["split"] == "train" and pairs["qa"]["pairs"] > 0
    assert set(pairs["how"]) >= {"external", "definition", "year", "number", "agent"}
    assert reader["settings"]["seed"] == 0 and reader["cpu"] and reader["wall_seconds"] > 0
    items = load_qa("assets/qa_train_vital.jsonl")
    assert sum(split_of(str(it.meta["id"])) == "train" for it in items) == pairs["qa"]["pairs"]


@pytest.mark.parametrize("rule, title, sentence, first, made", [
    ("definition", "Canberra", "Canberra is the capital city of Australia.", True,
     ("What is the capital city of Australia?", "Canberra")),
    ("definition", "Canberra", "Canberra is the capital city of Australia.", False, None),  # not a lead sentence
    ("definition", "Ada Lovelace", "Ada Lovelace was an English mathematician and writer.", True,
     ("Who was an English mathematician and writer?", "Ada Lovelace")),
    ("relation", "Freedonia", "Its capital is Fredville.", False, ("What is the capital of Freedonia?", "Fredville")),
    ("year", "Eiffel Tower", "It was completed in 1889 for the fair.", False,
     ("Eiffel Tower was completed in what year for the fair?", "1889")),
    ("year", "X", "It was built in 1887 and opened in 1889.", False, None),  # two years: which one?
    ("number", "Germany", "Germany is a federation of 16 states.", False,
     ("Germany is a federation of how many states?", "16")),
    ("agent", "Hamlet", "Hamlet is a tragedy written by William Shakespeare.", False,
     ("Hamlet is a tragedy written by whom?", "William Shakespeare")),
    ("agent", "Things", "It is the debut novel by Nigerian author Chinua Achebe.", False, None),  # "by" + an adjective
])
def test_each_rule_makes_the_question_its_docstring_says(rule, title, sentence, first, made):
    from rag_demo.training.pairs import RULES

    assert RULES[rule](title, sentence, first) == made


@pytest.mark.slow
def test_the_trained_setting_loads_offline_and_every_card_says_which_weights_answered(vital_pipe):
    """preset="trained" on the real offline stack with the Hub off (conftest sets HF_HUB_OFFLINE):
    the shipped map and adapter load (hashes checked), the trained generator is a merged copy that
    shares the base model's embeddings, and every card names its weights; the base weights' answer
    is what it was."""
    import os

    from rag_demo.config import RagSettings
    from rag_demo.web.render import render_answer

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    q = "Who painted The Starry Night?"
    base = vital_pipe.answer(q, "token", RagSettings(preset="paper"))
    trained = vital_pipe.answer(q, "token", RagSettings(preset="trained"))
    again = vital_pipe.answer(q, "token", RagSettings(preset="paper"))
    assert base.token_ids == again.token_ids  # loading the trained weights changed nothing of the base ones
    models = vital_pipe.stack.modes_for("trained")["token"]
    gen, base_gen = models.generator, vital_pipe.stack.modes["token"].generator
    assert gen is not base_gen and gen.name.endswith("trained")
    assert gen.model.model.embed_tokens.weight is base_gen.model.model.embed_tokens.weight
    assert not any("lora" in n for n, _ in gen.model.named_parameters())
    assert trained.settings["weights"] == "trained" and base.settings["weights"] == "base"
    assert 'data-weights="trained"' in render_answer(trained.to_dict())
    assert 'data-weights="base"' in render_answer(base.to_dict())
