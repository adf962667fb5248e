"""Small rewrites of an exported ONNX graph (``onnx`` protobuf, in place)."""

from __future__ import annotations

from typing import Any

TOTAL = "total_sequence_length"


def name_total_length(proto: Any) -> None:
    """Name the past + new length axis ``total_sequence_length`` (attention_mask axis 1, the
    presents' axis 2), as ONNX Runtime GenAI's models do; the exporter leaves it unnamed or a sum."""
    for value, axis in [(v, 1) for v in proto.graph.input if v.name == "attention_mask"] + [
        (v, 2) for v in proto.graph.output if v.name.startswith("present.")
    ]:
        dim = value.type.tensor_type.shape.dim[axis]
        dim.ClearField("dim_value")
        dim.dim_param = TOTAL


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def gemm_to_matmul(proto: Any) -> int:
    """Rewrite ``Gemm(x, W[, b])`` with a constant ``W`` as ``MatMul(x, W')`` (+ ``Add(b)``), the
    form ONNX Runtime's weight quantizer rewrites into ``MatMulNBits``. Returns the count."""
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, count = [], 0
    for node in graph.node:
        a = _attrs(node) if node.op_type == "Gemm" else {}
        plain = a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0 and not a.get("transA", 0)
        if node.op_type != "Gemm" or not plain or node.input[1] not in inits:
            nodes.append(node)
            continue
        weight = node.input[1]
        if a.get("transB", 0):
            w = numpy_helper.to_array(inits[weight]).T.copy()
            weight = f"{node.input[1]}_transposed"
            if weight not in inits:
                inits[weight] = numpy_helper.from_array(w, weight)
                graph.initializer.append(inits[weight])
        has_bias = len(node.input) > 2 and node.input[2]
        mm_out = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], weight], [mm_out], name=f"{node.name}_MatMul"))
        if has_bias:
            nodes.append(onnx.helper.make_node("Add", [mm_out, node.input[2]], [node.output[0]], name=f"{node.name}_Add"))
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return count
