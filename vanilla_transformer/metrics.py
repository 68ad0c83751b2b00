"""Corpus BLEU and chrF with sacreBLEU (§6.1 reports BLEU), for scripts and `Seq2SeqTrainer`."""

import os

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
    if len({len(r) for r in per_hyp}) != 1:
        raise ValueError("every hypothesis needs the same number of references")
    return [list(stream) for stream in zip(*per_hyp)]


def corpus_scores(hypotheses, references):
    """sacreBLEU defaults (13a tokens, mixed case, exp smoothing): the numbers WMT papers quote."""
    streams = _reference_streams(references, len(hypotheses))
    bleu, chrf = BLEU(), CHRF()
    return {
        "bleu": bleu.corpus_score(hypotheses, streams).score,
        "chrf": chrf.corpus_score(hypotheses, streams).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
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
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: only floats, so Trainer can log them.

    The signatures of these scores are `bleu_signature()` and `chrf_signature()`.
    """
    pad = tokenizer.pad_token_id

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
        scores = corpus_scores(hypotheses, references)
        return {
            "bleu": float(scores["bleu"]),
            "chrf": float(scores["chrf"]),
            # Non-pad ids per generated row (includes EOS), as the HF translation examples report it.
            "gen_len": float(np.mean(np.count_nonzero(predictions != pad, axis=-1))),
        }

    return compute_metrics


def load_bleu_metric(**kwargs):
    """`evaluate.load` of the local sacreBLEU module: works offline, unlike `evaluate.load("sacrebleu")` (Hub script)."""
    import evaluate  # imports datasets and pyarrow: too slow to pay for on every `import metrics`

    return evaluate.load(SACREBLEU_METRIC_PATH, **kwargs)
