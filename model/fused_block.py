"""The app's GPT-2 block on the CPU in float32: the block's tail as one op.

Why this sits beside step 09: the course's block runs each Linear as an op
of its own, and a MAX graph runs each op's parallel work as a section of
its own, which costs ~25-40 us to start and join on these 2 cores, where
the cores reading the weights need only ~1-5 us to wait for each other
(``python -m bench.sections``). A decode step's 49 matmuls are 49 sections.
Here everything after the attention core, the attention's c_proj, its
residual, ln_2, the MLP and its residual, is one Mojo op
(``block_tail_f32`` in model/kernels/block.mojo): three of a layer's four
matmuls in one section, the cores waiting for each other in between on a
spinning counter, as llama.cpp's threads do between ops.

The math and the weights are step 09's block (step 03's LayerNorm, step
04's MLP and gelu_new, step 07's c_proj), read from the same modules, so
the checkpoint loads as it does for the course's block; the attention up to
its heads is model/kv_cache.py's (step 07's math over the in-place cache).
``tests/test_fused_block.py`` checks the op against numpy and a whole model
built with it against the course's block, logits and greedy tokens.

Used by ``load_gpt2`` where the float32 kernels run (the CPU, ``--linear
custom``) with the in-place cache and the course's own solutions: with
``--impl steps`` the learner's block runs as they wrote it.
"""

from __future__ import annotations

from model.fast_linear import kernel_library


def block_tail(block, x, a):
    """``x + c_proj(a)``, then the MLP's residual over it, as one op:
    ``block`` (step 09's) holds the weights, ``x`` [..., D] is the block's
    input, ``a`` [..., D] the attention's heads merged, before c_proj."""
    from max.dtype import DType
    from max.experimental import functional as F
    from max.graph import DeviceRef, TensorType

    attn, ln, mlp = block.attn, block.ln_2, block.mlp
    lead, d = list(x.shape[:-1]), x.shape[-1]
    cpu = DeviceRef.CPU()
    eps = F.constant([ln.eps], DType.float32, device=cpu)
    inputs = [x.reshape([-1, d]), a.reshape([-1, d]), attn.c_proj.weight, attn.c_proj.bias, ln.weight, ln.bias,
              mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias, eps]
    out = TensorType(DType.float32, [inputs[0].shape[0], d], device=cpu)
    y = F.custom("block_tail_f32", cpu, inputs, [out], custom_extensions=[kernel_library()])[0]
    return y.reshape([*lead, d])


def fuse_block_tails(lm) -> None:
    """Every block of ``lm`` (a GPT2LMHeadModel whose attention is
    model/kv_cache.py's, which can stop before c_proj) made to run its tail
    as one op: each block becomes a subclass of its own class whose forward
    is the one below; its modules and weights stay as they are."""
    for block in lm.transformer.h:
        block.__class__ = _fused_class(type(block))


_FUSED: dict[type, type] = {}


def _fused_class(base: type) -> type:
    if base not in _FUSED:
        class FusedTailBlock(base):
            def forward(self, x, past_key=None, past_value=None):
                # Step 09's forward: x + attn(ln_1(x)), then x + mlp(ln_2(x)),
                # with everything after the attention's heads in one op.
                heads, key, value = self.attn.heads(self.ln_1(x), past_key, past_value)
                return block_tail(self, x, heads), key, value

        FusedTailBlock.__name__ = FusedTailBlock.__qualname__ = f"FusedTail{base.__name__}"
        _FUSED[base] = FusedTailBlock
    return _FUSED[base]
