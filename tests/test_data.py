import os

# Must precede the datasets/transformers imports: both read these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import logging
import random
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict, IterableDataset, load_from_disk
from transformers import AutoTokenizer

from conftest import hub_dataset_folder

from vanilla_transformer.data.corpora import (
    LengthFilterReport,
    load_dataset_by_name,
    load_parallel_data,
    load_parallel_text_files,
    load_translation_file,
    sentence_batches,
    tokenize_parallel,
)
from vanilla_transformer.data.tokenization import train_shared_tokenizer

EN_WORDS = "the a small house green tree dog runs quickly we see garden street over old new city".split()
DE_WORDS = "das ein Haus grüner Baum Hund läuft schnell wir sehen Garten Straße über alte Bäume Größe".split()


def make_pairs(n=200, seed=0):
    rng = random.Random(seed)

    def sentence(words):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(2, 10)))
        return body[0].upper() + body[1:] + rng.choice([".", "!", f" {rng.randint(0, 99)}?"])

    return [(sentence(EN_WORDS), sentence(DE_WORDS)) for _ in range(n)]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def jsonl_line(src, tgt, **extra):
    return json.dumps({"translation": {"en": src, "de": tgt}, **extra}, ensure_ascii=False)


@pytest.fixture(scope="module")
def pairs():
    return make_pairs()


@pytest.fixture(scope="module")
def files(pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    folder = root / "json_folder"
    folder.mkdir()
    jsonl = [jsonl_line(s, t, id=i) for i, (s, t) in enumerate(pairs)]
    return {
        "en": write_lines(root / "train.en", [s for s, _ in pairs]),
        "de": write_lines(root / "train.de", [t for _, t in pairs]),
        "tsv": write_lines(root / "train.tsv", [f"{s}\t{t}" for s, t in pairs]),
        "jsonl": write_lines(root / "train.jsonl", jsonl),
        "json": write_lines(root / "train.json", jsonl),
        "folder": write_lines(folder / "train.jsonl", jsonl).parent,
        "root": root,
    }


def expected(pairs):
    return [{"en": s, "de": t} for s, t in pairs]


def test_all_formats_load_the_same_content(pairs, files, tmp_path):
    loaded = {
        "text": load_parallel_text_files(files["en"], files["de"], "en", "de"),
        "tsv": load_translation_file(files["tsv"], "en", "de"),
        "jsonl": load_translation_file(files["jsonl"], "en", "de"),
        "json": load_translation_file(files["json"], "en", "de"),
        "folder": load_dataset_by_name(files["folder"], "en", "de", cache_dir=str(tmp_path / "cache"))["train"],
    }
    loaded["text"].save_to_disk(tmp_path / "saved")
    DatasetDict(train=loaded["tsv"]).save_to_disk(tmp_path / "saved_dict")
    loaded["saved"] = load_dataset_by_name(tmp_path / "saved", "en", "de")
    loaded["saved_dict"] = load_dataset_by_name(tmp_path / "saved_dict", "en", "de")["train"]
    for name, dataset in loaded.items():
        assert isinstance(dataset, Dataset), name
        assert dataset.column_names == ["translation"], name  # the jsonl "id" column is dropped
        assert dataset[:]["translation"] == expected(pairs), name


def test_dispatcher_picks_the_loader(pairs, files, tmp_path):
    cache = str(tmp_path / "cache")
    assert load_parallel_data(files["en"], "en", "de", target=files["de"])[:]["translation"] == expected(pairs)
    assert load_parallel_data(files["tsv"], "en", "de")[:]["translation"] == expected(pairs)
    by_folder = load_parallel_data(str(files["folder"]), "en", "de", cache_dir=cache)
    assert isinstance(by_folder, DatasetDict) and by_folder["train"].num_rows == len(pairs)
    by_builder = load_parallel_data("json", "en", "de", data_files=str(files["jsonl"]), split="train", cache_dir=cache)
    assert by_builder[:]["translation"] == expected(pairs)
    with pytest.raises(ValueError, match="config_name"):
        load_parallel_data(files["tsv"], "en", "de", config_name="de-en")


def test_reversed_direction_and_blank_pairs(tmp_path):
    src = write_lines(tmp_path / "a.de", ["Straße", "", "Größe  ", "Baum"])
    tgt = write_lines(tmp_path / "a.en", ["street", "", "size", "tree"])
    src.write_bytes("\ufeff".encode() + src.read_bytes())  # a leading BOM must not end up in the text
    dataset = load_parallel_text_files(src, tgt, "de", "en")
    assert dataset[:]["translation"][:2] == [{"de": "Straße", "en": "street"}, {"de": "Größe", "en": "size"}]
    assert dataset.num_rows == 3


def test_misaligned_files(tmp_path):
    src = write_lines(tmp_path / "m.en", ["a", "b", "c"])
    tgt = write_lines(tmp_path / "m.de", ["a", "b"])
    with pytest.raises(ValueError) as err:
        load_parallel_text_files(src, tgt, "en", "de")
    message = str(err.value)
    assert "m.en" in message and "m.de" in message and "3 lines" in message and "has 2" in message


def test_empty_file(tmp_path):
    src = write_lines(tmp_path / "ok.en", ["a"])
    empty = tmp_path / "empty.de"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.de is empty"):
        load_parallel_text_files(src, empty, "en", "de")
    with pytest.raises(ValueError, match=r"empty\.de is empty"):
        load_parallel_data(src, "en", "de", target=empty)
    blank_tsv = write_lines(tmp_path / "blank.tsv", ["", "  "])
    with pytest.raises(ValueError, match=r"blank\.tsv is empty"):
        load_translation_file(blank_tsv, "en", "de")


def test_empty_line_on_one_side(tmp_path):
    src = write_lines(tmp_path / "one.en", ["a", "b", "c"])
    tgt = write_lines(tmp_path / "one.de", ["a", " ", "c"])
    with pytest.raises(ValueError, match=r"one\.de, line 2: empty 'de' sentence"):
        load_parallel_text_files(src, tgt, "en", "de")
    tsv = write_lines(tmp_path / "one.tsv", ["a\tb", "\tb"])
    with pytest.raises(ValueError, match=r"one\.tsv, line 2: empty 'en' sentence"):
        load_translation_file(tsv, "en", "de")


def test_undecodable_bytes(tmp_path):
    src = write_lines(tmp_path / "bytes.en", ["a", "b", "c"])
    tgt = tmp_path / "bytes.de"
    tgt.write_bytes("a\nb\nGr".encode() + b"\xf6\xdfe\n")  # Latin-1 "Größe"
    with pytest.raises(ValueError, match=r"bytes\.de, line 3: not valid UTF-8") as err:
        load_parallel_text_files(src, tgt, "en", "de")
    assert isinstance(err.value.__cause__, UnicodeDecodeError)
    jsonl = tmp_path / "bytes.jsonl"
    jsonl.write_bytes(jsonl_line("a", "b").encode() + b"\n\xff\n")
    with pytest.raises(ValueError, match=r"bytes\.jsonl, line 2"):
        load_translation_file(jsonl, "en", "de")


def test_bad_tsv_line(tmp_path):
    tsv = write_lines(tmp_path / "bad.tsv", ["a\tb", "c\td", "only one column", "e\tf"])
    with pytest.raises(ValueError, match=r"bad\.tsv, line 3: expected 2 tab-separated columns .* found 1"):
        load_translation_file(tsv, "en", "de")
    tsv = write_lines(tmp_path / "three.tsv", ["a\tb\tc"])
    with pytest.raises(ValueError, match=r"three\.tsv, line 1: .* found 3"):
        load_translation_file(tsv, "en", "de")


def test_bad_jsonl(tmp_path):
    lines = [jsonl_line("a", "b"), json.dumps({"translation": {"en": "c"}})]
    missing = write_lines(tmp_path / "missing.jsonl", lines)
    with pytest.raises(ValueError, match=r"missing\.jsonl, line 2: language key 'de' is missing; .*present: \['en'\]"):
        load_translation_file(missing, "en", "de")
    with pytest.raises(ValueError, match=r"missing\.jsonl, line 1: language key 'fr' is missing; .*\['de', 'en'\]"):
        load_translation_file(missing, "fr", "de")
    broken = write_lines(tmp_path / "broken.json", [jsonl_line("a", "b"), '{"translation": '])
    with pytest.raises(ValueError, match=r"broken\.json, line 2: invalid JSON"):
        load_translation_file(broken, "en", "de")
    flat = write_lines(tmp_path / "flat.jsonl", [json.dumps({"en": "a", "de": "b"})])
    with pytest.raises(ValueError, match=r"flat\.jsonl, line 1: expected .*translation.* found keys \['de', 'en'\]"):
        load_translation_file(flat, "en", "de")
    not_text = write_lines(tmp_path / "number.jsonl", [json.dumps({"translation": {"en": "a", "de": 3}})])
    with pytest.raises(ValueError, match=r"number\.jsonl, line 1: language key 'de' is not a string"):
        load_translation_file(not_text, "en", "de")
    with pytest.raises(ValueError, match="unsupported extension"):
        load_translation_file(write_lines(tmp_path / "x.txt", ["a"]), "en", "de")


def test_dataset_without_translation_column(tmp_path):
    Dataset.from_dict({"text": ["a"]}).save_to_disk(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"no 'translation' column \(columns: \['text'\]\)"):
        load_dataset_by_name(tmp_path / "plain", "en", "de")
    Dataset.from_dict({"translation": [{"en": "a", "fr": "b"}]}).save_to_disk(tmp_path / "enfr")
    with pytest.raises(ValueError, match=r"no \['de'\] key; languages present: \['en', 'fr'\]"):
        load_dataset_by_name(tmp_path / "enfr", "en", "de")
    streamed = IterableDataset.from_generator(lambda: iter([{"translation": {"en": "a", "fr": "b"}}]))
    streamed._info.features = None  # the schema of a streamed dataset is only known once it is read
    from vanilla_transformer.data.corpora import _check_translation_column

    with pytest.raises(ValueError, match=r"no \['de'\] key"):
        _check_translation_column(streamed, "stream", "en", "de")


# --- tokenization and length filtering ---------------------------------------------------------


@pytest.fixture(scope="module")
def word_tokenizer():
    # Frequent whole words become single tokens, so "haus" * n encodes to exactly n + 1 ids (with </s>).
    return train_shared_tokenizer(["haus maus"] * 50, vocab_size=100, show_progress=False)


def repeated(word, n):
    return " ".join([word] * n)


def test_tokenize_parallel_filters_by_length(word_tokenizer, caplog):
    assert len(word_tokenizer(repeated("haus", 7)).input_ids) == 8
    # Source i has i words, target 11 - i words, for i = 1..10.
    dataset = Dataset.from_dict(
        {"translation": [{"en": repeated("haus", i), "de": repeated("maus", 11 - i)} for i in range(1, 11)]}
    )
    with caplog.at_level(logging.INFO, logger="vanilla_transformer.data.corpora"):
        filtered, report = tokenize_parallel(
            dataset, word_tokenizer, "en", "de", max_source_length=6, max_target_length=8
        )
    # Kept: source <= 5 words and target <= 7 words, i.e. i in {4, 5}; the limits themselves are inclusive.
    assert report == LengthFilterReport(
        kept=2,
        dropped=8,
        max_source_length=6,
        max_target_length=8,
        longest_dropped_source=11,
        longest_dropped_target=11,
    )
    assert report.as_dict()["dropped"] == 8
    assert filtered.column_names == ["input_ids", "labels"]  # the collator makes the attention mask
    assert [len(ids) for ids in filtered["input_ids"]] == [5, 6]
    assert [len(labels) for labels in filtered["labels"]] == [8, 7]
    assert filtered[0]["labels"] == word_tokenizer(repeated("maus", 7)).input_ids
    assert all(ids[-1] == word_tokenizer.eos_token_id for ids in filtered["input_ids"])
    lines = [record.getMessage() for record in caplog.records if record.name == "vanilla_transformer.data.corpora"]
    assert len(lines) == 1 and "kept 2 of 10" in lines[0] and "dropped 8" in lines[0]


def test_tokenize_parallel_keeps_everything_when_short(word_tokenizer, tmp_path):
    dataset = Dataset.from_dict({"translation": [{"en": "haus", "de": "maus maus"}] * 4})
    dataset.save_to_disk(tmp_path / "short")
    on_disk = load_from_disk(tmp_path / "short")  # disk-backed, so map() goes through the datasets cache
    filtered, report = tokenize_parallel(on_disk, word_tokenizer, "en", "de", 2, 3, num_proc=2)
    assert (report.kept, report.dropped, report.longest_dropped_source, report.longest_dropped_target) == (4, 0, 0, 0)
    assert filtered["labels"] == [word_tokenizer("maus maus").input_ids] * 4
    assert "kept 4 of 4" in str(report)


def test_tokenize_parallel_on_real_corpus(pairs, files):
    dataset = load_translation_file(files["tsv"], "en", "de")
    tokenizer = train_shared_tokenizer([s for p in pairs for s in p], vocab_size=300, show_progress=False)
    filtered, report = tokenize_parallel(dataset, tokenizer, "en", "de", 1024, 1024)
    assert report.kept == len(pairs) and filtered.num_rows == len(pairs)
    assert tokenizer.decode(filtered[0]["labels"], skip_special_tokens=True) == pairs[0][1]
    with pytest.raises(TypeError):
        tokenize_parallel(DatasetDict(train=dataset), tokenizer, "en", "de", 10, 10)


# --- Arrow, datasets by name and the cache --------------------------------------------------------


def test_text_files_are_read_once_into_a_memory_mapped_cache_that_follows_the_files(pairs, files, tmp_path):
    cache = tmp_path / "cache"
    first = load_parallel_text_files(files["en"], files["de"], "en", "de", cache_dir=cache)
    (arrow,) = [Path(f["filename"]) for f in first.cache_files]  # memory-mapped, not a Python list
    assert arrow.is_relative_to(cache) and first[:]["translation"] == expected(pairs)
    written = arrow.stat().st_mtime_ns
    again = load_parallel_text_files(files["en"], files["de"], "en", "de", cache_dir=cache)
    assert [f["filename"] for f in again.cache_files] == [str(arrow)] and arrow.stat().st_mtime_ns == written
    redone = load_parallel_text_files(files["en"], files["de"], "en", "de", cache_dir=cache,
                                      download_mode="force_redownload")
    assert arrow.stat().st_mtime_ns > written and redone[:]["translation"] == expected(pairs)
    # Edited files are read again: the cache is keyed by their size and modification time, not only their paths.
    edited = tmp_path / "train.de"
    write_lines(edited, [t for _, t in pairs[:-1]] + ["Geändert."])
    source = tmp_path / "train.en"
    source.write_bytes(files["en"].read_bytes())
    before = load_parallel_text_files(source, edited, "en", "de", cache_dir=cache)
    write_lines(edited, [t for _, t in pairs])
    assert before[-1]["translation"]["de"] == "Geändert."
    assert load_parallel_text_files(source, edited, "en", "de", cache_dir=cache)[-1]["translation"]["de"] == pairs[-1][1]


def test_a_refused_file_leaves_nothing_in_the_cache(tmp_path):
    src = write_lines(tmp_path / "one.en", ["a"] * 5)
    tgt = write_lines(tmp_path / "one.de", ["a"] * 4 + [""])
    with pytest.raises(ValueError, match=r"one\.de, line 5: empty 'de' sentence"):
        load_parallel_text_files(src, tgt, "en", "de", cache_dir=tmp_path / "cache")
    # datasets' own lock files stay, as after any build; no data does, so the next run reads the files again.
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix != ".lock"] == []


def test_long_files_are_checked_across_chunks(tmp_path, monkeypatch):
    from vanilla_transformer.data import corpora

    monkeypatch.setattr(corpora, "CHUNK", 3)  # errors must name the line in the file, not in its chunk
    src = write_lines(tmp_path / "long.en", [f"s{i}" for i in range(10)])
    tgt = write_lines(tmp_path / "long.de", [f"t{i}" for i in range(7)] + ["", "t8", "t9"])
    with pytest.raises(ValueError, match=r"long\.de, line 8: empty 'de' sentence"):
        load_parallel_text_files(src, tgt, "en", "de", cache_dir=tmp_path / "cache")
    short = write_lines(tmp_path / "short.de", [f"t{i}" for i in range(8)])
    with pytest.raises(ValueError, match=r"long\.en has 10 lines but .*short\.de has 8"):
        load_parallel_text_files(src, short, "en", "de", cache_dir=tmp_path / "cache")
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"".join(f"t{i}\n".encode() for i in range(7)) + b"\xff\nt8\nt9\n")
    with pytest.raises(ValueError, match=r"bad\.de, line 8: not valid UTF-8"):
        load_parallel_text_files(src, bad, "en", "de", cache_dir=tmp_path / "cache")
    loaded = load_parallel_text_files(src, write_lines(tmp_path / "ok.de", [f"t{i}" for i in range(10)]), "en", "de",
                                      cache_dir=tmp_path / "cache")
    assert [row["en"] for row in loaded["translation"]] == [f"s{i}" for i in range(10)]


def test_a_local_folder_in_the_hubs_layout_loads_by_name_and_config(pairs, tmp_path):
    from vanilla_transformer.training import load_raw_splits, parse_training_args

    folder = hub_dataset_folder(tmp_path / "wmt14", {"train": pairs[:150], "validation": pairs[150:170],
                                                     "test": pairs[170:]})
    loaded = load_parallel_data(folder, "en", "de", config_name="de-en", cache_dir=str(tmp_path / "cache"))
    assert sorted(loaded) == ["test", "train", "validation"]
    assert loaded["test"][:]["translation"] == expected(pairs[170:])
    # As transformers' run_translation.py spells it; --dataset stays an alias.
    for flag in ("--dataset_name", "--dataset"):
        data = parse_training_args(["--output_dir", str(tmp_path / "run"), flag, str(folder),
                                    "--dataset_config_name", "de-en", "--max_train_samples", "100"])[1]
        splits = load_raw_splits(data)
        assert {name: len(split) for name, split in splits.items()} == {"train": 100, "validation": 20, "test": 30}
    with pytest.raises(ValueError, match="fr-en"):
        load_parallel_data(folder, "en", "de", config_name="fr-en", cache_dir=str(tmp_path / "cache"))
    # Another folder of the same name, or this one edited, is read anew, not from the first one's cache.
    other = hub_dataset_folder(tmp_path / "elsewhere" / "wmt14", {"train": pairs[:10], "test": pairs[:3]})
    assert len(load_parallel_data(folder, "en", "de", config_name="de-en")["test"]) == 30
    assert len(load_parallel_data(other, "en", "de", config_name="de-en")["test"]) == 3
    hub_dataset_folder(folder, {"train": pairs[:150], "validation": pairs[150:170], "test": pairs[170:180]})
    assert len(load_parallel_data(folder, "en", "de", config_name="de-en")["test"]) == 10


def test_overwrite_cache_redoes_the_tokenizing_not_the_reading(pairs, files, tmp_path, monkeypatch):
    """As run_translation.py's flag: the ids are made again; files already read (and a dataset by name, which
    datasets keys by its files) are not read or downloaded again."""
    from vanilla_transformer.training import load_raw_splits, parse_training_args
    from vanilla_transformer.training.run import tokenize_splits

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = hub_dataset_folder(tmp_path / "wmt14", {"train": pairs[:150], "test": pairs[150:]})
    for source in (["--train_source_file", str(files["en"]), "--train_target_file", str(files["de"])],
                   ["--dataset_name", str(folder), "--dataset_config_name", "de-en"]):
        data = parse_training_args(["--output_dir", str(tmp_path / "run"), *source])[1]
        first = load_raw_splits(data)["train"]
        written = {f["filename"]: os.stat(f["filename"]).st_mtime_ns for f in first.cache_files}
        data = parse_training_args(["--output_dir", str(tmp_path / "run"), *source, "--overwrite_cache"])[1]
        again = load_raw_splits(data)["train"]
        assert {f["filename"]: os.stat(f["filename"]).st_mtime_ns for f in again.cache_files} == written
    # The ids: read back from the cache the second time, made again with --overwrite_cache.
    tokenizer = train_shared_tokenizer([s for pair in pairs for s in pair], vocab_size=300, show_progress=False)
    for flags, from_cache in (([], False), ([], True), (["--overwrite_cache"], False)):
        _, data, _, args = parse_training_args(["--output_dir", str(tmp_path / "run"), "--train_source_file",
                                                str(files["en"]), "--train_target_file", str(files["de"]), *flags])
        report = tokenize_splits(load_raw_splits(data), tokenizer, data, args)[2]
        assert report.tokenized_from_cache == from_cache
    with pytest.raises(TypeError, match="overwrite_cache=True does not apply to reading"):
        load_parallel_data(files["en"], "en", "de", target=files["de"], overwrite_cache=True)


def test_a_file_named_another_way_is_read_from_the_same_cache(files, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = load_parallel_text_files(files["en"], files["de"], "en", "de", cache_dir=cache)
    monkeypatch.chdir(files["en"].parent)
    relative = load_parallel_text_files("train.en", "./train.de", "en", "de", cache_dir=cache)
    assert relative.cache_files == first.cache_files


def test_the_vocabulary_trains_on_the_arrow_column_as_on_a_list(pairs, files, tmp_path):
    dataset = load_parallel_text_files(files["en"], files["de"], "en", "de", cache_dir=tmp_path / "cache")
    batches = list(sentence_batches(dataset, ("en", "de"), batch_size=64))
    assert [len(batch) for batch in batches] == [64, 64, 64, 64, 64, 64, 8, 8]
    from_list = train_shared_tokenizer([s for pair in pairs for s in pair], vocab_size=300, show_progress=False)
    from_column = train_shared_tokenizer(sentence_batches(dataset, ("en", "de")), vocab_size=300, show_progress=False)
    assert from_column.get_vocab() == from_list.get_vocab()


def test_tokenization_is_cached_by_data_and_vocabulary(pairs, files, tmp_path):
    dataset = load_parallel_text_files(files["en"], files["de"], "en", "de", cache_dir=tmp_path / "cache")
    trained = train_shared_tokenizer([s for pair in pairs for s in pair], vocab_size=300, show_progress=False)
    first, report = tokenize_parallel(dataset, trained, "en", "de", 64, 64, num_proc=2)
    assert not report.tokenized_from_cache
    # The same vocabulary loaded from disk by the next run finds the ids this run wrote.
    trained.save_pretrained(tmp_path / "bpe")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "bpe")
    second, report = tokenize_parallel(dataset, reloaded, "en", "de", 64, 64, num_proc=2)
    assert report.tokenized_from_cache and second[:] == first[:]
    assert second[3]["labels"] == trained(pairs[3][1]).input_ids
    assert not tokenize_parallel(dataset, reloaded, "en", "de", 64, 64, overwrite_cache=True)[1].tokenized_from_cache
    other = train_shared_tokenizer([s for pair in pairs for s in pair], vocab_size=200, show_progress=False)
    assert not tokenize_parallel(dataset, other, "en", "de", 64, 64)[1].tokenized_from_cache
