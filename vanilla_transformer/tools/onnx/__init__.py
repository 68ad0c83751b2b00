"""ONNX: the export in the layout transformers.js and Optimum read (`export`), and the engine that runs it on
onnxruntime (`runtime`)."""

from .export import export_onnx, verify_onnx
from .runtime import OnnxSeq2Seq, OnnxTranslator

__all__ = ["export_onnx", "verify_onnx", "OnnxSeq2Seq", "OnnxTranslator"]
