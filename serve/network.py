"""GPT-2 for MAX's serving engine: the course's blocks around a paged KV cache.

``max serve`` batches requests *raggedly*: the tokens of every sequence in a
step are laid end to end in one ``[total_tokens]`` vector, and
``input_row_offsets`` [batch + 1] says where each sequence starts. Each
sequence's past keys and values live in the engine's paged cache, which it
allocates, grows and frees per request (continuous batching).

Everything but the attention is the course's own code, unchanged: layer norm
(step 03), the MLP (step 04), the token table (step 05), the position table
(step 06), the pre-norm residual (step 08), and the parameter names of steps
09-11, so the same checkpoint mapping (weights/) loads it. The attention is
step 07's ``c_attn`` / ``c_proj`` with the middle swapped for the engine's
kernels: store this step's K and V into the paged cache, then ragged flash
attention with a causal mask over everything cached.
"""

from __future__ import annotations

import math

from max.driver import CPU
from max.dtype import DType
from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor
from max.graph import DimLike
from max.nn import kernels
from max.nn.attention import MHAMaskVariant
from max.nn.kv_cache import KVCacheParams, PagedCacheValues

from solutions.solution_03 import LayerNorm
from solutions.solution_04 import GPT2MLP
from solutions.solution_05 import TokenEmbedding
from solutions.solution_06 import PositionEmbedding
from solutions.solution_08 import pre_norm_residual

# The graph-API kernels, lifted to act on Tensors (the in-tree modulev3
# models do the same in max.experimental.nn.common_layers.functional_kernels).
store_k_cache = F.functional(kernels.store_k_cache_ragged)
store_v_cache = F.functional(kernels.store_v_cache_ragged)
flash_attention_ragged = F.functional(kernels.flash_attention_ragged)


def ragged_positions(input_row_offsets: Tensor, cache_lengths: Tensor, total: DimLike) -> Tensor:
    """Each token's position in its own sequence: what it has cached plus its
    place in this step's slice. GPT-2's positions are learned rows of ``wpe``,
    so unlike RoPE models they must be known before the first layer.

    token t belongs to sequence s = #{row ends <= t}; position = t - start[s] + cached[s].
    """
    t = Tensor.arange(0, total, dtype=DType.int64, device=input_row_offsets.device)
    starts = F.cast(input_row_offsets[:-1], DType.int64)
    ends = F.cast(input_row_offsets[1:], DType.int64)
    seq = F.sum(F.cast(F.unsqueeze(ends, 0) <= F.unsqueeze(t, 1), DType.int64), axis=-1)
    seq = F.reshape(seq, [-1])
    cached = F.cast(cache_lengths, DType.int64).to(input_row_offsets.device)
    return t - F.gather(starts, seq, axis=0) + F.gather(cached, seq, axis=0)


class PagedAttention(nn.Module):
    """Step 07's attention on the paged cache: same ``c_attn`` and ``c_proj``."""

    def __init__(self, config, kv_params: KVCacheParams, layer_idx: int, linear=nn.Linear) -> None:
        super().__init__()
        self.n_head, self.n_embd, self.head_dim = config.n_head, config.n_embd, config.head_dim
        self.kv_params = kv_params
        self.layer_idx = layer_idx
        self.c_attn = linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = linear(config.n_embd, config.n_embd)

    def forward(self, x: Tensor, kv: PagedCacheValues, input_row_offsets: Tensor) -> Tensor:
        """x [total_tokens, n_embd] -> [total_tokens, n_embd]."""
        heads = lambda t: F.reshape(t, [-1, self.n_head, self.head_dim])  # noqa: E731
        q, k, v = F.split(self.c_attn(x), [self.n_embd, self.n_embd, self.n_embd], axis=-1)
        layer = F.constant(self.layer_idx, DType.uint32, device=CPU())
        # Write this step's keys and values after each sequence's cached ones...
        store_k_cache(kv, heads(k), input_row_offsets, layer)
        store_v_cache(kv, heads(v), input_row_offsets, layer)
        # ...then attend over all of them; the kernel builds the causal mask,
        # offset by each sequence's cache length (step 02's past_len).
        out = flash_attention_ragged(
            self.kv_params, input=heads(q), input_row_offsets=input_row_offsets, kv_collection=kv,
            layer_idx=layer, mask_variant=MHAMaskVariant.CAUSAL_MASK, scale=1.0 / math.sqrt(self.head_dim),
        )
        return self.c_proj(F.reshape(out, [-1, self.n_embd]))


class RaggedBlock(nn.Module):
    """Step 09's block with the paged attention; names as in checkpoints."""

    def __init__(self, config, kv_params: KVCacheParams, layer_idx: int, linear=nn.Linear) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = PagedAttention(config, kv_params, layer_idx, linear)
        self.ln_2 = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config, linear)

    def forward(self, x: Tensor, kv: PagedCacheValues, input_row_offsets: Tensor) -> Tensor:
        x = pre_norm_residual(x, self.ln_1, lambda h: self.attn(h, kv, input_row_offsets))
        return pre_norm_residual(x, self.ln_2, self.mlp)


class RaggedTransformer(nn.Module):
    """Step 10's stack: wte + wpe, the blocks, ln_f."""

    def __init__(self, config, kv_params: KVCacheParams, linear=nn.Linear) -> None:
        super().__init__()
        self.wte = TokenEmbedding(config.vocab_size, config.n_embd)
        self.wpe = PositionEmbedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList([RaggedBlock(config, kv_params, i, linear) for i in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPT2Ragged(nn.Module):
    """Step 11's model for the engine: tokens of a ragged batch -> each
    sequence's next-token logits [batch, vocab] (float32, as the sampler wants).

    ``linear`` makes every Linear layer, as in steps 04-11: nn.Linear, or
    model/fast_linear.py's few-rows kernel (serve/model.py picks it for
    float32 on the CPU, where a decode step of a few requests is a few rows)."""

    def __init__(self, config, kv_params: KVCacheParams, linear=nn.Linear) -> None:
        super().__init__()
        self.transformer = RaggedTransformer(config, kv_params, linear)
        self.lm_head = linear(config.n_embd, config.vocab_size, bias=False)  # tied to wte on load

    def forward(self, tokens: Tensor, kv: PagedCacheValues, input_row_offsets: Tensor) -> Tensor:
        t = self.transformer
        positions = ragged_positions(input_row_offsets, Tensor.from_graph_value(kv.cache_lengths), tokens.shape[0])
        # Step 06's table, gathered at each token's own position: its forward
        # takes one contiguous range, and a ragged step holds one per sequence.
        x = t.wte(tokens) + F.gather(t.wpe.weight, positions, axis=0)
        for block in t.h:
            x = block(x, kv, input_row_offsets)
        last = F.gather(x, F.cast(input_row_offsets[1:], DType.int64) - 1, axis=0)
        return F.cast(self.lm_head(t.ln_f(last)), DType.float32)
