"""Training (rag_demo/training/): the paper's loss falls on a tiny random generator for both
formulas, a killed run resumes to the same weights, the teacher-forced log-probs are the engine's,
every target ends with the end of turn and a trained answer stops there, the trained change ships
at a rank whose loss is measured, and what ships loads, merges and is checked against its meta.

Tiny models and the three fixture passages for the logic; the shipped files' hashes and the trained
setting on the real offline stack (network off) at the end.
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from rag_demo.models.trained import QuestionMap
from rag_demo.training.loop import ReaderTrainer, RetrieverTrainer, TrainSettings
from rag_demo.training.pairs import Pair

PAIRS = [
    Pair("Which river does Paris stand on?", ["Seine"], "year", "Paris#0"),
    Pair("Who painted The Starry Night?", ["Vincent van Gogh"], "agent", "The Starry Night#0"),
    Pair("Who flew in orbit while Armstrong and Aldrin walked on the Moon?", ["Michael Collins"], "agent", "Apollo 11#0"),
    Pair("Which museum holds The Starry Night?", ["Museum of Modern Art"], "agent", "The Starry Night#0"),
]
# Float32 on one CPU: the same operations in the same order give the same bits; 1e-6 leaves room
# for a different summation order in a BLAS call without hiding a skipped or repeated step (one
# step at lr 1e-2 moves the weights by ~1e-3).
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


def tiny_gen(folder, seed=0, hidden=16):
    """The tiny random Llama with its output layer scaled up: its final norm fixes the hidden state's
    length, and at the random init's scale (std 0.02) its logits span about ±0.3 whatever the
    weights below do, so no loss could fall far."""
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(folder, layers=2, kv_heads=1, seed=seed, hidden=hidden)
    with torch.no_grad():
        gen.model.lm_head.weight.mul_(50.0)
    return gen


def prepared_of(gen, index, examples, k=2):
    from rag_demo.training.examples import prepare

    return prepare(examples, gen, index.corpus.passages, index.embeddings, k, 20.0, gen.tokenizer.eos_token_id)


def trainer(folder, index, examples, work, hidden=16, **given):
    settings = TrainSettings(**{"k": 2, "epochs": 4.0, "accumulate": 1, "lr": 3e-2, "eval_every": 2,
                                "ckpt_every": 2, "warmup": 1, **given})
    gen = tiny_gen(folder, hidden=hidden)
    tr = ReaderTrainer(gen.model, gen.pad_token_id, prepared_of(gen, index, examples, settings.k), settings, work,
                       data_hash="fixture")
    tr.gen = gen
    return tr


def mean_loss(tr) -> float:
    tr.model.eval()
    with torch.no_grad():
        return sum(float(tr.loss_of(e)) for e in tr.train + tr.held) / len(tr.train + tr.held)


@pytest.mark.parametrize("loss, tune", [("sequence", "full"), ("token", "full"), ("both", "lora")])
def test_a_tiny_generator_s_loss_falls_in_a_few_steps(smollm_tokenizer_folder, fixture_index, examples, tmp_path,
                                                      loss, tune):
    tr = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path, loss=loss, tune=tune,
                 **({"lr": 1e-2} if tune == "full" else {}))
    before = mean_loss(tr)
    tr.run(show_bar=False)
    after = mean_loss(tr)
    assert after < before - 5.0, (before, after)  # nats of −log p(y|x), summed over the answer's tokens
    assert [r["step"] for r in tr.curve.rows] == [0, 2, 4, 6, 8, 10, 12, 14, 16]


def test_every_target_ends_with_the_generator_s_end_of_turn(smollm_tokenizer_folder, fixture_index, examples):
    """The target is the answer with its full stop, then the end of the assistant's turn (the token
    SmolLM2's chat template closes a turn with), so a trained generator learns where an answer ends."""
    from rag_demo.training.examples import target_ids

    gen = tiny_gen(smollm_tokenizer_folder)
    eot = gen.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for p in prepared_of(gen, fixture_index, examples):
        assert p.target[-1] == eot and gen.tokenizer.decode(p.target[:-1]) == f" {p.answer}."
    assert target_ids(gen.tokenizer, "1969.", eot) == gen.tokenizer.encode(" 1969.", add_special_tokens=False) + [eot]


def test_a_trained_answer_stops_after_a_year_where_the_stop_rule_would_not(smollm_tokenizer_folder, fixture_index,
                                                                          minilm, tmp_path):
    """The short style's stop rule does not end at a period after a digit ("68.5 million"), so an
    answer "1969." ends only if the model ends its turn. Trained on targets that end with the end of
    turn, the tiny generator (64 wide: random_models.tiny_smollm_generator says why) answers "1969." and stops
    there, under both RAG modes of the paper."""
    from rag_demo.config import Decoding
    from rag_demo.rag.engine import rag_sequence, rag_token
    from rag_demo.training.examples import make_examples

    years = [Pair("In what year did the Eagle land on the Moon?", ["1969"], "year", "Apollo 11#0"),
             Pair("In what year did Van Gogh paint The Starry Night?", ["1889"], "year", "The Starry Night#0")]
    ex = make_examples(years, minilm, fixture_index, 2)
    tr = trainer(smollm_tokenizer_folder, fixture_index, ex, tmp_path, hidden=64, epochs=40.0, lr=1e-2, heldout=0.0,
                 eval_every=100, ckpt_every=100)
    tr.run(show_bar=False)
    gen, eot = tr.gen, tr.gen.tokenizer.eos_token_id
    gen.model.eval()
    for p in tr.train:
        prior = torch.tensor(p.prior)  # (K,) log p(z|x): as doc scores, the softmax gives it back
        for mode in (rag_token, rag_sequence):
            out = mode(gen, p.prompts, prior, Decoding())
            assert out.tokens == p.target, (mode.__name__, gen.tokenizer.decode(out.tokens))
            assert out.stopped == "eos" and out.tokens[-1] == eot
            assert not gen.stop_token_ids("short").ends_at(out.tokens, len(out.tokens) - 2)  # "." after a digit


def test_the_retriever_stage_trains_only_the_question_map(smollm_tokenizer_folder, fixture_index, examples, tmp_path):
    """--retriever-only: every pool scored once by the frozen generator, then only the map moves
    (its loss falls); the generator's weights are the ones it started with."""
    gen = tiny_gen(smollm_tokenizer_folder)
    tr = RetrieverTrainer(gen, fixture_index.embeddings, fixture_index.corpus.passages, examples,
                          TrainSettings.for_stage("retriever", pool=3, epochs=20.0, accumulate=2, map_lr=0.05, warmup=1),
                          tmp_path, 20.0, gen.tokenizer.eos_token_id, data_hash="fixture")
    weights = {n: p.clone() for n, p in gen.model.named_parameters()}
    tr.score_pools(show_bar=False)
    tr.qmap.eval()
    with torch.no_grad():
        before = sum(float(tr.loss_of(e)) for e in examples)
    tr.run(show_bar=False)
    tr.qmap.eval()
    with torch.no_grad():
        assert sum(float(tr.loss_of(e)) for e in examples) < before
    assert tr.qmap.A.abs().max() > 0
    assert all(torch.equal(p, weights[n]) for n, p in gen.model.named_parameters())
    assert (tmp_path / "pool_scores.pt").is_file()  # a killed run scores only what it had not


@pytest.mark.parametrize("tune", ["full", "lora"])
def test_a_killed_and_resumed_run_ends_in_the_same_weights(smollm_tokenizer_folder, fixture_index, examples, tmp_path,
                                                           tune):
    """Stopped after step 5 (its last checkpoint at step 4: step 5 is lost, as in a kill), then a new
    process resumes: the weights and the curve equal an uninterrupted run's."""
    lr = {"lr": 1e-2} if tune == "full" else {}
    whole = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "whole", tune=tune, **lr)
    whole.run(show_bar=False)
    first = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "killed", tune=tune, **lr)
    first.run(show_bar=False, stop_after=5)
    assert first.step == 5
    again = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "killed", tune=tune, **lr)
    assert again.resume() and again.step == 4
    again.run(show_bar=False)
    a, b = whole.weights_state(), again.weights_state()
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(b[name], a[name], **SAME)
    assert [r["step"] for r in again.curve.rows] == [r["step"] for r in whole.curve.rows]
    with pytest.raises(ValueError, match="other settings or data"):
        trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "killed", tune=tune, lr=5e-3).resume()


def test_the_full_change_ships_at_its_best_low_rank_and_says_what_that_costs(smollm_tokenizer_folder, fixture_index,
                                                                            examples, tmp_path):
    """export stores W - W0 of every target as a LoRA adapter (B A, float16): at the weight's full
    rank it is the trained weight itself; at a lower rank the truncated SVD, whose kept energy and
    held-out losses the meta entry reports. The adapter merges at load into W0 + B A."""
    from safetensors.torch import load_file

    from rag_demo.models.trained import ADAPTER_DIR, merge_adapter

    tr = trainer(smollm_tokenizer_folder, fixture_index, examples, tmp_path / "w", lr=1e-2, heldout=0.5)
    tr.run(show_bar=False)
    full = tr.export(tmp_path / "full")  # rank 32 > every tiny weight's rank (16): the whole change
    assert full["energy_kept"] == pytest.approx(1.0, abs=1e-6)
    assert full["heldout_loss"]["rank 32 (shipped)"] == pytest.approx(full["heldout_loss"]["trained"], abs=1e-2)
    tr.s = dataclasses.replace(tr.s, rank=2)  # the same trained weights, stored at a lower rank
    two = tr.export(tmp_path / "two")
    assert 0.0 < two["energy_kept"] < 1.0 and two["bytes"] < full["bytes"]
    assert set(two["heldout_loss"]) == {"trained", "rank 2 (shipped)", "rank 4", "rank 8", "rank 16"}
    # what merges at load is W0 + B A, within float16's rounding of the factors
    merged = merge_adapter(tiny_gen(smollm_tokenizer_folder).model, tmp_path / "two")
    stored = load_file(str(tmp_path / "two" / ADAPTER_DIR / "adapter_model.safetensors"))
    name = "model.layers.1.mlp.down_proj"
    B, A = (stored[f"base_model.model.{name}.lora_{x}.weight"].float() for x in "BA")
    want = tr.base[name] + B @ A
    torch.testing.assert_close(dict(merged.named_parameters())[f"{name}.weight"], want, rtol=0.0, atol=1e-5)


def test_training_reads_the_log_probs_the_engine_scores_with(smollm_tokenizer_folder, fixture_index, examples):
    """answer_logprobs (one padded batch, with gradients) equals the engine's teacher-forcing of the
    same answer from the prefill (decoding.score_candidates) under the paper preset's prompts."""
    from rag_demo.config import Decoding, ReaderAids
    from rag_demo.rag.decoding import score_candidates
    from rag_demo.reader.reading import prompt
    from rag_demo.training.examples import target_ids
    from rag_demo.training.steps import answer_logprobs

    gen = tiny_gen(smollm_tokenizer_folder)
    ex = examples[0]
    prompts = [prompt(gen, ex.question, p, Decoding(), ReaderAids()) for p in fixture_index.corpus.passages]
    target = target_ids(gen.tokenizer, ex.target, gen.tokenizer.eos_token_id)
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
    changed after training is refused by name. What ships is under 20 MB."""
    from rag_demo.models.trained import ADAPTER_DIR, META_FILE, TRAINED_DIR, read_meta, shipped_files

    meta = read_meta(TRAINED_DIR)
    assert sorted(meta["files"]) == sorted(str(p.relative_to(TRAINED_DIR)) for p in shipped_files(TRAINED_DIR))
    assert "reader" in meta["stages"] and sum(p.stat().st_size for p in shipped_files(TRAINED_DIR)) < 20e6
    copy = tmp_path / "trained"
    shutil.copytree(TRAINED_DIR, copy)
    (copy / ADAPTER_DIR / "adapter_model.safetensors").write_bytes(b"not the trained adapter")
    with pytest.raises(ValueError, match="adapter_model.safetensors has sha256"):
        read_meta(copy)
    (copy / META_FILE).unlink()
    with pytest.raises(ValueError, match="holds no trained weights"):
        read_meta(copy)


@pytest.mark.slow
def test_the_pairs_that_trained_are_made_again_and_none_is_a_calibrate_or_report_question(vital_pipe, tmp_path):
    """The reader stage's pairs are made again from the shipped QA files and the corpus with the
    seed and count its meta records: the same file, byte for byte (its sha256 is the meta's). Every
    real question in it is a train-split question labelled answerable, no corpus pair asks a
    calibrate or report question, no question is asked twice, and the counts are the meta's."""
    from rag_demo.questions import answerable_ids, load_qa
    from rag_demo.models.trained import TRAINED_DIR
    from rag_demo.reader.text import normalize_answer
    from rag_demo.splits import split_of
    from rag_demo.training.pairs import file_hash
    from rag_demo.training.run import make_pair_file, read_pairs

    reader = json.loads((TRAINED_DIR / "meta.json").read_text())["stages"]["reader"]
    made = reader["data"]["pairs_meta"]
    files = [q["file"] for q in made["qa"]]
    path = tmp_path / "pairs.jsonl"
    make_pair_file(path, files, vital_pipe.index.corpus.passages, made["seed"], made["n_corpus"])
    assert file_hash(path) == made["sha256"] == reader["data"]["sha256"]
    pairs = read_pairs(path)
    labels = {i: ok for f in files for i, ok in answerable_ids(f).items()}
    real = [p for p in pairs if p.kind == "external"]
    assert real and all(split_of(p.source) == "train" and labels[p.source] for p in real)
    held = {normalize_answer(it.question) for f in files for it in load_qa(f)
            if split_of(str(it.meta["id"])) != "train"}
    assert not any(normalize_answer(p.question) in held for p in pairs)
    assert len({normalize_answer(p.question) for p in pairs}) == len(pairs)
    assert [q["pairs"] for q in made["qa"]] == [sum(p.source in answerable_ids(f) for p in real) for f in files]
    assert {k: v["sampled"] for k, v in made["corpus_rules"].items()} == {
        k: sum(p.kind == k for p in pairs) for k in made["corpus_rules"]}
    assert reader["settings"]["seed"] == made["seed"] and reader["device"] and reader["seconds_last_process"] > 0


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
