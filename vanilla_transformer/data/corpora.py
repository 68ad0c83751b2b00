"""Parallel corpora in the Hugging Face translation format: {"translation": {src_lang: ..., tgt_lang: ...}}.

Text stays in memory-mapped Arrow from the files to the token ids, as fairseq-preprocess keeps it in binarized
files: files are read chunk by chunk by a 🤗 datasets builder (`ParallelFiles`, the `text` builder's sibling for
line-aligned pairs), which writes them into datasets' cache under a configuration id hashed from the files' paths,
sizes and modification times, so a second run reads them back and an edited file is read anew; the shared
vocabulary trains from an iterator over that column (`sentence_batches`), and `tokenize_parallel` maps over it with
`num_proc` processes into datasets' cache, keyed by the data and the tokenizer, so the next run with the same data
and vocabulary starts from the ids.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import (
    ArrowBasedBuilder,
    BuilderConfig,
    Dataset,
    DatasetDict,
    DatasetInfo,
    DownloadMode,
    Features,
    IterableDataset,
    IterableDatasetDict,
    Split,
    SplitGenerator,
    Translation,
    Version,
    config,
    load_dataset,
    load_from_disk,
)
from datasets.exceptions import DatasetGenerationError
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from .batching import example_lengths

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
CHUNK = 100_000  # lines read, checked and written at a time: memory stays flat in the corpus size
# A chunk of pairs: sources, targets, and where row i's side s (0 source, 1 target) came from, for errors.
_Chunk = tuple[list[str], list[str], Callable[[int, int], str]]


def available_cores() -> int:
    """The cores this process may run on (a container's or `taskset`'s limit, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _decode(raw: list[bytes], path: PathLike, first_lineno: int, strip: bool = True) -> list[str]:
    # Lines split on b"\n" only (unlike str.splitlines(), which also splits on U+2028/U+0085 inside sentences), so
    # both sides stay aligned; decoded per line so that an error names its line.
    try:
        lines = [line.decode("utf-8").strip() if strip else line.decode("utf-8").rstrip("\r\n") for line in raw]
    except UnicodeDecodeError:
        for offset, line in enumerate(raw):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}, line {first_lineno + offset}: not valid UTF-8 ({err.reason} at byte "
                                 f"{err.start} of the line)") from err
        raise
    if first_lineno == 1 and lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:].strip() if strip else lines[0][1:]  # a byte-order mark is not text
    return lines


def _lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """(line number, text without its line break) of every line of a UTF-8 file, read a chunk at a time."""
    with open(path, "rb") as handle:
        start = 1
        while raw := list(itertools.islice(handle, CHUNK)):
            yield from enumerate(_decode(raw, path, start, strip=False), start=start)
            start += len(raw)


def _text_chunks(src_path: PathLike, tgt_path: PathLike) -> Iterator[_Chunk]:
    with open(src_path, "rb") as src_handle, open(tgt_path, "rb") as tgt_handle:
        start, seen = 1, [False, False]
        while True:
            src_raw, tgt_raw = list(itertools.islice(src_handle, CHUNK)), list(itertools.islice(tgt_handle, CHUNK))
            if len(src_raw) != len(tgt_raw):
                counts = [start - 1 + len(raw) + sum(1 for _ in handle)
                          for raw, handle in ((src_raw, src_handle), (tgt_raw, tgt_handle))]
                for side, (path, raw) in enumerate(((src_path, src_raw), (tgt_path, tgt_raw))):
                    if not seen[side] and not any(line.strip() for line in raw):
                        raise ValueError(f"{path} is empty")
                raise ValueError(f"{src_path} has {counts[0]} lines but {tgt_path} has {counts[1]}; parallel text "
                                 "files must be line-aligned")
            if not src_raw:
                return
            src, tgt = _decode(src_raw, src_path, start), _decode(tgt_raw, tgt_path, start)
            seen = [seen[0] or any(src), seen[1] or any(tgt)]
            yield src, tgt, lambda i, side, start=start: f"{(src_path, tgt_path)[side]}, line {start + i}"
            start += len(src_raw)


def _row_chunks(rows: Iterator[tuple[str, str, str]]) -> Iterator[_Chunk]:
    """Rows of (source, target, where) in chunks."""
    while chunk := list(itertools.islice(rows, CHUNK)):
        src, tgt, where = (list(column) for column in zip(*chunk))
        yield src, tgt, lambda i, side, where=where: where[i]


def _identity(paths: list[PathLike]) -> tuple[tuple[str, int, int], ...]:
    """What tells a file's contents apart without reading it: its resolved path, size and modification time."""
    return tuple((str(Path(p).resolve()), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths)


@dataclass
class ParallelFilesConfig(BuilderConfig):
    """One corpus: `files` are two line-aligned text files, or one .tsv or .jsonl file (`file_format`), as absolute
    paths. datasets hashes the fields a builder is given into its cache directory's name, so `identity` keeps an
    edited file apart from what it was."""

    files: tuple[str, ...] = ()
    file_format: str = "text"
    identity: tuple[tuple[str, int, int], ...] = ()
    src_lang: str = "en"
    tgt_lang: str = "de"


class ParallelFiles(ArrowBasedBuilder):
    """Translation pairs from files into datasets' cache, checked on the way: blank pairs skipped, a pair empty on
    one side, a misaligned or undecodable line, a bad .tsv or .jsonl record refused with its file and line."""

    BUILDER_CONFIG_CLASS = ParallelFilesConfig
    VERSION = Version("3.0.0")  # bump when what a cached Arrow file holds changes, so old files are not read back

    def _info(self) -> DatasetInfo:
        return DatasetInfo(features=Features(
            {"translation": Translation(languages=[self.config.src_lang, self.config.tgt_lang])}))

    def _split_generators(self, dl_manager) -> list[SplitGenerator]:
        return [SplitGenerator(name=Split.TRAIN)]

    def _generate_tables(self) -> Iterator[tuple[int, pa.Table]]:
        files, src_lang, tgt_lang = self.config.files, self.config.src_lang, self.config.tgt_lang
        if self.config.file_format == "text":
            chunks = _text_chunks(*files)
        elif self.config.file_format == "tsv":
            chunks = _row_chunks(_tsv_rows(files[0]))
        else:
            chunks = _row_chunks(_jsonl_rows(files[0], src_lang, tgt_lang))
        languages = sorted((src_lang, tgt_lang))  # the order of datasets' Translation struct
        blank, kept = 0, 0
        for index, (src, tgt, where) in enumerate(chunks):
            keep = []
            for i, pair in enumerate(zip(src, tgt)):
                if pair[0] and pair[1]:
                    keep.append(i)
                elif pair[0] or pair[1]:
                    side = 0 if not pair[0] else 1
                    lang = (src_lang, tgt_lang)[side]
                    raise ValueError(f"{where(i, side)}: empty {lang!r} sentence while the other side is not empty")
                else:
                    blank += 1  # blank on both sides: a document separator in corpora like News Commentary
            kept += len(keep)
            columns = {src_lang: [src[i] for i in keep], tgt_lang: [tgt[i] for i in keep]}
            pairs = pa.StructArray.from_arrays([pa.array(columns[lang], pa.string()) for lang in languages],
                                               names=languages)
            yield index, pa.table({"translation": pairs})
        if not kept:  # every line blank on both sides (a line blank on one side only was refused above)
            raise ValueError(f"{files[0]} is empty" if len(files) == 1 else f"{files[0]} and {files[1]} are empty")
        if blank:
            logger.info("%s: skipped %d lines that are blank on both sides", " + ".join(files), blank)


def _load_files(files: list[PathLike], file_format: str, src_lang: str, tgt_lang: str, cache_dir: PathLike | None,
                download_mode: DownloadMode | str | None) -> Dataset:
    if src_lang == tgt_lang:
        raise ValueError(f"src_lang and tgt_lang (--source_lang, --target_lang) are both {src_lang!r}")
    builder = ParallelFiles(
        cache_dir=None if cache_dir is None else str(cache_dir), dataset_name="parallel_files",
        writer_batch_size=CHUNK,  # one record batch a chunk: each batch's metadata is a page the reader touches
        files=tuple(os.path.abspath(f) for f in files), file_format=file_format, identity=_identity(files),
        src_lang=src_lang, tgt_lang=tgt_lang)
    try:
        builder.download_and_prepare(download_mode=download_mode)
    except DatasetGenerationError as err:  # datasets wraps what the files were refused for; the reason is ours
        refused = err.__cause__
        if type(refused) is not ValueError:
            raise
    else:
        return builder.as_dataset(split=Split.TRAIN)
    raise refused from refused.__cause__  # outside the handler: the wrapper is not shown as its context


def load_parallel_text_files(src_path: PathLike, tgt_path: PathLike, src_lang: str, tgt_lang: str,
                             cache_dir: PathLike | None = None,
                             download_mode: DownloadMode | str | None = None) -> Dataset:
    """Two line-aligned text files as a memory-mapped Dataset, read once into datasets' cache (or `cache_dir`);
    `download_mode="force_redownload"` reads them again, as `load_dataset` takes it."""
    return _load_files([src_path, tgt_path], "text", src_lang, tgt_lang, cache_dir, download_mode)


def _tsv_rows(path: PathLike) -> Iterator[tuple[str, str, str]]:
    for lineno, line in _lines(path):
        where = f"{path}, line {lineno}"
        if not line.strip():
            yield "", "", where
            continue
        columns = line.split("\t")
        if len(columns) != 2:
            raise ValueError(f"{where}: expected 2 tab-separated columns (source, target), found {len(columns)}")
        yield columns[0].strip(), columns[1].strip(), where


def _jsonl_rows(path: PathLike, src_lang: str, tgt_lang: str) -> Iterator[tuple[str, str, str]]:
    for lineno, line in _lines(path):
        where = f"{path}, line {lineno}"
        if not line.strip():
            yield "", "", where
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
        yield pair[src_lang].strip(), pair[tgt_lang].strip(), where


def load_translation_file(path: PathLike, src_lang: str, tgt_lang: str, cache_dir: PathLike | None = None,
                          download_mode: DownloadMode | str | None = None) -> Dataset:
    """A .tsv (source, tab, target) or .jsonl file as a memory-mapped Dataset, cached like text files."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".tsv", ".jsonl", ".json"):
        raise ValueError(
            f"{path}: unsupported extension {suffix!r}; expected .tsv, .jsonl or .json "
            "(for plain text, pass a source and a target file; for other formats use load_dataset_by_name)"
        )
    return _load_files([path], "tsv" if suffix == ".tsv" else "jsonl", src_lang, tgt_lang, cache_dir, download_mode)


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
    """A dataset as `run_translation.py` loads it: a Hub name with its config (`wmt/wmt14`, `de-en`), a local folder
    laid out as the Hub serves a dataset repository (parquet files under `de-en/`, the configs named in README.md's
    YAML), a `save_to_disk` folder, or a packaged builder (`json` with `data_files=`); `kwargs` go to
    `load_dataset`. Only the 'translation' column is kept."""
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
        if folder.is_dir() and "cache_dir" not in kwargs:
            # datasets keys a local folder's cache by the folder's name and config, not by its files: two folders
            # named alike, or one whose files changed, would read each other's cached splits.
            files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(
                part.startswith(".") for part in p.relative_to(folder).parts))  # not a clone's .git
            key = hashlib.sha256(json.dumps(_identity(files)).encode()).hexdigest()[:32]
            kwargs["cache_dir"] = str(Path(config.HF_DATASETS_CACHE) / "vanilla_transformer" / "folders" / key)
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
    """Two text files (`source`, `target`), one .tsv/.jsonl file, or a dataset by name or folder (with
    `config_name`); `kwargs` go to the loader (`cache_dir` and `download_mode` for files, as `load_dataset` takes
    them)."""
    if "overwrite_cache" in kwargs:
        raise TypeError(f"overwrite_cache={kwargs['overwrite_cache']!r} does not apply to reading: files are read again "
                        "when they change (download_mode='force_redownload' reads them anyway); tokenize_parallel "
                        "takes overwrite_cache, as run_translation.py's --overwrite_cache redoes the tokenizing.")
    if Path(source).is_file() or target is not None:
        if config_name is not None or set(kwargs) - {"cache_dir", "download_mode"}:
            raise ValueError(f"config_name={config_name!r} (--dataset_config_name) and extra arguments {sorted(kwargs)} "
                             f"apply only to datasets, not to the file {source}")
        if target is not None:
            return load_parallel_text_files(source, target, src_lang, tgt_lang, **kwargs)
        return load_translation_file(source, src_lang, tgt_lang, **kwargs)
    return load_dataset_by_name(source, src_lang, tgt_lang, config_name, **kwargs)


def sentence_batches(dataset: Dataset, languages: tuple[str, ...], batch_size: int = 10_000) -> Iterator[list[str]]:
    """The sentences of `languages` of a translation split, a batch of each language at a time, read from the Arrow
    column (what the shared vocabulary trains on, without a list of the whole corpus)."""
    for table in dataset.select_columns("translation").with_format("arrow").iter(batch_size):
        pairs = table.column("translation").combine_chunks()
        for lang in languages:
            yield pairs.field(lang).to_pylist()


@dataclass(frozen=True)
class LengthFilterReport:
    kept: int
    dropped: int
    max_source_length: int
    max_target_length: int
    # Longest source/target among the dropped examples, whichever side got them dropped; 0 if none were.
    longest_dropped_source: int
    longest_dropped_target: int
    # Whether the ids were read back from datasets' cache (written by an earlier run, or by the main process).
    tokenized_from_cache: bool = False

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


class PairEncoder:
    """The tokenization map: a batch of translation pairs to `input_ids` and `labels` as Arrow list columns.

    A fast tokenizer whose target side is its source side (ours, and most) runs on a copy of its Rust backend, which
    gives the ids of `tokenizer(src, text_target=tgt)` without building Python dicts for every pair, and is hashed
    for datasets' cache by the backend's JSON alone, so a vocabulary trained in this run and the same one loaded
    from disk by the next run find the same cache. Any other tokenizer goes through that call."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, src_lang: str, tgt_lang: str):
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        # Tokenizers with a target side of their own (Marian, mBART-50, NLLB) define this hook.
        if tokenizer.is_fast and not hasattr(tokenizer, "_switch_to_target_mode"):
            backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            backend.no_truncation()  # a truncated target teaches the model to stop mid-sentence: filtered later
            backend.no_padding()
            self.backend_json, self.tokenizer = backend.to_str(), None
        else:
            self.backend_json, self.tokenizer = None, tokenizer
        self._backend = None

    def __getstate__(self):  # what datasets hashes and sends to its processes: not the built backend
        return {**self.__dict__, "_backend": None}

    def __call__(self, batch: pa.Table) -> pa.Table:
        pairs = batch.column("translation").combine_chunks()
        src, tgt = pairs.field(self.src_lang).to_pylist(), pairs.field(self.tgt_lang).to_pylist()
        if self.backend_json is not None:
            self._backend = self._backend or Tokenizer.from_str(self.backend_json)
            source = [encoding.ids for encoding in self._backend.encode_batch_fast(src)]
            target = [encoding.ids for encoding in self._backend.encode_batch_fast(tgt)]
        else:
            encoded = self.tokenizer(src, text_target=tgt, truncation=False)
            source, target = encoded["input_ids"], encoded["labels"]
        return pa.table({"input_ids": _list_array(source), "labels": _list_array(target)})


def _list_array(ids: list[list[int]]) -> pa.ListArray:
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum([len(row) for row in ids], out=offsets[1:])
    values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def tokenize_parallel(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    src_lang: str,
    tgt_lang: str,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
    overwrite_cache: bool = False,
) -> tuple[Dataset, LengthFilterReport]:
    """Token ids of a split (`input_ids`, `labels`, both ending in </s>) with `num_proc` processes, cached by datasets
    for the next run (`overwrite_cache` tokenizes again); pairs longer than the limits are dropped and reported."""
    if not isinstance(dataset, Dataset):
        raise TypeError(f"`dataset` must be one split (datasets.Dataset), got {type(dataset).__name__}"
                        + (f" with splits {list(dataset)}: pass one, e.g. dataset['train']" if isinstance(dataset, dict) else ""))
    started = time.time()
    tokenized = dataset.select_columns("translation").with_format("arrow").map(
        PairEncoder(tokenizer, src_lang, tgt_lang),
        batched=True,
        batch_size=10_000,
        writer_batch_size=CHUNK,
        remove_columns="translation",
        num_proc=num_proc if num_proc and num_proc > 1 else None,
        load_from_cache_file=not overwrite_cache,
        desc=f"Tokenizing {src_lang}->{tgt_lang}",
    ).with_format(None)
    files = tokenized.cache_files
    from_cache = bool(files) and all(os.stat(f["filename"]).st_mtime < started for f in files)

    src_len, tgt_len = example_lengths(tokenized)
    too_long = (src_len > max_source_length) | (tgt_len > max_target_length)
    # Written out (and cached) rather than kept as an index mapping: the batch plan reads lengths straight from the
    # Arrow offsets, which a mapping would make datasets gather, copying every id.
    filtered = tokenized.select(np.flatnonzero(~too_long)).flatten_indices() if too_long.any() else tokenized

    report = LengthFilterReport(
        kept=int((~too_long).sum()),
        dropped=int(too_long.sum()),
        max_source_length=max_source_length,
        max_target_length=max_target_length,
        longest_dropped_source=int(src_len[too_long].max(initial=0)),
        longest_dropped_target=int(tgt_len[too_long].max(initial=0)),
        tokenized_from_cache=from_cache,
    )
    logger.log(logging.WARNING if report.dropped else logging.INFO, "%s", report)
    return filtered, report
