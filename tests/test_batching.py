"""Token-based batching (§5.1): the promises of `TokenBucketBatchSampler` and its wiring into PaperTrainer."""

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

from conftest import VOCAB, tiny_model, tiny_tokenizer
from vanilla_transformer.data import batching
from vanilla_transformer.data.batching import TokenBucketBatchSampler, TranslationDataCollator, batch_cost
from vanilla_transformer.training import PaperTrainer, TranslationTrainingArguments
from vanilla_transformer.training.trainer import TokenBatches

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 120


def lengths(n=500, seed=0, longest=40):
    rng = np.random.default_rng(seed)
    source = rng.integers(1, longest, n)
    target = np.clip(source + rng.integers(-5, 6, n), 1, None)
    source[:3] = [BUDGET + 7, 2, 3]  # one example longer than the whole budget
    return source, target


def sampler(epoch=0, **kwargs):
    source, target = lengths()
    values = dict(max_tokens=BUDGET, seed=1, **kwargs)
    result = TokenBucketBatchSampler(source, target, **values)
    result.set_epoch(epoch)
    return result


def test_every_example_appears_exactly_once_per_epoch():
    for epoch in range(3):
        batches = list(sampler(epoch))
        assert sorted(i for batch in batches for i in batch) == list(range(500))


def test_no_batch_exceeds_the_budget_except_a_single_over_long_example():
    source, target = lengths()
    batches = list(sampler())
    over = [b for b in batches if batch_cost(source[b], target[b]) > BUDGET]
    assert over == [[0]]  # the over-long example, alone
    # Greedy packing: most batches are nearly full, and sorting keeps padding low.
    real = sum(int(source[b].sum() + target[b].sum()) for b in batches)
    padded = sum(len(b) * int(source[b].max() + target[b].max()) for b in batches)
    assert real / padded > 0.85


def test_the_same_seed_and_epoch_give_the_same_batches_and_other_epochs_differ():
    assert list(sampler(epoch=2)) == list(sampler(epoch=2))
    assert list(sampler(epoch=2)) != list(sampler(epoch=3))
    source, target = lengths()
    assert list(sampler(epoch=2)) != list(TokenBucketBatchSampler(source, target, BUDGET, seed=2))
    # Not only the order: the compositions change between epochs too (equal-length pairs trade places).
    as_sets = [{frozenset(b) for b in sampler(epoch=e)} for e in (0, 1)]
    assert as_sets[0] != as_sets[1]


def test_len_is_exact_and_the_same_in_every_epoch():
    counts = {len(list(sampler(epoch))) for epoch in range(4)}
    assert counts == {len(sampler())}


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_ranks_get_disjoint_shares_of_equal_size_that_cover_the_data(num_replicas):
    shares = [list(sampler(epoch=1, num_replicas=num_replicas, rank=r)) for r in range(num_replicas)]
    assert len({len(share) for share in shares}) == 1
    assert all(len(share) == len(sampler(num_replicas=num_replicas, rank=r)) for r, share in enumerate(shares))
    seen = [i for share in shares for batch in share for i in batch]
    assert sorted(seen) == list(range(500))  # disjoint and complete: nothing dropped, nothing repeated
    single = len(sampler())
    assert single <= num_replicas * len(shares[0]) < single + num_replicas  # at most replicas - 1 batches split


def test_an_odd_batch_count_is_evened_out_by_splitting_not_dropping():
    source = target = np.full(6, 10)  # six one-example batches at a budget of 10, plus one of two that splits
    odd = TokenBucketBatchSampler(np.append(source, [5, 5]), np.append(target, [5, 5]), 10, num_replicas=2)
    assert len(odd) == 4 and not odd._num_repeated
    # Fewer examples than ranks can fill: batches are repeated so every rank still steps together.
    tiny = [TokenBucketBatchSampler([4, 4, 4], [4, 4, 4], 4, num_replicas=2, rank=r) for r in (0, 1)]
    assert [len(list(s)) for s in tiny] == [2, 2]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBucketBatchSampler([1], [1], 0)
    with pytest.raises(ValueError, match="same size"):
        TokenBucketBatchSampler([1, 2], [1], 10)
    with pytest.raises(ValueError, match="rank"):
        TokenBucketBatchSampler([1], [1], 10, num_replicas=2, rank=2)


def tokenized_split(n=64, seed=0, longest=15):
    rng = np.random.default_rng(seed)
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for _ in range(n):
        s, t = rng.integers(2, longest, 2)
        rows["input_ids"].append(rng.integers(4, 48, s).tolist() + [2])
        rows["attention_mask"].append([1] * (s + 1))
        rows["labels"].append(rng.integers(4, 48, t).tolist() + [2])
    return Dataset.from_dict(rows)


def test_paper_trainer_trains_on_token_batches_and_counts_epochs_and_items(tmp_path):
    model, tokenizer, dataset = tiny_model(), tiny_tokenizer(), tokenized_split()
    args = TranslationTrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, gradient_accumulation_steps=2,
                                        report_to="none", save_strategy="no", use_cpu=True, logging_steps=1,
                                        learning_rate=1e-3, generation_num_beams=None)
    trainer = PaperTrainer(model=model.train(), args=args, train_dataset=dataset, max_tokens_per_batch=64,
                           data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100))
    loader = trainer.get_train_dataloader()
    batches = list(loader)
    assert len(batches) == len(loader)
    # Trainer's own loader, on the token batches: the sampler is reached through accelerate's wrapper, if any.
    sampler = getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler)
    assert isinstance(sampler, TokenBatches) and type(sampler).__iter__ is TokenBucketBatchSampler.__iter__
    assert len(sampler) == len(loader)
    assert sum(len(b["input_ids"]) for b in batches) == len(dataset)
    for b in batches:
        assert b["input_ids"].numel() <= 64 and b["labels"].numel() <= 64  # padded size counts
    # num_items_in_batch: the real target tokens of the whole optimizer step.
    _, items = trainer.get_batch_samples(iter(batches[:2]), 2, torch.device("cpu"))
    assert int(items) == sum(int((b["labels"] != -100).sum()) for b in batches[:2])
    trainer.train()
    assert trainer.state.global_step == -(-len(loader) // 2)  # epochs are counted in token batches


def test_train_script_runs_with_a_token_budget(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    words = ["ein", "Hund", "läuft", "über", "die", "Wiese", "a", "dog", "runs", "across", "the", "meadow"]
    for split, n in (("train", 80), ("val", 4)):
        lines = [" ".join(rng.choice(words, rng.integers(2, 12))) for _ in range(n)]
        (tmp_path / f"{split}.en").write_text("\n".join(lines) + "\n")
        (tmp_path / f"{split}.de").write_text("\n".join(reversed(lines)) + "\n")
    from vanilla_transformer.training.trainer import PaperTrainer

    seen, sampler = [], PaperTrainer._get_train_sampler
    monkeypatch.setattr(PaperTrainer, "_get_train_sampler",
                        lambda trainer, dataset=None: seen.append(sampler(trainer, dataset)) or seen[-1])
    main = runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="cli")["main"]
    out = tmp_path / "run"
    main(["--output_dir", str(out), "--preset", "tiny", "--vocab_size", "200", "--max_tokens_per_batch", "96",
          "--max_steps", "3", "--noam_warmup_steps", "2", "--report_to", "none", "--save_strategy", "no",
          "--eval_strategy", "no", "--use_cpu", "--generation_max_length", "8",
          "--train_source_file", str(tmp_path / "train.en"), "--train_target_file", str(tmp_path / "train.de"),
          "--validation_source_file", str(tmp_path / "val.en"), "--validation_target_file", str(tmp_path / "val.de")])
    assert [batches.max_tokens for batches in seen] == [96]
    results = json.loads((out / "results.json").read_text())
    assert np.isfinite(results["train"]["train_loss"]) and "bleu" in results["validation"]


def test_a_run_resumed_mid_epoch_sees_the_same_token_batches_as_an_uninterrupted_one(tmp_path):
    tokenizer, dataset = tiny_tokenizer(), tokenized_split()

    def train(output_dir, max_steps, resume=None):
        model = tiny_model().train()
        seen = []
        model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].clone()),
                                        with_kwargs=True)
        args = TranslationTrainingArguments(output_dir=str(output_dir), max_steps=max_steps, save_steps=1,
                                            save_strategy="steps", report_to="none", use_cpu=True, seed=3,
                                            learning_rate=1e-3, generation_num_beams=None, save_total_limit=None)
        trainer = PaperTrainer(model=model, args=args, train_dataset=dataset, max_tokens_per_batch=64,
                               data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100))
        steps_per_epoch = len(trainer.get_train_dataloader())
        trainer.train(resume_from_checkpoint=resume)
        return seen, steps_per_epoch

    probe, steps_per_epoch = train(tmp_path / "probe", 1)
    total = 2 * steps_per_epoch + 3  # into the third epoch, so the resumed epoch is not the first
    stop = steps_per_epoch * 2 + 1
    full, _ = train(tmp_path / "full", total)
    train(tmp_path / "part", stop)
    resumed, _ = train(tmp_path / "part", total, resume=str(tmp_path / "part" / f"checkpoint-{stop}"))
    assert len(resumed) == total - stop
    for got, want in zip(resumed, full[stop:]):
        assert torch.equal(got, want)
    assert not torch.equal(full[0], full[steps_per_epoch]) or not torch.equal(full[1], full[steps_per_epoch + 1])


# Padding to a multiple (--pad_to_multiple_of): fewer shapes for a compiled model, and the budget counts it ------

def test_the_budget_counts_the_padding_to_a_multiple():
    source, target = lengths()
    batches = sampler(pad_to_multiple_of=8).global_batches()
    for batch in batches:
        cost = batch_cost(source[batch], target[batch], pad_to_multiple_of=8)
        assert cost <= BUDGET or len(batch) == 1
    # Rounding up makes rows wider, so the same budget holds fewer of them than without it.
    assert len(batches) > len(sampler().global_batches())
    assert batch_cost([5, 9], [3, 2], pad_to_multiple_of=8) == 2 * 16 and batch_cost([5], [3]) == 5
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an int of at least 1, got 0"):
        sampler(pad_to_multiple_of=0)


def token_batches(output_dir, pad_to_multiple_of, budget=256):
    model, tokenizer, dataset = tiny_model(), tiny_tokenizer(), tokenized_split(n=300, longest=60)
    args = TranslationTrainingArguments(output_dir=str(output_dir), report_to="none", use_cpu=True,
                                        generation_num_beams=None)
    collator = TranslationDataCollator(tokenizer, model=model, label_pad_token_id=-100,
                                       pad_to_multiple_of=pad_to_multiple_of)
    trainer = PaperTrainer(model=model, args=args, train_dataset=dataset, max_tokens_per_batch=budget,
                           data_collator=collator)
    return list(trainer.get_train_dataloader())


def test_padded_token_batches_fit_the_budget_and_leave_a_handful_of_shapes(tmp_path):
    padded, unpadded = token_batches(tmp_path, 8), token_batches(tmp_path, None)
    for batch in padded:
        assert batch["input_ids"].shape[1] % 8 == 0 and batch["labels"].shape[1] % 8 == 0
        assert batch["input_ids"].numel() <= 256 and batch["labels"].numel() <= 256
    for name in ("input_ids", "labels"):  # lengths 3..60: at most 8 widths instead of one per length
        assert len({b[name].shape[1] for b in padded}) <= 8 < 20 < len({b[name].shape[1] for b in unpadded})


def test_a_compiled_model_does_not_recompile_for_every_new_batch_shape(tmp_path):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    compiled_graphs = []

    def counting(graph_module, example_inputs):
        compiled_graphs.append(graph_module)
        return make_boxed_func(graph_module.forward)

    batches = token_batches(tmp_path, 8)
    model = tiny_model().train()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(
        fw_compiler=counting, bw_compiler=lambda graph_module, example_inputs: make_boxed_func(graph_module.forward)))
    for batch in batches:
        compiled(**batch).loss.backward()
    # torch.compile specialises on the first shape, then makes each dimension that changes dynamic (batch, source
    # and target width): a graph per varying dimension at most, however many shapes come.
    shapes = {(b["input_ids"].shape, b["labels"].shape) for b in batches}
    assert len(shapes) >= 10 and len(compiled_graphs) <= 4, (len(shapes), len(compiled_graphs))


# The ids are checked on the CPU, in the collator: the model in training reads none back ----------------------

def test_the_collator_names_an_id_outside_the_vocabulary():
    model, tokenizer = tiny_model(), tiny_tokenizer()
    collator = TranslationDataCollator(tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=8)
    good = {"input_ids": [5, 6, 2], "attention_mask": [1, 1, 1], "labels": [7, 2]}
    batch = collator([good, {**good, "labels": [9, 10, 11, 2]}])  # labels padded with -100: accepted
    assert batch["labels"].shape == (2, 8) and int(batch["labels"][0, -1]) == -100
    with pytest.raises(ValueError, match=f"`input_ids` holds id {VOCAB + 1}, outside the vocabulary"):
        collator([good, {**good, "input_ids": [5, VOCAB + 1, 2]}])
    with pytest.raises(ValueError, match="`labels` holds id -3"):
        collator([good, {**good, "labels": [-3, 2]}])


# §5.1's batch per optimizer step, planned for any number of processes -------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 8])
def test_the_planned_batch_holds_the_asked_tokens_per_step_whatever_the_number_of_processes(world_size):
    rng = np.random.default_rng(0)  # sentence lengths shaped like WMT's BPE: long-tailed, German a little longer
    source = np.clip(rng.lognormal(3.2, 0.6, 40_000).astype(int) + 1, 2, 128)
    target = np.clip((source * rng.normal(1.1, 0.15, source.size)).astype(int), 2, 128)
    plan = batching.plan_token_batches(25_000, world_size, 12_000, source, target, pad_to_multiple_of=8)
    assert plan.max_tokens_per_batch <= 12_000 and plan.world_size == world_size
    # What the run will see: every rank's own batches, `accumulation` of them per optimizer step.
    accumulation = plan.gradient_accumulation_steps
    ranks = [TokenBucketBatchSampler(source, target, plan.max_tokens_per_batch, seed=3, num_replicas=world_size,
                                     rank=rank, pad_to_multiple_of=8) for rank in range(world_size)]
    per_rank = [list(sampler) for sampler in ranks]
    steps = len(per_rank[0]) // accumulation
    for lengths in (source, target):
        tokens = [sum(int(lengths[b].sum()) for rank in per_rank for b in rank[k * accumulation:(k + 1) * accumulation])
                  for k in range(steps)]
        assert abs(np.mean(tokens) - 25_000) < 0.1 * 25_000, (world_size, np.mean(tokens))
    assert "accumulation steps" in str(plan)
    with pytest.raises(ValueError, match="cannot be shared by world_size=30000 processes"):
        batching.plan_token_batches(25_000, 30_000, 12_000, source, target)


def test_token_dropout_replaces_only_the_inputs_real_tokens_by_unk_in_training(tmp_path, monkeypatch):
    model, tokenizer, dataset = tiny_model(), tiny_tokenizer(), tokenized_split(n=64)
    args = TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                                        generation_num_beams=None)
    trainer = PaperTrainer(model=model, args=args, train_dataset=dataset, max_tokens_per_batch=2000,
                           processing_class=tokenizer, token_dropout=0.3,
                           data_collator=TranslationDataCollator(tokenizer, model=model, label_pad_token_id=-100))
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    dropped = trainer.drop_tokens(batch)
    assert torch.equal(dropped["labels"], batch["labels"]) and torch.equal(dropped["attention_mask"],
                                                                           batch["attention_mask"])
    unk, special = tokenizer.unk_token_id, torch.tensor(tokenizer.all_special_ids)
    for name in ("input_ids", "decoder_input_ids"):
        before, after = batch[name], dropped[name]
        changed = before != after
        assert (after[changed] == unk).all()
        assert not torch.isin(before[changed], special).any()  # pad, bos, eos stay
        rate = changed.sum() / (~torch.isin(before, special)).sum()
        assert 0.2 < rate < 0.4, (name, rate)
    # Applied in training_step, which evaluation does not call; off by default.
    seen = []
    monkeypatch.setattr(Seq2SeqTrainer, "training_step", lambda self, model, inputs, items=None: seen.append(inputs))
    trainer.training_step(model, batch)
    PaperTrainer(model=model, args=args, processing_class=tokenizer).training_step(model, batch)
    assert (seen[0]["input_ids"] == unk).any() and (seen[0]["decoder_input_ids"] == unk).any()
    assert seen[1] is batch
    # A collator that leaves the decoder's input to the model: the shifted labels are dropped all the same.
    no_decoder_input = {k: v for k, v in batch.items() if k != "decoder_input_ids"}
    dropped = trainer.drop_tokens(no_decoder_input)
    kept = dropped["decoder_input_ids"] != unk
    assert torch.equal(dropped["decoder_input_ids"][kept], batch["decoder_input_ids"][kept]) and not kept.all()


def test_token_dropout_without_an_unknown_token_is_refused(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.unk_token = None
    args = TranslationTrainingArguments(output_dir=str(tmp_path / "run"), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="--token_dropout 0.1 replaces tokens by the tokenizer's unknown token"):
        PaperTrainer(model=tiny_model(), args=args, processing_class=tokenizer, token_dropout=0.1)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["1.0", "-0.1", "nan"])
def test_a_token_dropout_that_is_not_a_probability_is_refused(value):
    from vanilla_transformer.training import parse_training_args
    with pytest.raises(ValueError, match=f"--token_dropout must be a probability in \\[0, 1\\), got {value}"):
        parse_training_args(["--output_dir", "unused", "--token_dropout", value])
