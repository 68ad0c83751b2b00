"""A `translation` pipeline for the Transformer, which transformers 5 no longer ships.

transformers 5 removed the `translation` task: `pipeline("translation", ...)` raises KeyError. A model
folder or Hub repo can still serve one as remote code. `save_for_hub` registers this class for the task,
and the pipeline's `save_pretrained` writes `custom_pipelines` into config.json and copies this file beside
the weights. Custom tasks are resolved before the removed-task check, so

    pipeline("translation", model="<folder or org/name>", trust_remote_code=True)

works in a process without this package. Because the Hub serves this file as remote code, it imports only
torch, transformers and the standard library, like the modeling file.

The outputs follow the old `TranslationPipeline`: `[{"translation_text": ...}]` for one string; for a list
of strings, one dict per input, or one list of dicts per input when `num_return_sequences > 1`.
"""

from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

TASK = "translation"


class VanillaTranslationPipeline(Pipeline):
    """Tokenize, `model.generate`, decode with `skip_special_tokens=True`.

    Generation parameters (`num_beams`, `max_new_tokens`, `length_penalty`, a `generation_config`, ...) are
    passed to `generate` as given, at construction or per call; what they leave out comes from the model's
    generation config: the paper's beam search (§6.1) where that is `paper_generation_config()`, as for
    `from_preset` models and the recipe's checkpoints, and greedy decoding for a model made from a bare config.
    """

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    # The base class sets the generation kwargs aside and `_prepare_generate_kwargs` merges them per call.
    _pipeline_calls_generate = True

    def _sanitize_parameters(self, truncation=None, return_tensors=None, clean_up_tokenization_spaces=None,
                             **generate_kwargs):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        """Translate one string or a list of strings; `batch_size=` batches them (padded like the tokenizer pads)."""
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(isinstance(x, str) for x in inputs) and all(len(r) == 1 for r in result):
            return [r[0] for r in result]
        return result

    def preprocess(self, text, truncation=False):
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__} translates strings, got {type(text).__name__}.")
        inputs = self.tokenizer(text, truncation=truncation, return_tensors="pt")
        inputs.pop("token_type_ids", None)  # some tokenizers add them; the model takes none
        return inputs

    def _forward(self, model_inputs, **generate_kwargs):
        batch = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **self._prepare_generate_kwargs(generate_kwargs))
        # (batch * num_return_sequences, length) -> (batch, num_return_sequences, length), so the pipeline's
        # unbatching hands each input all of its sequences.
        return {"output_ids": output_ids.reshape(batch, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs, return_tensors=False, clean_up_tokenization_spaces=False):
        records = []
        for ids in model_outputs["output_ids"][0]:
            if return_tensors:
                records.append({"translation_token_ids": ids})
            else:
                text = self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
                records.append({"translation_text": text})
        return records


def register_translation_pipeline():
    """Register the class for the `translation` task: its `save_pretrained` then writes `custom_pipelines`.

    Idempotent. The registration is global to the process; it does not make `pipeline("translation",
    model=<model object>)` work (that task name is removed in transformers 5), use `translation_pipeline`.
    """
    current = PIPELINE_REGISTRY.supported_tasks.get(TASK, {}).get("impl")
    if current is not VanillaTranslationPipeline:
        PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=VanillaTranslationPipeline,
                                            pt_model=AutoModelForSeq2SeqLM)


def translation_pipeline(model, tokenizer, **kwargs) -> VanillaTranslationPipeline:
    """The translation pipeline for an in-memory model, left on its device unless `device=` is given.

    kwargs go to the pipeline: generation parameters (`num_beams=5`, `max_new_tokens=64`, ...), `batch_size`,
    `truncation`, `device`.
    """
    register_translation_pipeline()
    if getattr(model, "hf_device_map", None) is None:  # a device_map-dispatched model may not be moved
        kwargs.setdefault("device", model.device)
    return VanillaTranslationPipeline(model=model, tokenizer=tokenizer, task=TASK, **kwargs)


__all__ = ["VanillaTranslationPipeline", "register_translation_pipeline", "translation_pipeline"]
