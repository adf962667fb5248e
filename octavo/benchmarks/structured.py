"""``--structured-output json`` for ``octavo bench latency`` / ``throughput``: every iteration
(repeat) also runs the same prompts under a JSON Schema constraint, right after the
unconstrained run, so the report pairs the two in time and gives constrained / unconstrained
time per output token (the cost of compiling nothing, filling the batch bitmask from the
matchers, applying it in the sampler and advancing the matchers).

The schema is an array of records that cannot end within any output length (``minItems``
is huge), so ``ignore_eos`` lengths stay exact and the matchers walk real JSON structure:
object keys, enums, bounded integers and strings, separators.
"""

from __future__ import annotations

import argparse
from typing import Any

KEY = "octavo+json"

BENCH_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 100_000,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 100_000},
            "name": {"type": "string", "maxLength": 16},
            "kind": {"enum": ["user", "group", "service"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["id", "name", "kind", "score", "tags"],
        "additionalProperties": False,
    },
}


def add_structured_output_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--structured-output", default="none", choices=["none", "json"],
        help="json: also run each iteration under a JSON Schema constraint and report the "
             "constrained / unconstrained time per output token (octavo backend only)",
    )


def check_args(args: argparse.Namespace, backends: list[str]) -> bool:
    """True when the run measures structured outputs; only the octavo backend can."""
    if args.structured_output == "none":
        return False
    if backends != ["octavo"]:
        raise ValueError("--structured-output needs --backend octavo (HF generate has no grammar support)")
    return True


def constrain(params: Any) -> Any:
    """A copy of ``params`` under the benchmark schema (compact JSON: no free whitespace)."""
    from octavo.sampling_params import StructuredOutputsParams

    p = params.clone()
    p.structured_outputs = StructuredOutputsParams(json=BENCH_SCHEMA, disable_any_whitespace=True)
    return p
