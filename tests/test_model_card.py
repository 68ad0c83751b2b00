"""The model card carries the real scores and the checkpoint's own hyper-parameters, in metadata the Hub accepts."""

import pytest
from conftest import tiny_model
from huggingface_hub import ModelCard, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results
from test_pipeline import toy_translator

from vanilla_transformer.tools.hub import save_for_hub
from vanilla_transformer.training.metrics import bleu_signature, chrf_signature
from vanilla_transformer.tools.model_card import (
    TEMPLATE_PATH,
    check_model_card_metadata,
    count_parameters,
    model_card_variables,
    render_model_card,
)

HUB_ID = "toy-org/vanilla-toy"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint whose Table-3 values all differ from each other and from the defaults."""
    model, tokenizer = toy_translator(encoder_layers=2, decoder_layers=3, d_model=48, encoder_attention_heads=6,
                                      decoder_attention_heads=6, encoder_ffn_dim=80, decoder_ffn_dim=80,
                                      dropout=0.15, label_smoothing=0.05)
    folder = tmp_path_factory.mktemp("card") / "checkpoint"
    save_for_hub(model, tokenizer, folder)
    return model, folder


@pytest.fixture(scope="module")
def scores():
    return {"bleu": 27.3456, "chrf": 54.321, "bleu_signature": bleu_signature(), "chrf_signature": chrf_signature(),
            "dataset_split": "test", "decoding": "beam 4, length penalty 0.6"}


def card_fields(scores, **overrides):
    return {"languages": ["en", "de"], "license": "apache-2.0", "datasets": ["bentrevett/multi30k"],
            "eval_results": scores, "dataset_name": "Multi30k (2016 test)", "repo_id": HUB_ID,
            "training_summary": "Trained for 3 steps with the Noam schedule.", "base_model": "toy-org/vanilla-base",
            **overrides}


def test_card_metadata_has_the_real_scores_and_signature(checkpoint, scores, tmp_path):
    card = render_model_card(checkpoint[1], **card_fields(scores))
    card.save(tmp_path / "README.md")
    metadata = metadata_load(tmp_path / "README.md")  # what the Hub reads
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "translation"
    assert metadata["language"] == ["en", "de"] and metadata["license"] == "apache-2.0"
    assert metadata["datasets"] == ["bentrevett/multi30k"] and metadata["base_model"] == "toy-org/vanilla-base"
    assert {"vanilla-transformer", "translation"} <= set(metadata["tags"])
    assert metadata["metrics"] == ["bleu", "chrf"]
    name, results = model_index_to_eval_results(metadata["model-index"])
    assert name == "vanilla-toy"
    bleu, chrf = results
    assert (bleu.task_type, bleu.dataset_name, bleu.dataset_type, bleu.dataset_split) == (
        "translation", "Multi30k (2016 test)", "bentrevett/multi30k", "test")
    assert (bleu.metric_type, bleu.metric_value, bleu.metric_args) == ("bleu", 27.35, {"signature": bleu_signature()})
    assert (chrf.metric_type, chrf.metric_value, chrf.metric_args) == ("chrf", 54.32, {"signature": chrf_signature()})


def test_card_metadata_validates_offline(checkpoint, scores):
    card = render_model_card(checkpoint[1], **card_fields(scores))
    data = check_model_card_metadata(card)
    assert data.model_name == "vanilla-toy" and [r.metric_value for r in data.eval_results] == [27.35, 54.32]
    # The Hub's own validator is an HTTP call: unavailable offline, hence check_model_card_metadata.
    with pytest.raises(OSError):
        card.validate()


def test_invalid_metadata_is_rejected(checkpoint, scores):
    text = str(render_model_card(checkpoint[1], **card_fields(scores)))
    with pytest.raises(ValueError, match="pipeline_tag"):
        check_model_card_metadata(text.replace("pipeline_tag: translation", "pipeline_tag: text-generation"))
    with pytest.raises(ValueError, match="model-index|model_index"):
        check_model_card_metadata(text.replace("    dataset:\n", "    dataset_wrong:\n", 1))
    with pytest.raises(ValueError, match="ISO 639"):
        render_model_card(checkpoint[1], **card_fields(scores, languages=["English"]))
    with pytest.raises(ValueError, match="bleu_signature"):
        render_model_card(checkpoint[1], **card_fields({"bleu": 20.0}))


def test_card_text_has_the_hyperparameter_table_of_the_config(checkpoint, scores):
    model, folder = checkpoint
    text = render_model_card(folder, **card_fields(scores)).text
    params = model.num_parameters()
    assert count_parameters(folder) == params
    row = next(line for line in text.splitlines() if line.startswith("| **this checkpoint**"))
    cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
    # N (encoder / decoder), d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, params
    assert cells[:8] == ["2 / 3", "48", "80", "6", "8", "8", "0.15", "0.05"]
    assert cells[8] == f"{params / 1e3:.3g}K" and f"{params:,}" in text
    assert f"Vocabulary: {model.config.vocab_size} tokens" in text
    assert "| BLEU | 27.35 |" in text and "| chrF | 54.32 |" in text
    assert bleu_signature().replace("|", "\\|") in text  # escaped: a bare | would split the Markdown table
    assert "Trained for 3 steps with the Noam schedule." in text and "beam 4, length penalty 0.6" in text
    assert f'from_pretrained("{HUB_ID}", trust_remote_code=True)' in text
    assert 'pipeline("translation"' in text and "@inproceedings{vaswani2017attention" in text


def test_the_template_renders_the_same_with_model_card_from_template(checkpoint, scores):
    card_data, variables = model_card_variables(checkpoint[1], **card_fields(scores))
    via_hub = ModelCard.from_template(card_data, template_path=str(TEMPLATE_PATH), **variables)
    assert via_hub.content.strip() == render_model_card(checkpoint[1], **card_fields(scores)).content.strip()


def test_a_card_without_results_has_no_model_index(checkpoint):
    card = render_model_card(checkpoint[1], languages=["en", "de"], license="mit", datasets=None, eval_results=None,
                             dataset_name=None)
    assert "model-index" not in card.data.to_dict() and "model_name" not in card.data.to_dict()
    assert "has not been evaluated" in card.text
    check_model_card_metadata(card)


def test_save_for_hub_writes_a_draft_card_that_validates(checkpoint):
    card = ModelCard.load(checkpoint[1] / "README.md")
    check_model_card_metadata(card)
    assert "| **this checkpoint** | 2 / 3 | 48 |" in card.text


def test_a_missing_template_fails_clearly(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="template_path='.*nowhere.md' is not a file"):
        render_model_card(checkpoint[1], template_path=tmp_path / "nowhere.md", languages=None, license=None,
                          datasets=None, eval_results=None, dataset_name=None)



def test_the_card_says_when_the_checkpoint_has_a_logits_bias(checkpoint, scores, tmp_path):
    _, folder = checkpoint
    assert "lm_head_bias" not in render_model_card(folder, **card_fields(scores)).text
    model, tokenizer = toy_translator(lm_head_bias=True)
    save_for_hub(model, tokenizer, tmp_path / "biased")
    text = render_model_card(tmp_path / "biased", **card_fields(scores)).text
    assert "learned bias to the logits (`lm_head_bias`" in text


def test_the_card_says_when_the_tokenizer_lowercases(checkpoint, scores, tmp_path):
    from vanilla_transformer.data.tokenization import train_shared_tokenizer

    _, folder = checkpoint
    assert "lowercases" not in render_model_card(folder, **card_fields(scores)).text
    tokenizer = train_shared_tokenizer(["Zwei Hunde spielen im Schnee."] * 4, vocab_size=60, show_progress=False,
                                       lowercase=True)
    save_for_hub(tiny_model(vocab_size=len(tokenizer)), tokenizer, tmp_path / "lowercase")
    text = render_model_card(tmp_path / "lowercase", **card_fields(scores)).text
    assert "**The tokenizer lowercases all it encodes**, so the model reads and writes lowercase text" in text
