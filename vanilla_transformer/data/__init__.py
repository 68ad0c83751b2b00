"""Corpora in: parallel files and datasets, the shared BPE vocabulary (§5.1), token-budget batching and the
collator (§5.1), and the built-in English-German task (`data.builtin_task`, imported only where it is used)."""

from .batching import TokenBucketBatchSampler, TranslationDataCollator, plan_token_batches
from .corpora import load_parallel_data, load_parallel_text_files, load_translation_file, tokenize_parallel
from .tokenization import train_shared_tokenizer

__all__ = ["TokenBucketBatchSampler", "TranslationDataCollator", "plan_token_batches", "load_parallel_data",
           "load_parallel_text_files", "load_translation_file", "tokenize_parallel", "train_shared_tokenizer"]
