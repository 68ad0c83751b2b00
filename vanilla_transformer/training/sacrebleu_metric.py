"""sacreBLEU as an `evaluate` metric that loads offline: `evaluate.load("/abs/path/sacrebleu_metric.py")`.

`evaluate.load("sacrebleu")` fetches its script from the Hub. This file is copied into evaluate's
module cache and imported on its own, so it imports only installed libraries, never this package,
and one module per `import` line (evaluate's import scanner misreads `import a, b`).
"""

import datasets
import evaluate
import sacrebleu

_DESCRIPTION = "Corpus BLEU from sacreBLEU (Post, 2018), with its signature; same outputs as evaluate's 'sacrebleu'."

_CITATION = """@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings.
    references: one reference string, or a list of reference strings (the same number for every
        prediction), per prediction.
    smooth_method, smooth_value, lowercase, tokenize, use_effective_order: passed to sacrebleu.BLEU.
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len, signature.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class LocalSacreBleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://github.com/mjpost/sacreBLEU"],
        )

    def _compute(
        self,
        predictions,
        references,
        smooth_method="exp",
        smooth_value=None,
        lowercase=False,
        tokenize=None,
        use_effective_order=False,
    ):
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        if not references:
            raise ValueError("`references` is empty: sacreBLEU needs references for every prediction")
        n_refs = len(references[0])
        odd = next((i for i, r in enumerate(references) if len(r) != n_refs), None)
        if odd is not None:
            raise ValueError(f"references[{odd}] has {len(references[odd])} references but references[0] has "
                             f"{n_refs}: sacreBLEU needs the same number for every prediction")
        # sacreBLEU takes one stream per reference position, not one list per prediction.
        streams = [[r[i] for r in references] for i in range(n_refs)]
        bleu = sacrebleu.metrics.BLEU(
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            lowercase=lowercase,
            tokenize=tokenize,
            effective_order=use_effective_order,
        )
        result = bleu.corpus_score(predictions, streams)
        return {
            "score": result.score,
            "counts": result.counts,
            "totals": result.totals,
            "precisions": result.precisions,
            "bp": result.bp,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "signature": str(bleu.get_signature()),
        }
