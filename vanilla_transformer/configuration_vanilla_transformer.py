"""Configuration of the Transformer of Vaswani et al. (2017), "Attention Is All You Need".

Field names follow BART/Marian so every Hugging Face tool and converter knows them. The defaults are the
shape of the paper's base model (Table 3) with its shared 37k BPE vocabulary (§5.1); the presets add the
paper's training choices, and `paper_generation_config` its decoding.
"""

from transformers import GenerationConfig
from transformers.activations import ACT2FN
from transformers.configuration_utils import PreTrainedConfig

from .support_vanilla_transformer import check_int

AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
}

# Table 3 of the paper; `small` and `tiny` are ours, sized for a CPU. Every preset trains with the paper's
# label smoothing, epsilon_ls = 0.1 (§5.4).
PRESETS = {
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, dropout=0.1,
                 label_smoothing=0.1),
    "big": dict(d_model=1024, encoder_layers=6, decoder_layers=6, encoder_attention_heads=16,
                decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, dropout=0.3,
                label_smoothing=0.1),
    "small": dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, dropout=0.1,
                  label_smoothing=0.1),
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, dropout=0.1,
                 label_smoothing=0.1),
}

INIT_METHODS = ("normal", "xavier")

# §6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 [GNMT's] ... maximum output length
# to input length + 50". `length_penalty_type` and `max_new_tokens_over_input` are read by the model's generate().
PAPER_DECODING = dict(num_beams=4, length_penalty=0.6, length_penalty_type="gnmt", max_new_tokens_over_input=50)


def paper_generation_config(config: "VanillaTransformerConfig") -> GenerationConfig:
    """The paper's decoding for a model of `config`: set it as `model.generation_config`, and it is saved with
    the model (generation_config.json). A model without it decodes greedily, as every transformers model does."""
    return GenerationConfig(decoder_start_token_id=config.first_decoder_token_id, bos_token_id=config.bos_token_id,
                            eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, **PAPER_DECODING)


class VanillaTransformerConfig(PreTrainedConfig):
    model_type = "vanilla_transformer"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    # §5.4: residual dropout on every sublayer output and on the embedding + position sums.
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # §3.1 puts LayerNorm after each residual addition (post-LN); True moves it before the sublayer.
    normalize_before: bool = False
    # §3.4: embeddings are multiplied by sqrt(d_model).
    scale_embedding: bool = True
    # Not in the paper: a learned bias on the output projection (the logits), as OPUS-MT's Marian models have.
    lm_head_bias: bool = False
    layer_norm_eps: float = 1e-5
    # §5.4's label smoothing, applied inside the model's loss so it works with any collator. 0 (plain
    # cross-entropy, what every transformers tool expects of a loss) unless asked for; the presets ask for 0.1.
    label_smoothing: float = 0.0
    # How a new model's weights are drawn; the paper does not say. "normal": N(0, init_std) for every matrix, the
    # BART/Marian convention. "xavier": fairseq's: Xavier-uniform matrices, the attention's query, key and value
    # projections at gain 1/sqrt(2), and embeddings N(0, d_model^-1/2), so that scaled by sqrt(d_model) (§3.4) they
    # start at unit variance, the scale of the positional encoding's sines and cosines.
    init_method: str = "normal"
    init_std: float = 0.02
    use_cache: bool = True
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self._check()
        # Saved folders name all three classes, so AutoModel too loads them with trust_remote_code=True where
        # this package is not installed (saving records only the class being saved).
        if getattr(self, "auto_map", None) is None:
            self.auto_map = dict(AUTO_MAP)

    @property
    def first_decoder_token_id(self) -> int:
        """The token the decoder starts from: `decoder_start_token_id`, else `bos_token_id` (one is always set)."""
        return self.bos_token_id if self.decoder_start_token_id is None else self.decoder_start_token_id

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VanillaTransformerConfig":
        """`base` and `big` are Table 3 of the paper; `small` and `tiny` fit a CPU."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    def _check(self):
        sizes = ["vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                 "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim"]
        for name in sizes:
            check_int(f"`{name}`", getattr(self, name))
        for name in ["normalize_before", "scale_embedding", "lm_head_bias"]:
            value = getattr(self, name)
            if not isinstance(value, bool):  # the string "False" would silently read as true
                raise TypeError(f"`{name}` must be True or False, got {value!r}.")
        for heads in ["encoder_attention_heads", "decoder_attention_heads"]:
            if self.d_model % getattr(self, heads):
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{heads}` ({getattr(self, heads)})."
                )
        for name in ["dropout", "attention_dropout", "activation_dropout", "label_smoothing"]:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"`{name}` must be a number in [0, 1), got {value!r}.")
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"Unknown `activation_function` {self.activation_function!r}; choose one of {sorted(ACT2FN)}."
            )
        if self.init_method not in INIT_METHODS:
            raise ValueError(f"Unknown `init_method` {self.init_method!r}; choose one of {list(INIT_METHODS)}.")
        if not isinstance(self.init_std, (int, float)) or self.init_std <= 0:
            raise ValueError(f"`init_std` must be a positive number, got {self.init_std!r}.")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be a positive number, got {self.layer_norm_eps!r}.")
        for name in ["pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"]:
            value = getattr(self, name)
            ids = value if name == "eos_token_id" and isinstance(value, list) else [value]  # several eos allowed
            if value is not None and not all(isinstance(i, int) and 0 <= i < self.vocab_size for i in ids):
                raise ValueError(
                    f"`{name}` must be None or an id inside the vocabulary [0, {self.vocab_size}), got {value!r}."
                )
        if self.decoder_start_token_id is None and self.bos_token_id is None:
            raise ValueError("Set `decoder_start_token_id` (or `bos_token_id`): the decoder needs a first token.")


__all__ = ["VanillaTransformerConfig", "PRESETS", "PAPER_DECODING", "paper_generation_config"]
