"""The Linear layers the app builds where step 04's ``nn.Linear`` is slower, one module each kind.

    few_rows.py   FewRowsLinear   float32 on the CPU: this project's op for few rows
    q8_0.py       Q8_0Linear      8-bit weights on this project's op
    q4_0.py       Q4_0Linear      4-bit weights on this project's op
    qmatmul.py    QMatmulLinear   GGUF blocks on MAX's F.qmatmul (q6_k)
    custom_op.py  the op call the kernels' layers share, and the compiled kernel library

Each is built like ``nn.Linear(in_dim, out_dim, bias)`` and holds the same
bias; the course's blocks take a ``linear`` maker (steps 04, 07, 11), and
``linear_maker`` returns the one a build's options call for. The formats
themselves (numpy: quantize, pack, interleave) are model/quantize.py's.
Importing this package loads no MAX; its modules do.
"""

from __future__ import annotations


def linear_maker(options):
    """The ``linear(in_dim, out_dim, bias=True)`` maker for ``options``
    (model/options.py), or None for step 04's nn.Linear."""
    placement = options.placement
    if placement.quantization:
        return quantized_linear(placement.quantization)
    if options.uses_kernels:
        from model.layers.few_rows import FewRowsLinear

        return FewRowsLinear
    return None


def quantized_linear(encoding: str):
    """A ``linear(in_dim, out_dim, bias=True)`` maker for ``encoding`` (q8_0,
    q4_0, q6_k, q4_0m): the quantized layer where the input width fits the
    format's blocks, else a float32 ``nn.Linear`` (GGUF block formats need
    whole blocks per row).

    ``q4_0m`` is what ``llama-quantize ... Q4_0`` writes for GPT-2 without
    ``--pure``: Q4_0 for the blocks, the tied token embedding / head in
    Q6_K (Q8_0 where its width is not a multiple of Q6_K's 256, as
    llama.cpp falls back). The head is the one Linear GPT-2 builds without a
    bias (step 11's ``lm_head``; every block's has one)."""
    from max.experimental import nn

    from model.quantize import BLOCK, ENCODINGS, Q8_0_WIDTH_MULTIPLE, SUPER

    if encoding == "q4_0m":
        body, head_q6_k, head_q8_0 = quantized_linear("q4_0"), quantized_linear("q6_k"), quantized_linear("q8_0")

        def mixture(in_dim: int, out_dim: int, bias: bool = True):
            if bias:
                return body(in_dim, out_dim, bias)
            return (head_q6_k if in_dim % SUPER == 0 else head_q8_0)(in_dim, out_dim, bias)

        return mixture
    if encoding == "q8_0":  # the kernel takes two blocks per step (one 512-bit register of codes)
        from model.layers.q8_0 import Q8_0Linear as make

        block = Q8_0_WIDTH_MULTIPLE
    elif encoding == "q4_0":
        from model.layers.q4_0 import Q4_0Linear as make

        block = BLOCK
    else:
        from model.layers.qmatmul import QMatmulLinear

        block = ENCODINGS[encoding].block

        def make(in_dim, out_dim, bias):
            return QMatmulLinear(encoding, in_dim, out_dim, bias)

    def linear(in_dim: int, out_dim: int, bias: bool = True):
        if in_dim % block:
            return nn.Linear(in_dim, out_dim, bias=bias)
        return make(in_dim, out_dim, bias)

    return linear


def quantized_layers(lm) -> list:
    """The quantized Linear layers of a built model, as (name, module)."""
    from model.layers.q4_0 import Q4_0Linear
    from model.layers.q8_0 import Q8_0Linear
    from model.layers.qmatmul import QMatmulLinear

    return [(name, m) for name, m in lm.descendants if isinstance(m, (QMatmulLinear, Q8_0Linear, Q4_0Linear))]


def quantized_specs(lm) -> dict[str, list]:
    """{layer name: [encoding, the names of the arrays it holds, its q4_0
    band or None]} for a built model's quantized layers: all
    model/quantize.py's ``quantize_state`` needs, and what a saved graph's
    facts keep, so that a later start quantizes (or finds the saved blocks)
    without building the course's model (and importing what it needs)."""
    return {name: [layer.encoding, list(layer.arrays), getattr(layer, "band", None)]
            for name, layer in quantized_layers(lm)}


def quantized_that_ran(lm) -> int:
    """Quantized layers that the traced graph really calls (a learner's step
    may build one and not use it: it is not counted)."""
    return sum(layer.traced.ran for _, layer in quantized_layers(lm))
