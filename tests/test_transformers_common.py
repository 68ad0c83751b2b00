"""transformers' own common model and configuration tests (`ModelTesterMixin`, `ConfigTester`), run on this model as
transformers runs them on MarianMTModel: the same tester shape, the same two classes, Marian's own checks of the
decoder's cache and of the encoder and decoder saved alone. The harness is the installed transformers' own,
fetched from its source distribution by tests/upstream/fetch.py (`make test` runs it; that file says what the
source distribution leaves out)."""

import tempfile
import unittest
from pathlib import Path

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, VanillaTransformerModel
from vanilla_transformer.modeling_vanilla_transformer import (CACHE_FIELD, VanillaTransformerDecoder,
                                                              VanillaTransformerEncoder)

FETCHED = Path(__file__).parent / "upstream" / "transformers_tests" / "VERSION"
if not FETCHED.is_file() or FETCHED.read_text().split()[0] != transformers.__version__:
    pytest.skip(f"transformers' common tests for transformers {transformers.__version__} are not fetched: run "
                "`python tests/upstream/fetch.py` (make test does)", allow_module_level=True)

from upstream.transformers_tests.test_configuration_common import ConfigTester  # noqa: E402
from upstream.transformers_tests.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402


@pytest.fixture(autouse=True)
def in_the_auto_tables(monkeypatch):
    """The harness finds a model's task by its class name in transformers' own tables, which list only in-tree models
    (a registered model is looked up by its config instead): without an entry it would train the base model as if it
    had a loss, and skip the checks of the shifted labels."""
    monkeypatch.setitem(modeling_auto.MODEL_MAPPING_NAMES, VanillaTransformerConfig.model_type,
                        VanillaTransformerModel.__name__)
    monkeypatch.setitem(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, VanillaTransformerConfig.model_type,
                        VanillaTransformerForConditionalGeneration.__name__)


class VanillaTransformerModelTester:
    """MarianModelTester's shape: 13 sequences of 7 tokens, 99-token vocabulary, d 16, 2 + 2 layers, 4 heads."""

    def __init__(self, parent, batch_size=13, seq_length=7, is_training=True, vocab_size=99, hidden_size=16,
                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=4, dropout=0.1, attention_dropout=0.1):
        self.parent, self.batch_size, self.seq_length, self.is_training = parent, batch_size, seq_length, is_training
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_attention_heads, self.intermediate_size = num_attention_heads, intermediate_size
        self.dropout, self.attention_dropout = dropout, attention_dropout

    def get_config(self) -> VanillaTransformerConfig:
        return VanillaTransformerConfig(
            vocab_size=self.vocab_size, d_model=self.hidden_size, encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers, encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads, encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size, dropout=self.dropout, attention_dropout=self.attention_dropout)

    def prepare_config_and_inputs(self):
        config = self.get_config()
        # Source tokens avoid the special ids, and every source ends in eos, as Marian's tester makes them.
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(4)
        input_ids[:, -1] = config.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {"input_ids": input_ids, "decoder_input_ids": decoder_input_ids,
                  "attention_mask": input_ids.ne(config.pad_token_id),
                  "decoder_attention_mask": decoder_input_ids.ne(config.pad_token_id)}
        return config, inputs

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class VanillaTransformerModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (VanillaTransformerModel, VanillaTransformerForConditionalGeneration)
    is_encoder_decoder = True
    # The output projection is the shared embedding (§3.4): a base model's checkpoint misses no key the full model
    # loads, so the harness's missing-key check has nothing to find (Marian sets the same).
    test_missing_keys = False
    # GenerationTesterMixin is not in transformers' source distribution (tests/upstream/fetch.py), so the harness is
    # told no class generates, as it asks of a tester without it; tests/test_modeling.py tests generate() instead.
    all_generative_model_classes = ()
    # The harness dates a model by its configuration file's copyright line, which ours has not; run the check.
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = VanillaTransformerModelTester(self)
        self.config_tester = ConfigTester(self, config_class=VanillaTransformerConfig)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_save_load_strict(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            with tempfile.TemporaryDirectory() as folder:
                model_class(config).save_pretrained(folder)
                _, info = model_class.from_pretrained(folder, output_loading_info=True)
            self.assertEqual(list(info["missing_keys"]), [])

    def test_decoder_model_past_with_large_inputs(self):
        """Marian's: three tokens appended through the cache give what the whole sequence gives without it."""
        config, inputs = self.model_tester.prepare_config_and_inputs()
        model = VanillaTransformerModel(config).eval()
        with torch.no_grad():
            encoded = model.get_encoder()(inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]
            decoder, prefix = model.get_decoder(), inputs["decoder_input_ids"]
            context = dict(encoder_hidden_states=encoded, encoder_attention_mask=inputs["attention_mask"])
            first = decoder(prefix, use_cache=True, **context)
            next_tokens = ids_tensor((self.model_tester.batch_size, 3), config.vocab_size)
            whole = decoder(torch.cat([prefix, next_tokens], dim=-1), **context).last_hidden_state
            cached = decoder(next_tokens, cache=getattr(first, CACHE_FIELD), **context).last_hidden_state
        self.assertEqual(cached.shape[1], 3)
        torch.testing.assert_close(cached, whole[:, -3:], atol=1e-4, rtol=1e-4)

    def test_encoder_decoder_model_standalone(self):
        """Marian's: the encoder and the decoder, saved and reloaded alone, give what they give inside the model."""
        config, inputs = self.model_tester.prepare_config_and_inputs()
        model = VanillaTransformerModel(config).eval()
        with torch.no_grad():
            outputs = model(**inputs)
        for part, cls in ((model.get_encoder(), VanillaTransformerEncoder), (model.get_decoder(), VanillaTransformerDecoder)):
            with tempfile.TemporaryDirectory() as folder:
                part.save_pretrained(folder)
                reloaded = cls.from_pretrained(folder).eval()
            with torch.no_grad():
                if cls is VanillaTransformerEncoder:
                    got = reloaded(inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]
                    expected = outputs.encoder_last_hidden_state
                else:
                    got = reloaded(input_ids=inputs["decoder_input_ids"],
                                   attention_mask=inputs["decoder_attention_mask"],
                                   encoder_hidden_states=outputs.encoder_last_hidden_state,
                                   encoder_attention_mask=inputs["attention_mask"])[0]
                    expected = outputs.last_hidden_state
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
