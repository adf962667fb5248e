"""Optional dependencies behind a helpful error: which extra to install, not a raw ImportError.

``require_extra("serve", "octavo serve")`` checks (without importing anything) that every
module of the ``[serve]`` extra is importable, and raises ``MissingExtraError`` otherwise:
"`octavo serve` needs the serve extra: pip install 'octavo[serve]' (missing: uvicorn)".
"""

from __future__ import annotations

from octavo.utils import packages

# extra -> the import names of its packages (pyproject.toml [project.optional-dependencies])
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn", "pydantic", "prometheus_client", "zmq", "msgpack"),
    "bench": ("httpx", "matplotlib"),
    "ray": ("ray",),
    "onnx": ("onnxruntime", "onnx", "onnxscript"),
}


class MissingExtraError(ImportError):
    """An optional feature's packages are not installed; the message says what to install."""


def missing_modules(modules: tuple[str, ...] | list[str]) -> list[str]:
    return [name for name in modules if not packages.package_available(name)]


def require_extra(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise ``MissingExtraError`` naming ``pip install 'octavo[extra]'`` when any of the
    extra's modules (or just ``modules``) is missing."""
    missing = missing_modules(modules if modules is not None else EXTRA_MODULES[extra])
    if missing:
        raise MissingExtraError(
            f"{feature} needs the {extra} extra: pip install 'octavo[{extra}]' "
            f"(missing: {', '.join(missing)})"
        )
