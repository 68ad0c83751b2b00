"""`metrics.corpus_scores` (sacreBLEU's BLEU, chrF and lowercased BLEU, with their signatures) as an `evaluate`
metric that loads offline: `metrics.load_sacrebleu_metric()`, where `evaluate.load("sacrebleu")` fetches its script
from the Hub. Trainer's `compute_metrics` (`metrics.build_compute_metrics`) scores through it.

evaluate copies this file into its module cache and imports it on its own: it imports the package by its name,
never relatively, and one module per `import` line (evaluate's import scanner misreads `import a, b`).
"""

import datasets
import evaluate

from vanilla_transformer.training.metrics import corpus_scores

_CITATION = """@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}"""

_INPUTS = """
Args:
    predictions: list of hypothesis strings.
    references: one reference string, or a list of reference strings (the same number for every
        prediction), per prediction.
Returns:
    bleu, chrf, bleu_lowercase and the signature of each (bleu_signature, ...), as `metrics.corpus_scores`.
"""


class CorpusScores(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=corpus_scores.__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://github.com/mjpost/sacreBLEU"],
        )

    def _compute(self, predictions, references):
        return corpus_scores(predictions, references)
