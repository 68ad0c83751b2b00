"""Model cards for saved checkpoints: Hub metadata plus the paper's hyper-parameter table, filled from the folder.

The one template is `model_card_template.md`, package data beside this module (Jinja2, the format of
`huggingface_hub.ModelCard.from_template`), so every install, editable or from a wheel, renders cards.

`ModelCard.validate()` posts the card to the Hub (`/api/validate-yaml`): it cannot run offline
(OfflineModeIsEnabled under HF_HUB_OFFLINE=1, a connection error without network).
`check_model_card_metadata` is the offline check: it re-parses the card as the Hub client does
(`ModelCard(text)` -> `ModelCardData`, which parses `model-index` into `EvalResult`s) and checks the
fields a translation model needs.
"""

from __future__ import annotations

import json
import os
import re
from math import prod
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import GenerationConfig

from ..configuration_vanilla_transformer import VanillaTransformerConfig
from .folders import parameter_shapes

TEMPLATE_PATH = Path(__file__).with_name("model_card_template.md")
TAGS = ["vanilla-transformer", "translation", "transformer", "encoder-decoder"]
# ISO 639-1/2/3 codes, or the Hub's special values.
_LANGUAGE = re.compile(r"[a-z]{2,3}|multilingual|code")


def count_parameters(folder: str | os.PathLike) -> int:
    """Parameters stored in the folder's safetensors file(s), read from their headers (no tensor is loaded).

    Tied weights are stored once, so this equals `model.num_parameters()`.
    """
    return sum(prod(shape) for shape in parameter_shapes(folder).values())


def _human(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _both(encoder, decoder):
    return str(encoder) if encoder == decoder else f"{encoder} / {decoder}"


def hyperparameters(config: VanillaTransformerConfig, params: int) -> dict:
    """Table 3's columns for this config; encoder / decoder shown apart where they differ."""
    heads = (config.encoder_attention_heads, config.decoder_attention_heads)
    d_k = _both(*(config.d_model // h for h in heads))
    return {
        "N": _both(config.encoder_layers, config.decoder_layers),
        "d_model": config.d_model,
        "d_ff": _both(config.encoder_ffn_dim, config.decoder_ffn_dim),
        "h": _both(*heads),
        "d_k": d_k,
        "d_v": d_k,
        "p_drop": config.dropout,
        "eps_ls": config.label_smoothing,
        "params": params,
        "params_human": _human(params),
    }


def _generation(folder: Path) -> dict:
    gen = GenerationConfig.from_pretrained(folder)
    offset = getattr(gen, "max_new_tokens_over_input", None)
    if gen.max_new_tokens is not None:
        budget = f"at most {gen.max_new_tokens} new tokens"
    elif offset is not None:
        budget = f"at most source length + {offset} new tokens (§6.1)"
    else:
        budget = f"at most {gen.max_length} tokens"
    return {"num_beams": gen.num_beams, "length_penalty": gen.length_penalty, "budget": budget}


def _lowercases(normalizer: dict | None) -> bool:
    """Whether a tokenizer.json normalizer lowercases the text (alone, in a sequence, or as BERT's does)."""
    if not normalizer:
        return False
    if normalizer.get("type") == "Sequence":
        return any(_lowercases(inner) for inner in normalizer.get("normalizers", []))
    return normalizer.get("type") == "Lowercase" or normalizer.get("lowercase") is True


def _eval_results(eval_results: dict, model_task: str, dataset_name: str, datasets: list[str]) -> list[EvalResult]:
    dataset = {
        "task_type": "translation",
        "task_name": model_task,
        "dataset_type": eval_results.get("dataset_type") or (datasets[0] if datasets else dataset_name),
        "dataset_name": dataset_name,
        "dataset_config": eval_results.get("dataset_config"),
        "dataset_split": eval_results.get("dataset_split"),
    }
    # The sacreBLEU signature fixes tokenization, casing and smoothing: the arguments of the score.
    results = [EvalResult(**dataset, metric_type="bleu", metric_name="BLEU",
                          metric_value=round(float(eval_results["bleu"]), 2),
                          metric_args={"signature": eval_results["bleu_signature"]})]
    if eval_results.get("bleu_lowercase") is not None:
        results.append(EvalResult(**dataset, metric_type="bleu", metric_name="BLEU (lowercased)",
                                  metric_value=round(float(eval_results["bleu_lowercase"]), 2),
                                  metric_args={"signature": eval_results["bleu_lowercase_signature"]}))
    if eval_results.get("paper_bleu") is not None:  # the paper's tokenized protocol, not comparable to sacreBLEU
        paper = eval_results["paper_bleu"]
        results.append(EvalResult(**dataset, metric_type="bleu", metric_name="BLEU (tokenized, the paper's protocol)",
                                  metric_value=round(float(paper["bleu"]), 2), metric_args={"protocol": paper["protocol"]}))
    if eval_results.get("multi30k_bleu") is not None:  # the Multi30k literature's tokens, not comparable to sacreBLEU
        tokens = eval_results["multi30k_bleu"]
        results.append(EvalResult(**dataset, metric_type="bleu", metric_name="BLEU (Multi30k's lowercased tokens)",
                                  metric_value=round(float(tokens["bleu"]), 2), metric_args={"protocol": tokens["protocol"]}))
    if eval_results.get("chrf") is not None:
        args = {"signature": eval_results["chrf_signature"]} if eval_results.get("chrf_signature") else None
        results.append(EvalResult(**dataset, metric_type="chrf", metric_name="chrF",
                                  metric_value=round(float(eval_results["chrf"]), 2), metric_args=args))
    return results


def model_card_variables(
    folder: str | os.PathLike,
    *,
    languages: list[str] | None,
    license: str | None,
    datasets: list[str] | None,
    eval_results: dict | None,
    dataset_name: str | None,
    training_summary: str = "",
    base_model: str | None = None,
    repo_id: str | None = None,
    example: str = "Two dogs are playing in the snow.",
    held_out_results: list[dict] | None = None,
) -> tuple[ModelCardData, dict]:
    """The card's metadata and the template's variables, for `render_model_card` or
    `ModelCard.from_template(card_data, template_path=TEMPLATE_PATH, **variables)`."""
    folder = Path(folder)
    languages = list(languages or [])
    for code in languages:
        if not _LANGUAGE.fullmatch(code):
            raise ValueError(f"language {code!r} is not an ISO 639 code such as 'en' or 'deu'")
    datasets = list(datasets or [])
    if eval_results is not None:
        missing = [k for k in ("bleu", "bleu_signature") if eval_results.get(k) is None]
        if missing:
            raise ValueError(f"eval_results lacks {missing} (it has {sorted(eval_results)}); give the scores with their "
                             "sacreBLEU signature")
        if not dataset_name:
            raise ValueError("eval_results needs dataset_name (--dataset_name in scripts/push_to_hub.py): the name of "
                             "the test set the scores are on")

    config = VanillaTransformerConfig.from_pretrained(folder)
    model_name = repo_id.split("/")[-1] if repo_id else folder.resolve().name
    pair = "-".join(languages) if 1 <= len(languages) <= 2 else None
    task_name = f"Translation {pair}" if pair else "Translation"

    card_data = ModelCardData(
        language=languages or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=TAGS,
        datasets=datasets or None,
        metrics=(["bleu", "chrf"] if eval_results.get("chrf") is not None else ["bleu"]) if eval_results else None,
        base_model=base_model,
    )
    evaluation = None
    if eval_results is not None:  # `model-index` needs a model name; without results it would be a stray key
        card_data.model_name = model_name
        card_data.eval_results = _eval_results(eval_results, task_name, dataset_name, datasets)
        evaluation = {key: eval_results.get(key) for key in
                      ("bleu", "bleu_signature", "bleu_lowercase", "bleu_lowercase_signature", "chrf", "chrf_signature",
                       "paper_bleu", "multi30k_bleu", "dataset_split", "decoding")}
        evaluation["dataset_name"] = dataset_name
    held_out = []
    for index, scores in enumerate(held_out_results or []):  # more test sets, each under its own name
        missing = [key for key in ("bleu", "bleu_signature", "dataset_name") if scores.get(key) is None]
        if missing:
            raise ValueError(f"held_out_results[{index}] lacks {missing} (it has {sorted(scores)})")
        card_data.model_name = model_name
        card_data.eval_results = [*(card_data.eval_results or []),
                                  *_eval_results(scores, task_name, scores["dataset_name"], datasets)]
        held_out.append({key: scores.get(key) for key in ("dataset_name", "num_sentences", "bleu", "bleu_lowercase",
                                                          "chrf", "multi30k_bleu")})
    arch = {
        "vocab_size": config.vocab_size,
        "embedding": ("one matrix for the source and target embeddings and the pre-softmax projection (§3.4)"
                      if config.tie_word_embeddings else "**untied** input embeddings and pre-softmax projection")
        + (", multiplied by sqrt(d_model)" if config.scale_embedding else ", not scaled by sqrt(d_model)")
        + ("; the pre-softmax projection adds a learned bias to the logits (`lm_head_bias`, as in OPUS-MT's "
           "Marian models; not in the paper)" if config.lm_head_bias else ""),
        "norm": "pre-LN, x + Sublayer(LayerNorm(x)), with a final LayerNorm" if config.normalize_before
        else "post-LN, LayerNorm(x + Dropout(Sublayer(x))) as in §3.1",
        "activation": config.activation_function,
        "attention_dropout": config.attention_dropout,
        "layer_norm_eps": config.layer_norm_eps,
        "lowercase": (folder / "tokenizer.json").is_file() and _lowercases(
            json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("normalizer")),
    }
    variables = {
        "model_name": model_name,
        "repo_id": repo_id or str(folder),
        "task_description": f"{' to '.join(languages)} translation" if pair else "translation",
        "dataset_name": dataset_name,
        "datasets": datasets,
        "training_summary": training_summary.strip(),
        "hp": hyperparameters(config, count_parameters(folder)),
        "arch": arch,
        "generation": _generation(folder),
        "eval": evaluation,
        "held_out": held_out,
        "example": example,
    }
    return card_data, variables


def render_model_card(folder: str | os.PathLike, *, template_path: str | os.PathLike | None = None,
                      **card_fields) -> ModelCard:
    """The model card of the checkpoint in `folder`, with Hub metadata (including `model-index`).

    Keyword arguments (see `model_card_variables`): languages, license, datasets, eval_results, dataset_name,
    training_summary="", base_model=None, repo_id=None, example, held_out_results=None (more scored test sets,
    each like eval_results with its own `dataset_name`).

    eval_results: `{"bleu": float, "bleu_signature": str, "chrf": float, "chrf_signature": str}` as
    `vanilla_transformer.training.metrics.corpus_scores` returns (with `bleu_lowercase` and its signature),
    optionally with `dataset_split`, `dataset_config`, `dataset_type` (a Hub dataset id; default the first of
    `datasets`) and `decoding` (free text).
    None renders a card without scores and without `model-index`. `languages` is `[source, target]`
    for a pair. `repo_id` names the model in the card's code (default: the folder).

    Rendered with undefined template variables as errors, unlike `ModelCard.from_template`.
    """
    template_path = Path(template_path) if template_path is not None else TEMPLATE_PATH
    if not template_path.is_file():
        raise FileNotFoundError(
            f"model card template not found: template_path={str(template_path)!r} is not a file"
        )
    try:
        import jinja2  # what ModelCard.from_template uses too; not a dependency of transformers
    except ImportError as error:
        raise ImportError("rendering a model card needs Jinja2: pip install jinja2") from error
    card_data, variables = model_card_variables(folder, **card_fields)
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = environment.from_string(template_path.read_text(encoding="utf-8"))
    return ModelCard(template.render(card_data=card_data.to_yaml(), **variables))


def write_run_card(folder: str | os.PathLike, results: dict, *, languages: list[str], license: str | None,
                   dataset_name: str, held_out: list[dict] | None = None) -> Path:
    """README.md of a finished training run from its results (results.json's content): the test (else validation)
    scores, and `held_out`, more scored sets (each like `eval_results`, with its own `dataset_name`)."""
    split = "test" if "test" in results else "validation" if "validation" in results else None
    card = render_model_card(
        folder, languages=languages, license=license, datasets=None,
        eval_results=None if split is None else {**results[split], "dataset_split": split},
        dataset_name=dataset_name, held_out_results=held_out,
        training_summary=f"{results['train']['steps']} optimizer steps of the paper's recipe "
                         f"(scripts/train.py; see results.json and training_curves.png).",
    )
    path = Path(folder) / "README.md"
    card.save(path)
    return path


def check_model_card_metadata(card: ModelCard | str | os.PathLike) -> ModelCardData:
    """Offline stand-in for `ModelCard.validate()` (which needs the Hub): parse the card's YAML header as the Hub
    client does and check the fields a translation model needs. Raises ValueError; returns the parsed data."""
    if isinstance(card, ModelCard):
        text = str(card)
    elif isinstance(card, os.PathLike) or (isinstance(card, str) and not card.lstrip().startswith("---")):
        text = Path(card).read_text(encoding="utf-8")
    else:
        text = card
    data = ModelCard(text).data  # YAML syntax, `model-index` -> EvalResult (ValueError when malformed)
    problems = []
    if data.library_name != "transformers":
        problems.append(f"library_name is {data.library_name!r}, not 'transformers'")
    if data.pipeline_tag != "translation":
        problems.append(f"pipeline_tag is {data.pipeline_tag!r}, not 'translation'")
    languages = [data.language] if isinstance(data.language, str) else data.language or []
    problems += [f"language {code!r} is not an ISO 639 code" for code in languages if not _LANGUAGE.fullmatch(code)]
    for result in data.eval_results or []:
        if not isinstance(result.metric_value, (int, float)):
            problems.append(f"{result.metric_type} value {result.metric_value!r} is not a number")
    if problems:
        raise ValueError("invalid model card metadata: " + "; ".join(problems))
    return data


def card_languages(folder: str | os.PathLike) -> tuple[str, str] | None:
    """The (source, target) pair a folder's model card declares (`language: [en, de]`), or None where the folder
    has no card, or a README that is not a translation model's card, or one that names no two languages."""
    card = Path(folder, "README.md")
    if not card.is_file():
        return None
    try:
        languages = check_model_card_metadata(card).language
    except ValueError:  # a README that is not a translation model's card names no pair
        return None
    return tuple(languages) if isinstance(languages, list) and len(languages) == 2 else None


__all__ = ["TEMPLATE_PATH", "render_model_card", "write_run_card", "model_card_variables", "check_model_card_metadata",
           "card_languages", "count_parameters", "hyperparameters"]
