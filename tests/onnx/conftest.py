"""Exported ONNX folders of the fixture checkpoints, built lazily once per test session."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime", reason="the [onnx] extra (onnxruntime) is not installed")

# longrope is exact up to original_max_position_embeddings (1024 in the phi3 fixture).
MAX_MODEL_LEN = {"phi3": 1024}


@pytest.fixture(scope="session")
def onnx_exports(tmp_path_factory, checkpoints):
    """``onnx_exports[arch]`` or ``onnx_exports[arch, "int4"]`` -> exported folder (``arch``
    "default": the trained model shipped with octavo)."""
    from octavo.engine.model_files import DEFAULT_MODEL_DIR, load_hf_config
    from octavo.onnx.export import export_onnx

    root = tmp_path_factory.mktemp("onnx")
    cache: dict = {}

    class _Lazy(dict):
        def __getitem__(self, key):
            arch, quantize = key if isinstance(key, tuple) else (key, None)
            if (arch, quantize) not in cache:
                src = str(DEFAULT_MODEL_DIR) if arch == "default" else checkpoints[arch]
                hf_config, architecture = load_hf_config(src)
                out = root / f"{arch}-{quantize or 'fp32'}"
                export_onnx(src, hf_config, architecture, str(out), "fp32", quantize, MAX_MODEL_LEN.get(arch))
                cache[arch, quantize] = str(out)
            return cache[arch, quantize]

    return _Lazy()
