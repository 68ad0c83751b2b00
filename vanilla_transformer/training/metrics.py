"""Corpus BLEU and chrF with sacreBLEU (§6.1 reports BLEU), for scripts and, as an `evaluate` metric
(`sacrebleu_metric.py`), for `Seq2SeqTrainer`; and the paper's own tokenized BLEU (`paper_bleu`), the protocol behind
its 27.3 / 28.4 on newstest2014, and the Multi30k literature's (`multi30k_bleu`), on the dataset's official tokens."""

import os
import re

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

SACREBLEU_METRIC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sacrebleu_metric.py")


def _reference_streams(references, n_hypotheses):
    # sacreBLEU wants one stream per reference *position*; callers think one entry per hypothesis
    # (a string, or a list of alternatives, as evaluate's sacrebleu takes).
    if len(references) != n_hypotheses:
        raise ValueError(f"got {n_hypotheses} hypotheses but {len(references)} references")
    if n_hypotheses == 0:
        raise ValueError("cannot score an empty corpus")
    per_hyp = [[r] if isinstance(r, str) else list(r) for r in references]
    odd = next((i for i, r in enumerate(per_hyp) if len(r) != len(per_hyp[0])), None)
    if odd is not None:
        raise ValueError(f"references[{odd}] has {len(per_hyp[odd])} alternatives but references[0] has "
                         f"{len(per_hyp[0])}: every hypothesis needs the same number")
    return [list(stream) for stream in zip(*per_hyp)]


def corpus_scores(hypotheses, references):
    """sacreBLEU defaults (13a tokens, mixed case, exp smoothing): the numbers WMT papers quote; and the same BLEU
    lowercased (`bleu_lowercase`), as much of the Multi30k literature scores, so a figure stands beside theirs."""
    streams = _reference_streams(references, len(hypotheses))
    bleu, lowercase, chrf = BLEU(), BLEU(lowercase=True), CHRF()
    return {
        "bleu": bleu.corpus_score(hypotheses, streams).score,
        "chrf": chrf.corpus_score(hypotheses, streams).score,
        "bleu_lowercase": lowercase.corpus_score(hypotheses, streams).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_lowercase_signature": str(lowercase.get_signature()),
    }


def bleu_signature(num_refs=1):
    # sacreBLEU only knows `nrefs` after scoring, so score a dummy corpus with that many references.
    bleu = BLEU()
    bleu.corpus_score(["x"], [["x"]] * num_refs)
    return str(bleu.get_signature())


def chrf_signature(num_refs=1):
    chrf = CHRF()
    chrf.corpus_score(["x"], [["x"]] * num_refs)
    return str(chrf.get_signature())


def build_compute_metrics(tokenizer):
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`, scoring through the `evaluate` metric of
    `corpus_scores` (`load_sacrebleu_metric`): only floats, so Trainer can log them.

    The signatures of these scores are `bleu_signature()` and `chrf_signature()`.
    """
    pad = tokenizer.pad_token_id
    metric = load_sacrebleu_metric(keep_in_memory=True)  # no cache files for the processes of a run to share

    def compute_metrics(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        # Labels carry -100 (DataCollatorForSeq2Seq), and Trainer pads predictions with -100 when it
        # concatenates batches of different lengths; ids < 0 crash the fast tokenizer's decode.
        predictions = np.where(np.asarray(predictions) < 0, pad, predictions)
        labels = np.where(np.asarray(labels) < 0, pad, labels)
        hypotheses = [t.strip() for t in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = metric.compute(predictions=hypotheses, references=references)
        return {
            "bleu": float(scores["bleu"]),
            "chrf": float(scores["chrf"]),
            # Non-pad ids per generated row (includes EOS), as the HF translation examples report it.
            "gen_len": float(np.mean(np.count_nonzero(predictions != pad, axis=-1))),
        }

    return compute_metrics


# tensor2tensor's get_ende_bleu.sh, which produced the paper's scores, splits hyphenated compounds after Moses
# tokenization ("rich-text" -> "rich ##AT##-##AT## text", as GNMT and ConvS2S scored), so each part counts as a word.
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")
PAPER_BLEU_PROTOCOL = ("tensor2tensor get_ende_bleu.sh: Moses replace-unicode-punctuation.perl, tokenizer.perl -l {lang}, "
                       "##AT## compound splitting, multi-bleu.perl (via sacremoses {sacremoses} and sacreBLEU "
                       "{sacrebleu} with tokenize=none, smooth=none); reference tokenized the same way")


def paper_tokenize(lines: list[str], lang: str = "de") -> list[str]:
    """Moses-tokenize `lines` as the paper's evaluation did (unicode punctuation replaced, special characters
    escaped as tokenizer.perl does by default), then split hyphenated compounds."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError as error:
        raise ImportError("The paper's tokenized BLEU needs sacremoses: pip install 'vanilla-transformer[train]' "
                          "(or pip install sacremoses).") from error
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [_COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2",
                                 tokenizer.tokenize(normalizer.replace_unicode_punct(line), return_str=True, escape=True))
            for line in lines]


def paper_bleu(hypotheses: list[str], references: list[str], lang: str = "de") -> dict:
    """The paper's BLEU: case-sensitive corpus BLEU of Moses-tokenized, compound-split text, as multi-bleu.perl
    computes it (no smoothing). Not comparable to sacreBLEU's detokenized score, which WMT reports: both are
    written side by side by the recipe (`scripts/recipes/wmt14_en_de.py`)."""
    return _tokenized_bleu(hypotheses, references, lambda lines: paper_tokenize(lines, lang),
                           PAPER_BLEU_PROTOCOL.format(lang=lang, **_versions()))


_INNER_QUOTE = re.compile(r"([a-zA-Z])[‘’]([a-zA-Z])")
_SINGLE_QUOTES = re.compile(r"[‘‚’]")
MULTI30K_BLEU_PROTOCOL = ("Multi30k's scripts/task1-tokenize.sh: lowercase.perl, normalize-punctuation.perl -l {lang}, "
                          "tokenizer.perl -l {lang} (escaped), corpus BLEU on those tokens as fairseq and multi-bleu.perl "
                          "compute it (via sacremoses {sacremoses} and sacreBLEU {sacrebleu} with tokenize=none, "
                          "smooth=none); reference tokenized the same way")


def multi30k_tokenize(lines: list[str], lang: str = "de") -> list[str]:
    """Lowercase, normalise punctuation and Moses-tokenize `lines` as Multi30k's task1-tokenize.sh makes the dataset's
    official `*.lc.norm.tok.*` files, on which the literature scores (Wu et al., 2021: 41.02 on test2016)."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)

    def normalized(line: str) -> str:
        # The dataset's Moses (3a0631a) turned single quotes between letters into an apostrophe and every other one
        # into a double quote, where sacremoses' newer rules make an apostrophe of all.
        line = _SINGLE_QUOTES.sub('"', _INNER_QUOTE.sub(r"\1'\2", line.lower()))
        # The line break matters: normalize-punctuation.perl reads it, and a rule that moves a period out of German
        # quotes ("...tea.“ -> ...tea".) matches at the end of a line only through it.
        return normalizer.normalize(line + "\n")

    return [tokenizer.tokenize(normalized(line), return_str=True, escape=True) for line in lines]


def multi30k_bleu(hypotheses: list[str], references: list[str], lang: str = "de") -> dict:
    """The Multi30k literature's BLEU: the hypotheses and the raw references tokenized by `multi30k_tokenize`, then
    BLEU on those tokens (lowercased by construction; not detokenized), labelled with its protocol."""
    return _tokenized_bleu(hypotheses, references, lambda lines: multi30k_tokenize(lines, lang),
                           MULTI30K_BLEU_PROTOCOL.format(lang=lang, **_versions()))


def _versions() -> dict:
    import sacrebleu
    import sacremoses

    return {"sacrebleu": sacrebleu.__version__, "sacremoses": sacremoses.__version__}


def _tokenized_bleu(hypotheses, references, tokenize, protocol: str) -> dict:
    """multi-bleu.perl's corpus BLEU (no smoothing) of `tokenize`d hypotheses against one `tokenize`d reference each."""
    streams = _reference_streams(references, len(hypotheses))
    if len(streams) != 1:
        raise ValueError(f"Tokenized BLEU uses one reference per sentence, got {len(streams)}.")
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(tokenize(hypotheses), [tokenize(streams[0])])
    return {"bleu": score.score, "precisions": [round(p, 2) for p in score.precisions],
            "brevity_penalty": score.bp, "hypothesis_length": score.sys_len, "reference_length": score.ref_len,
            "protocol": protocol}


def load_sacrebleu_metric(**kwargs):
    """`corpus_scores` as an `evaluate` metric (`evaluate.load` of sacrebleu_metric.py, with `kwargs`): it loads
    offline, unlike `evaluate.load("sacrebleu")` (a Hub script)."""
    import evaluate  # imports datasets and pyarrow: too slow to pay for on every `import metrics`

    return evaluate.load(SACREBLEU_METRIC_PATH, **kwargs)
