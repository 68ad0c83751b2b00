"""Pictures as checks: what a plot shows is exactly what the model computed."""

import torch

from conftest import tiny_model, tiny_tokenizer
from vanilla_transformer.tools.plots import plot_cross_attention
from vanilla_transformer.tools.translation import cross_attention


def test_the_attention_map_is_the_models_own_cross_attention_with_tokens_on_its_axes(tmp_path):
    model, tokenizer = tiny_model(), tiny_tokenizer()
    attention = cross_attention(model, tokenizer, "w5 w9 w7 w30", max_new_tokens=6, num_beams=1)
    assert model.config._attn_implementation == "sdpa"  # switched to eager for the forward only, then back
    source = tokenizer(["w5 w9 w7 w30"], return_tensors="pt")
    generated = model.generate(**source, max_new_tokens=6, num_beams=1)
    eager = tiny_model()
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        expected = eager(**source, decoder_input_ids=generated[:, :-1], output_attentions=True).cross_attentions
    assert attention["weights"].shape == (2, generated.shape[1] - 1, source["input_ids"].shape[1])
    for layer, weights in enumerate(expected):
        torch.testing.assert_close(attention["weights"][layer], weights[0].mean(0), atol=0, rtol=0)
    assert attention["source_tokens"] == ["w5", "w9", "w7", "w30", "</s>"]
    assert attention["target_tokens"] == tokenizer.convert_ids_to_tokens(generated[0, 1:].tolist())

    path = tmp_path / "attention.png"
    figure = plot_cross_attention(attention, path)
    assert path.stat().st_size > 5_000
    for layer, axis in enumerate(figure.axes):
        torch.testing.assert_close(torch.as_tensor(axis.images[0].get_array()), attention["weights"][layer].float())
        assert [t.get_text() for t in axis.get_xticklabels()] == attention["source_tokens"]
        assert [t.get_text() for t in axis.get_yticklabels()] == attention["target_tokens"]
