"""Export (layer L3): HF, ONNX (with an onnxruntime parity check), TorchScript and dynamic INT8 folders.

onnx/onnxruntime are imported lazily (only ``tandem.export`` imports them) and fail with a message naming
the ``export`` extra.
"""

from __future__ import annotations

FORMATS = ("hf", "onnx", "torchscript", "int8")
MANIFEST = "tandem_export.json"  # marks an export folder: tandem.data.outputs.EXPORT_MARKER

__all__ = ["FORMATS", "MANIFEST"]
