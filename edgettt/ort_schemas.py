"""ONNX Runtime's own operators as onnxscript opsets, for the export's translations.

ONNX Runtime defines operators the `onnx` package does not know (its contrib domain
`com.microsoft`, and SimplifiedLayerNormalization in the default domain); onnxscript builds a node
only from a registered schema. `msft()` and `default_domain()` register the ones edgettt emits, once,
with the inputs, types and attributes edgettt uses (not their full definitions), and return the opset.
A leaf: it imports nothing of edgettt, so the weight formats and the ONNX export can both use it.
"""

from __future__ import annotations

FLOATS = ["tensor(float)", "tensor(float16)"]

# name -> (inputs as (name, type variable), attributes as (name, "int" | "float" | "string"), type variables[,
# outputs as (name, type variable): one output "Y" of T1 where not given])
MSFT_OPS = {
    "MatMulNBits": ([("A", "T1"), ("B", "T2"), ("scales", "T1"), ("zero_points", "T2")],
                    [("K", "int"), ("N", "int"), ("bits", "int"), ("block_size", "int"), ("accuracy_level", "int")],
                    {"T1": FLOATS, "T2": ["tensor(uint8)"]}),
    "DynamicQuantizeMatMul": ([("A", "T1"), ("B", "T2"), ("b_scale", "T1")], [],
                              {"T1": ["tensor(float)"], "T2": ["tensor(int8)", "tensor(uint8)"]}),
    "MatMulBnb4": ([("A", "T1"), ("B", "T2"), ("absmax", "T1")],
                   [("K", "int"), ("N", "int"), ("block_size", "int"), ("quant_type", "int")],
                   {"T1": FLOATS, "T2": ["tensor(uint8)"]}),
    "GatherBlockQuantized": ([("data", "T2"), ("indices", "Tind"), ("scales", "T1"), ("zero_points", "T2")],
                             [("gather_axis", "int"), ("quantize_axis", "int"), ("block_size", "int"),
                              ("bits", "int")],
                             {"T1": FLOATS, "T2": ["tensor(uint8)"], "Tind": ["tensor(int64)", "tensor(int32)"]}),
    "RotaryEmbedding": ([("input", "T1"), ("position_ids", "M"), ("cos_cache", "T1"), ("sin_cache", "T1")],
                        [("interleaved", "int")], {"T1": FLOATS, "M": ["tensor(int64)"]}),
    # ONNX Runtime >= 1.26: a causal depthwise convolution continuing from its state (channels_last: [B, T, C]
    # and a state [B, K - 1, C])
    "CausalConvWithState": ([("input", "T1"), ("weight", "T1"), ("bias", "T1"), ("past_state", "T1")],
                            [("ndim", "int"), ("channels_last", "int"), ("activation", "string")],
                            {"T1": ["tensor(float)"]}, [("output", "T1"), ("present_state", "T1")]),
    # ONNX Runtime >= 1.26: one token's (or a prefill's) recurrence of a linear attention, q, k, v packed
    # [B, T, heads * D], the state [B, heads, K, V]; outputs the output and the new state
    "LinearAttention": ([("query", "T1"), ("key", "T1"), ("value", "T1"), ("past_state", "T1"), ("decay", "T1"),
                         ("beta", "T1")],
                        [("q_num_heads", "int"), ("kv_num_heads", "int"), ("scale", "float"),
                         ("update_rule", "string")], {"T1": ["tensor(float)"]},
                        [("output", "T1"), ("present_state", "T1")]),
}
DEFAULT_DOMAIN_OPS = {
    "SimplifiedLayerNormalization": ([("X", "T1"), ("scale", "T1")],
                                     [("axis", "int"), ("epsilon", "float"), ("stash_type", "int")], {"T1": FLOATS}),
}


def _register(domain: str, ops: dict) -> None:
    import onnx
    from onnx.defs import OpSchema

    kinds = {"int": OpSchema.AttrType.INT, "float": OpSchema.AttrType.FLOAT, "string": OpSchema.AttrType.STRING}
    for name, (inputs, attrs, types, *outputs) in ops.items():
        try:
            onnx.defs.get_schema(name, 1, domain)
            continue
        except onnx.defs.SchemaError:
            pass
        onnx.defs.register_schema(OpSchema(
            name, domain, 1, inputs=[OpSchema.FormalParameter(n, t) for n, t in inputs],
            outputs=[OpSchema.FormalParameter(n, t) for n, t in (outputs[0] if outputs else [("Y", "T1")])],
            type_constraints=[(var, allowed, "") for var, allowed in types.items()],
            attributes=[OpSchema.Attribute(a, kinds[kind], "") for a, kind in attrs]))


def msft():
    """The com.microsoft opset (MatMulNBits, DynamicQuantizeMatMul, MatMulBnb4, GatherBlockQuantized, RotaryEmbedding,
    CausalConvWithState, LinearAttention)."""
    from onnxscript import values

    _register("com.microsoft", MSFT_OPS)
    return values.Opset("com.microsoft", 1)


def default_domain():
    """The default domain's opset with ONNX Runtime's SimplifiedLayerNormalization."""
    from onnxscript import values

    _register("", DEFAULT_DOMAIN_OPS)
    return values.Opset("", 1)
