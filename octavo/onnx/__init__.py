"""ONNX export and the ONNX Runtime model runner.

``export``: ``octavo export onnx`` writes octavo's own decoder (its modules and loaded weights,
attention swapped for an export-friendly kernel over explicit past K/V) as an ONNX model in the
input/output layout ONNX Runtime GenAI and transformers.js use, plus the tokenizer files and a
``genai_config.json``. ``runner``: the model runner of ``--model-impl onnxruntime``, which runs
such a folder under octavo's scheduler, sampler and server.

Nothing here is imported unless one of those is asked for (``onnxruntime``/``onnx`` are the
``[onnx]`` extra).
"""
