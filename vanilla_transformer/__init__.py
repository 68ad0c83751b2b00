"""The Transformer of "Attention Is All You Need" as a Hugging Face transformers model."""
