import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import EvalPrediction, PreTrainedTokenizerFast

from sacrebleu.metrics import BLEU, CHRF
from vanilla_transformer.training.metrics import (
    build_compute_metrics,
    corpus_scores,
    load_sacrebleu_metric,
    multi30k_bleu,
    multi30k_tokenize,
    paper_bleu,
    paper_tokenize,
)

HYPS = ["the cat sat on the mat", "hello world"]
REFS = ["the cat sat on the red mat", "hello world"]


def word_tokenizer():
    words = ["[PAD]", "[UNK]", "</s>", "the", "cat", "sat", "on", "mat", "hello", "world"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="</s>")


def test_identical_corpus_scores_100():
    scores = corpus_scores(REFS, REFS)
    assert scores["bleu"] == pytest.approx(100.0, abs=1e-9)
    assert scores["chrf"] == pytest.approx(100.0, abs=1e-9)


def test_bleu_by_hand():
    # Corpus BLEU sums n-gram statistics over sentences before dividing (not a mean of sentence BLEUs).
    # hyp 1 "the cat sat on the mat" vs ref "the cat sat on the red mat":
    #   1-grams 6/6 (both "the" clipped to the ref's two), 2-grams 4/5 ("the mat" missing),
    #   3-grams 3/4 ("on the mat" missing), 4-grams 2/3 ("sat on the mat" missing).
    # hyp 2 "hello world" == ref: 1-grams 2/2, 2-grams 1/1, no 3- or 4-grams.
    # Corpus: p1 = 8/8, p2 = 5/6, p3 = 3/4, p4 = 2/3; geometric mean = (1 * 5/6 * 3/4 * 2/3)^(1/4) = (5/12)^(1/4).
    # Lengths c = 8, r = 9, so BP = exp(1 - r/c) = exp(-1/8). No zero counts, so smoothing is not involved.
    expected = 100 * (5 / 12) ** 0.25 * math.exp(-1 / 8)  # 70.9023...
    assert corpus_scores(HYPS, REFS)["bleu"] == pytest.approx(expected, abs=1e-6)


def test_chrf_is_a_percentage():
    assert corpus_scores(["abc"], ["xyz"])["chrf"] == 0.0
    assert 0.0 < corpus_scores(HYPS, REFS)["chrf"] < 100.0


def test_the_signatures_name_the_settings_that_produced_the_scores():
    hypotheses, references = ["The cat sat on the Mat."], ["the Cat sat on the mat ."]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    fields = dict(item.split(":", 1) for item in scores["bleu_signature"].split("|"))
    bleu = BLEU(tokenize=fields["tok"], lowercase=fields["case"] == "lc", smooth_method=fields["smooth"],
                effective_order=fields["eff"] == "yes")
    assert bleu.corpus_score(hypotheses, [references]).score == scores["bleu"]
    # Each named setting matters on this pair, so a signature that misnamed one would not reproduce the score.
    assert BLEU(lowercase=True).corpus_score(hypotheses, [references]).score != scores["bleu"]
    assert BLEU(tokenize="none").corpus_score(hypotheses, [references]).score != scores["bleu"]
    chrf = dict(item.split(":", 1) for item in scores["chrf_signature"].split("|"))
    assert CHRF(char_order=int(chrf["nc"]), word_order=int(chrf["nw"]), lowercase=chrf["case"] == "lc",
                whitespace=chrf["space"] == "yes").corpus_score(hypotheses, [references]).score == scores["chrf"]


def test_lowercased_bleu_ignores_only_case_and_its_signature_says_so():
    hypotheses, references = ["A dog runs through the Snow ."], ["a dog runs through the snow ."]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu_lowercase"] == pytest.approx(100.0) and scores["bleu"] < 60
    assert "|case:lc|" in scores["bleu_lowercase_signature"]
    assert scores["bleu_lowercase_signature"].replace("case:lc", "case:mixed") == scores["bleu_signature"]
    assert corpus_scores(["a cat ."], references)["bleu_lowercase"] < 100


def test_multiple_references_per_hypothesis():
    scores = corpus_scores(HYPS, [[r, "something else"] for r in REFS])
    assert scores["bleu_signature"].startswith("nrefs:2|")
    assert scores["bleu"] >= corpus_scores(HYPS, REFS)["bleu"]


def test_corpus_scores_validates_input():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(HYPS, REFS[:1])
    with pytest.raises(ValueError, match="empty"):
        corpus_scores([], [])


def test_compute_metrics_decodes_around_minus_100():
    tok = word_tokenizer()
    # Generated rows: decoder start (= pad 0), tokens, EOS (2), pad; Trainer pads short batches with -100.
    predictions = np.array(
        [
            [0, 3, 4, 5, 6, 7, 2, 0],  # "the cat sat on mat"
            [0, 8, 9, 2, 0, 0, -100, -100],  # "hello world"
        ]
    )
    labels = np.array(
        [
            [3, 4, 5, 6, 3, 7, 2, -100],  # "the cat sat on the mat"
            [8, 9, 2, -100, -100, -100, -100, -100],  # "hello world"
        ]
    )
    result = build_compute_metrics(tok)(EvalPrediction(predictions=predictions, label_ids=labels))
    hyps, refs = ["the cat sat on mat", "hello world"], ["the cat sat on the mat", "hello world"]
    expected = corpus_scores(hyps, refs)
    assert expected["bleu"] != corpus_scores(refs, hyps)["bleu"]  # BP makes a swap visible
    # gen_len counts non-pad ids per row: (6 + 3) / 2.
    assert result == {"bleu": pytest.approx(expected["bleu"]), "chrf": pytest.approx(expected["chrf"]), "gen_len": 4.5}
    assert all(type(v) is float for v in result.values())  # Trainer logs these


def test_the_evaluate_metric_loads_offline_and_scores_as_corpus_scores(tmp_path):
    metric = load_sacrebleu_metric(cache_dir=str(tmp_path))
    assert metric.name == "corpus_scores"
    direct = corpus_scores(HYPS, REFS)
    assert metric.compute(predictions=HYPS, references=[[r] for r in REFS]) == direct
    # Batches accumulate like any evaluate metric; plain-string references and several per hypothesis are accepted.
    metric.add_batch(predictions=HYPS[:1], references=REFS[:1])
    metric.add_batch(predictions=HYPS[1:], references=REFS[1:])
    assert metric.compute() == direct
    two = [[r, "something else"] for r in REFS]
    assert metric.compute(predictions=HYPS, references=two) == corpus_scores(HYPS, two)
    with pytest.raises(ValueError, match="every hypothesis needs the same number"):
        metric.compute(predictions=HYPS, references=[[REFS[0]], [REFS[1], "b"]])


# The paper's tokenized BLEU: tensor2tensor's get_ende_bleu.sh -------------------------------------------------

def test_paper_tokenization_splits_compounds_and_punctuation_as_the_reference_scripts_do():
    assert paper_tokenize(["Das Ski-Rennen, am Sonntag!"]) == ["Das Ski ##AT##-##AT## Rennen , am Sonntag !"]
    assert paper_tokenize(["Ost-West-Achse"]) == ["Ost ##AT##-##AT## West ##AT##-##AT## Achse"]
    # Perl's s{(\S)-(\S)}{...}g resumes after each match, so a hyphen whose letter the last match took stays.
    assert paper_tokenize(["a-b-c"]) == ["a ##AT##-##AT## b-c"]
    # tokenizer.perl escapes special characters by default; unicode punctuation is replaced first.
    assert paper_tokenize(['"A" & B…']) == ["&quot; A &quot; &amp; B ..."]


def test_paper_bleu_by_hand_and_where_it_differs_from_sacrebleu():
    hypotheses, references = ["Das Ski-Rennen war toll."], ["Das Ski-Rennen ist toll."]
    scored = paper_bleu(hypotheses, references)
    # 7 tokens a side (Das Ski ##AT##-##AT## Rennen war|ist toll .): 1- to 4-gram matches 6/7, 4/6, 2/5, 1/4.
    assert scored["bleu"] == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25, abs=1e-9)
    assert scored["precisions"] == [85.71, 66.67, 40.0, 25.0] and scored["brevity_penalty"] == 1.0
    assert "get_ende_bleu.sh" in scored["protocol"] and "tokenize=none" in scored["protocol"]
    # sacreBLEU keeps "Ski-Rennen" one token, so the shared compound counts once, not as three tokens.
    assert corpus_scores(hypotheses, references)["bleu"] < scored["bleu"] - 10
    # No smoothing, as multi-bleu.perl: a corpus without a matching 4-gram scores 0 (sacreBLEU smooths it).
    hypotheses, references = ["ein Hund läuft über die Wiese"], ["ein Hund rennt über die grüne Wiese"]
    assert paper_bleu(hypotheses, references)["bleu"] == 0.0 < corpus_scores(hypotheses, references)["bleu"]
    with pytest.raises(ValueError, match="one reference per sentence"):
        paper_bleu(["a"], [["a", "b"]])


# Hand-written German, and what Multi30k's scripts/task1-tokenize.sh (lowercase.perl | normalize-punctuation.perl -l de
# | tokenizer.perl -l de, Moses 3a0631a as the dataset ships it) prints for it, run once with perl.
MULTI30K_RAW = [
    "Ein Mann sagt: „Komm schon … was ist schöner als Tee.“",
    "ÄRZTE, Öfen & Übungen <im> Freien — z.B. bei 3,5 Grad.",
    "Dr. Müller’s Hund spielt mit dem ‚Ball’, der „rot“, nicht blau ist.",
    "Zwei Kinder (beide 5 Jahre alt) laufen über saftig-grünes Gras; sie lachen!",
    "Ein Schild mit „Rock 'n' Roll“ und 100 % Spaß?",
]
MULTI30K_TOKENS = [
    "ein mann sagt : &quot; komm schon ... was ist schöner als tee &quot; .",
    "ärzte , öfen &amp; übungen &lt; im &gt; freien - z.b. bei 3,5 grad .",
    "dr. müller &apos; s hund spielt mit dem &quot; ball &quot; , der &quot; rot &quot; , nicht blau ist .",
    "zwei kinder ( beide 5 jahre alt ) laufen über saftig-grünes gras ; sie lachen !",
    "ein schild mit &quot; rock &apos; n &apos; roll &quot; und 100 % spaß ?",
]


def test_the_multi30k_literatures_tokens_are_the_datasets_own():
    # Lowercasing (umlauts too), German quotes with the period moved out at the end of a line, single quotes as the
    # dataset's Moses had them, escaping, abbreviations, decimal commas and unsplit compounds.
    assert multi30k_tokenize(MULTI30K_RAW, "de") == MULTI30K_TOKENS


def test_the_multi30k_bleu_scores_those_tokens_and_says_so():
    shouted = [line.upper() for line in MULTI30K_RAW[:4]]  # (not the fifth: "ß".upper() is "SS")
    perfect = multi30k_bleu(shouted, MULTI30K_RAW[:4])
    assert perfect["bleu"] == pytest.approx(100.0) and "task1-tokenize.sh" in perfect["protocol"]
    hypotheses = MULTI30K_RAW[:4] + ["Ein Schild mit Rock und Spaß."]
    expected = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(
        multi30k_tokenize(hypotheses), [MULTI30K_TOKENS]).score
    assert multi30k_bleu(hypotheses, MULTI30K_RAW)["bleu"] == pytest.approx(expected) and expected < 100
    with pytest.raises(ValueError, match="one reference per sentence"):
        multi30k_bleu(["a"], [["a", "b"]])
