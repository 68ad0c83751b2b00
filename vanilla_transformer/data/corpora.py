"""Parallel corpora in the Hugging Face translation format: {"translation": {src_lang: ..., tgt_lang: ...}}."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from datasets import (
    Dataset,
    DatasetDict,
    Features,
    IterableDataset,
    IterableDatasetDict,
    Translation,
    config,
    load_dataset,
    load_from_disk,
)
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
# (source, target, where the source came from, where the target came from)
_Row = tuple[str, str, str, str]


def _read_lines(path: PathLike) -> list[str]:
    # Binary mode: text mode reports decode errors without a line number. Splitting on b"\n" only (unlike
    # str.splitlines(), which also splits on U+2028/U+0085 inside sentences) keeps both sides aligned.
    lines = []
    with open(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                lines.append(raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}, line {lineno}: not valid UTF-8 ({err.reason} at byte {err.start} of the line)"
                ) from err
    if not any(line.strip() for line in lines):
        raise ValueError(f"{path} is empty")
    return lines


def _to_dataset(rows: Iterator[_Row], src_lang: str, tgt_lang: str, origin: str) -> Dataset:
    if src_lang == tgt_lang:
        raise ValueError(f"src_lang and tgt_lang (--source_lang, --target_lang) are both {src_lang!r}")
    records, blank = [], 0
    for src, tgt, src_where, tgt_where in rows:
        if not src.strip() and not tgt.strip():
            blank += 1  # blank on both sides: a document separator in corpora like News Commentary
            continue
        for text, where, lang in ((src, src_where, src_lang), (tgt, tgt_where, tgt_lang)):
            if not text.strip():
                raise ValueError(f"{where}: empty {lang!r} sentence while the other side is not empty")
        records.append({src_lang: src, tgt_lang: tgt})
    if blank:
        logger.info("%s: skipped %d lines that are blank on both sides", origin, blank)
    features = Features({"translation": Translation(languages=[src_lang, tgt_lang])})
    return Dataset.from_dict({"translation": records}, features=features)


def load_parallel_text_files(src_path: PathLike, tgt_path: PathLike, src_lang: str, tgt_lang: str) -> Dataset:
    src_lines, tgt_lines = _read_lines(src_path), _read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; "
            "parallel text files must be line-aligned"
        )
    rows = (
        (src.strip(), tgt.strip(), f"{src_path}, line {lineno}", f"{tgt_path}, line {lineno}")
        for lineno, (src, tgt) in enumerate(zip(src_lines, tgt_lines), start=1)
    )
    return _to_dataset(rows, src_lang, tgt_lang, origin=f"{src_path} + {tgt_path}")


def _tsv_rows(path: PathLike) -> Iterator[_Row]:
    for lineno, line in enumerate(_read_lines(path), start=1):
        where = f"{path}, line {lineno}"
        if not line.strip():
            yield "", "", where, where
            continue
        columns = line.split("\t")
        if len(columns) != 2:
            raise ValueError(f"{where}: expected 2 tab-separated columns (source, target), found {len(columns)}")
        yield columns[0].strip(), columns[1].strip(), where, where


def _jsonl_rows(path: PathLike, src_lang: str, tgt_lang: str) -> Iterator[_Row]:
    for lineno, line in enumerate(_read_lines(path), start=1):
        where = f"{path}, line {lineno}"
        if not line.strip():
            yield "", "", where, where
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            hint = " (one JSON object per line is expected, not a JSON array)" if line.lstrip()[:1] == "[" else ""
            raise ValueError(f"{where}: invalid JSON: {err.msg}{hint}") from err
        pair = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(pair, dict):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"{where}: expected {{\"translation\": {{...}}}}, found keys {keys}")
        for lang in (src_lang, tgt_lang):
            if not isinstance(pair.get(lang), str):
                problem = "missing" if lang not in pair else f"not a string ({type(pair[lang]).__name__})"
                raise ValueError(f"{where}: language key {lang!r} is {problem}; keys present: {sorted(pair)}")
        yield pair[src_lang], pair[tgt_lang], where, where


def load_translation_file(path: PathLike, src_lang: str, tgt_lang: str) -> Dataset:
    suffix = Path(path).suffix.lower()
    if suffix == ".tsv":
        rows = _tsv_rows(path)
    elif suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path, src_lang, tgt_lang)
    else:
        raise ValueError(
            f"{path}: unsupported extension {suffix!r}; expected .tsv, .jsonl or .json "
            "(for plain text, pass a source and a target file; for other formats use load_dataset_by_name)"
        )
    return _to_dataset(rows, src_lang, tgt_lang, origin=str(path))


def _check_translation_column(dataset: Dataset | IterableDataset, where: str, src_lang: str, tgt_lang: str) -> None:
    features = dataset.features
    if features is not None:
        columns = list(features)
        feature = features.get("translation")
        languages = feature.languages if isinstance(feature, Translation) else feature
    else:  # streaming datasets may only know their schema once an example has been read
        first = next(iter(dataset), None) or {}
        columns = list(first)
        feature = languages = first.get("translation")
    if "translation" not in columns:
        raise ValueError(
            f"{where} has no 'translation' column (columns: {columns}); expected the Hugging Face translation "
            f"format {{'translation': {{'{src_lang}': ..., '{tgt_lang}': ...}}}}"
        )
    if not isinstance(languages, (dict, list)):
        raise ValueError(f"{where}: the 'translation' column is not a mapping from language to sentence ({feature})")
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in languages]
    if missing:
        raise ValueError(f"{where}: 'translation' has no {missing} key; languages present: {sorted(languages)}")


def load_dataset_by_name(
    name_or_path: PathLike, src_lang: str, tgt_lang: str, config_name: str | None = None, **kwargs
) -> Dataset | DatasetDict | IterableDataset | IterableDatasetDict:
    folder = Path(name_or_path)
    saved_to_disk = folder.is_dir() and any(
        (folder / marker).is_file() for marker in (config.DATASETDICT_JSON_FILENAME, config.DATASET_STATE_JSON_FILENAME)
    )
    if saved_to_disk:
        if config_name is not None:
            raise ValueError(f"config_name={config_name!r} (--dataset_config_name) does not apply: {name_or_path} is a "
                             "save_to_disk folder, which has no configs")
        dataset = load_from_disk(str(folder), **kwargs)
    else:
        dataset = load_dataset(str(name_or_path), config_name, **kwargs)

    if isinstance(dataset, (DatasetDict, IterableDatasetDict)):
        for split, part in dataset.items():
            _check_translation_column(part, f"{name_or_path} (split {split!r})", src_lang, tgt_lang)
    else:
        _check_translation_column(dataset, str(name_or_path), src_lang, tgt_lang)
    # Extra columns (ids, metadata) would only get in the way of tokenization and collation.
    return dataset.select_columns(["translation"])


def load_parallel_data(
    source: PathLike,
    src_lang: str,
    tgt_lang: str,
    target: PathLike | None = None,
    config_name: str | None = None,
    **kwargs,
) -> Dataset | DatasetDict | IterableDataset | IterableDatasetDict:
    if Path(source).is_file() or target is not None:
        if config_name is not None or kwargs:
            raise ValueError(f"config_name={config_name!r} (--dataset_config_name) and extra arguments {sorted(kwargs)} "
                             f"apply only to datasets, not to the file {source}")
        if target is not None:
            return load_parallel_text_files(source, target, src_lang, tgt_lang)
        return load_translation_file(source, src_lang, tgt_lang)
    return load_dataset_by_name(source, src_lang, tgt_lang, config_name, **kwargs)


@dataclass(frozen=True)
class LengthFilterReport:
    kept: int
    dropped: int
    max_source_length: int
    max_target_length: int
    # Longest source/target among the dropped examples, whichever side got them dropped; 0 if none were.
    longest_dropped_source: int
    longest_dropped_target: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        total = self.kept + self.dropped
        share = 100.0 * self.dropped / total if total else 0.0
        return (
            f"length filter: kept {self.kept} of {total} examples, dropped {self.dropped} ({share:.2f}%) "
            f"longer than {self.max_source_length} source / {self.max_target_length} target tokens "
            f"(longest dropped: {self.longest_dropped_source} source, {self.longest_dropped_target} target tokens)"
        )


def tokenize_parallel(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    src_lang: str,
    tgt_lang: str,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
) -> tuple[Dataset, LengthFilterReport]:
    if not isinstance(dataset, Dataset):
        raise TypeError(f"`dataset` must be one split (datasets.Dataset), got {type(dataset).__name__}"
                        + (f" with splits {list(dataset)}: pass one, e.g. dataset['train']" if isinstance(dataset, dict) else ""))

    def encode(pairs):
        # No truncation: a truncated target teaches the model to stop mid-sentence, so long pairs are dropped below.
        return tokenizer(
            [pair[src_lang] for pair in pairs], text_target=[pair[tgt_lang] for pair in pairs], truncation=False
        )

    tokenized = dataset.map(
        encode,
        batched=True,
        input_columns="translation",
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        desc=f"Tokenizing {src_lang}->{tgt_lang}",
    )

    # Lengths count the appended </s>. Computed in Arrow rather than inside a filter function, whose side
    # effects would be lost in worker processes and skipped entirely when the filter result is cached.
    columns = tokenized.with_format("arrow")[:]
    src_len = pc.list_value_length(columns["input_ids"]).to_numpy(zero_copy_only=False)
    tgt_len = pc.list_value_length(columns["labels"]).to_numpy(zero_copy_only=False)
    too_long = (src_len > max_source_length) | (tgt_len > max_target_length)
    filtered = tokenized.select(np.flatnonzero(~too_long)) if too_long.any() else tokenized

    report = LengthFilterReport(
        kept=int((~too_long).sum()),
        dropped=int(too_long.sum()),
        max_source_length=max_source_length,
        max_target_length=max_target_length,
        longest_dropped_source=int(src_len[too_long].max(initial=0)),
        longest_dropped_target=int(tgt_len[too_long].max(initial=0)),
    )
    logger.log(logging.WARNING if report.dropped else logging.INFO, "%s", report)
    return filtered, report
