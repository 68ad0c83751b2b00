import json

import pytest
from transformers import AutoConfig

from vanilla_transformer import PRESETS, VanillaTransformerConfig


def test_defaults_are_the_papers_base_model():
    config = VanillaTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (8, 2048, 0.1)
    assert config.activation_function == "relu" and config.scale_embedding and not config.normalize_before
    assert config.tie_word_embeddings and config.is_encoder_decoder
    assert config.label_smoothing == 0.0  # plain cross-entropy unless asked for: the presets ask


def test_presets_match_table_3():
    base, big = VanillaTransformerConfig.from_preset("base"), VanillaTransformerConfig.from_preset("big")
    assert all(VanillaTransformerConfig.from_preset(name).label_smoothing == 0.1 for name in PRESETS)  # §5.4
    assert (base.d_model, base.encoder_ffn_dim, base.encoder_attention_heads, base.dropout) == (512, 2048, 8, 0.1)
    assert (big.d_model, big.encoder_ffn_dim, big.encoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert big.d_model // big.encoder_attention_heads == 64  # d_k = d_v = 64 in both
    assert set(PRESETS) >= {"base", "big", "small", "tiny"}
    assert VanillaTransformerConfig.from_preset("small", vocab_size=100).vocab_size == 100


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="'huge'"):
        VanillaTransformerConfig.from_preset("huge")


def test_hf_generic_names_map_to_the_fields():
    config = VanillaTransformerConfig.from_preset("small")
    assert config.hidden_size == 256 and config.num_attention_heads == 4 and config.num_hidden_layers == 3


def test_generation_settings_stay_out_of_the_model_config():
    # transformers keeps decoding settings in generation_config; the config must not carry them.
    assert "num_beams" not in VanillaTransformerConfig().to_diff_dict()


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("d_model", 100, ValueError),  # not divisible by 8 heads
        ("encoder_layers", 0, ValueError),
        ("decoder_ffn_dim", -1, ValueError),
        ("vocab_size", 0, ValueError),
        ("d_model", "big", TypeError),
        ("dropout", 1.0, ValueError),
        ("attention_dropout", -0.1, ValueError),
        ("label_smoothing", 1.5, ValueError),
        ("activation_function", "swishy", ValueError),
        ("pad_token_id", 40000, ValueError),
        ("eos_token_id", -1, ValueError),
        ("layer_norm_eps", 0, ValueError),
        ("scale_embedding", "False", TypeError),  # a string would read as true
        ("normalize_before", 1, TypeError),
        ("init_method", "kaiming", ValueError),
    ],
)
def test_invalid_values_are_refused_with_field_and_value(field, value, error):
    with pytest.raises(error, match=field) as raised:
        VanillaTransformerConfig(**{field: value})
    assert repr(value) in str(raised.value) or str(value) in str(raised.value)


def test_several_end_of_sequence_ids_are_allowed_but_checked():
    assert VanillaTransformerConfig(eos_token_id=[2, 5]).eos_token_id == [2, 5]
    with pytest.raises(ValueError, match="eos_token_id"):
        VanillaTransformerConfig(vocab_size=10, eos_token_id=[2, 50])


def test_hand_edited_config_json_is_refused_on_load(tmp_path):
    VanillaTransformerConfig.from_preset("tiny", vocab_size=100).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    values = json.loads(path.read_text())
    values["encoder_attention_heads"] = 5
    path.write_text(json.dumps(values))
    with pytest.raises(ValueError, match="encoder_attention_heads"):
        AutoConfig.from_pretrained(tmp_path)


def test_config_round_trips_through_autoconfig_with_auto_map(tmp_path):
    config = VanillaTransformerConfig.from_preset("small", vocab_size=1234, normalize_before=True)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"]["AutoConfig"] == "configuration_vanilla_transformer.VanillaTransformerConfig"
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VanillaTransformerConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()
