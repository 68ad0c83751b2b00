"""The engines by name: the model's own `generate()` ("transformers", `translation.GenerateTranslator`), a CTranslate2
export ("ctranslate2", `ctranslate2.CTranslate2Translator`) and an ONNX export on onnxruntime ("onnxruntime",
`onnx.OnnxTranslator`), each behind the one translation loop (`translation.Translator`). The engines import the
loop; only this module imports the engines, each where it is asked for."""

from .translation import GenerateTranslator, Translator

ENGINES = ("transformers", "ctranslate2", "onnxruntime")


def load_translator(engine: str, model_dir, device: str = "cpu", quantized: str | None = None,
                    threads: int = 0, compute_type: str = "default") -> Translator:
    """The translator for a folder: a saved model (or Hub id) through `generate()` ("transformers"), or an export
    for "ctranslate2" (`compute_type`: "default", "fastest" or a CTranslate2 type) or "onnxruntime"
    (`quantized="int8"`: its int8 graphs)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {ENGINES}.")
    if compute_type != "default" and engine != "ctranslate2":
        raise ValueError(f"compute_type={compute_type!r} is for the ctranslate2 engine, not {engine!r}.")
    if quantized is not None and engine != "onnxruntime":
        raise ValueError(f"quantized={quantized!r} is for the onnxruntime engine (CTranslate2 exports are quantized "
                         "when written).")
    if engine == "ctranslate2":
        from .ctranslate2 import CTranslate2Translator

        return CTranslate2Translator(model_dir, device=device, threads=threads, compute_type=compute_type)
    if engine == "onnxruntime":
        from .onnx.runtime import OnnxTranslator

        return OnnxTranslator(model_dir, quantized=quantized, threads=threads)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).to(device)
    return GenerateTranslator(model, AutoTokenizer.from_pretrained(model_dir))


__all__ = ["ENGINES", "load_translator"]
