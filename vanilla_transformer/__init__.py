"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face transformers model.

Importing the package registers the model with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig, paper_generation_config
from .modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)
from .pipeline_vanilla_transformer import (
    VanillaTranslationPipeline,
    register_translation_pipeline,
    translation_pipeline,
)

__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)

# Saved configs carry `auto_map`, and save_pretrained copies the configuration and modeling files next to
# the weights, so a folder or Hub repo loads with trust_remote_code=True where this package is not installed.
VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
# transformers 5 removed the "translation" task; ours is registered under that name (see hub.save_for_hub).
register_translation_pipeline()

__all__ = [
    "PRESETS",
    "paper_generation_config",
    "VanillaTransformerConfig",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerPreTrainedModel",
    "VanillaTranslationPipeline",
    "register_translation_pipeline",
    "translation_pipeline",
]
