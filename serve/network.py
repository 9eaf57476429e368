"""GPT-2 for MAX's serving engine: the course's own model around a paged KV cache.

``max serve`` batches requests *raggedly*: the tokens of every sequence in a
step are laid end to end in one ``[total_tokens]`` vector, and
``input_row_offsets`` [batch + 1] says where each sequence starts. Each
sequence's past keys and values live in the engine's paged cache, which it
allocates, grows and frees per request (continuous batching).

The model that runs is the course's: ``kit.GPT2LMHeadModel(config, linear,
attention=paged(kit.GPT2MultiHeadAttention))``, where ``kit`` is
``model.course.course(impl)`` (the solutions, or the learner's ``steps/``
with ``python -m serve --impl steps``). That builds step 10's stack of step
09's blocks, each with step 03's layer norms, step 04's MLP and the
attention class it is handed, exactly as the app plugs in its in-place cache
(model/kv_cache.py). The parameter names are therefore the checkpoint's
(``transformer.h.0.attn.c_attn.weight``, ..., ``lm_head.weight``) and
weights/ loads them as it does for the app.

What serve/ adds, and why each part cannot be a course step's:

* ``paged(attention_class)``: a subclass of step 07's attention (its own
  ``__init__`` builds ``c_attn`` and ``c_proj``) whose forward keeps K and V
  in the engine's pages: store this step's K and V after each sequence's
  cached ones, then ragged flash attention with a causal mask over all of
  them. The engine owns the cache, so step 07's ``F.concat`` of past and new
  tensors has no tensors to concatenate. It reads the cache from a
  ``PagedLayer`` handed to it as ``past_key``, which step 09's block passes
  through unchanged: ``attn_out, key, value = self.attn(self.ln_1(x),
  past_key, past_value)``.
* ``GPT2Ragged.forward`` in place of steps 10 and 11's forwards. Step 10
  adds the positions of one contiguous range (``self.wpe(seq, past_len)``),
  but a ragged step holds one range per sequence, so step 06's table is
  gathered at ``ragged_positions(...)``; the blocks, ``ln_f`` and
  ``lm_head`` are then called as step 10 and 11 call them, and only each
  sequence's last token is scored (step 11's ``positions``, one per
  sequence).

The blocks see x as ``[1, total_tokens, n_embd]``: one "sequence" holding the
batch's tokens end to end. That is the ``[batch, seq, n_embd]`` every step was
written and checked for; layer norm, the MLP and the residuals act on each
token alone, so laying sequences end to end changes nothing for them, and
only the attention (this module's) knows where each sequence starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from max.driver import CPU
from max.dtype import DType
from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor
from max.graph import DimLike
from max.nn import kernels
from max.nn.attention import MHAMaskVariant
from max.nn.kv_cache import KVCacheParams, PagedCacheValues

from model.course import course

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


@dataclass
class PagedLayer:
    """One layer's view of the paged cache, for the call being traced: the
    engine's cache values, its sizes, where each sequence starts in the
    ragged batch, and the layer index. A plain holder (not a module, not a
    tensor): step 09's block hands it on to the attention as ``past_key``."""

    kv: PagedCacheValues
    kv_params: KVCacheParams
    input_row_offsets: Tensor
    layer: int


def paged(attention_class):
    """``attention_class`` (step 07's, the solution's or the learner's) with
    its keys and values in the engine's paged cache."""

    class PagedAttention(attention_class):
        def forward(self, x, past_key=None, past_value=None, **_):
            """x [1, total_tokens, n_embd], ``past_key`` a PagedLayer ->
            (out [1, total_tokens, n_embd], this step's keys, values
            [total_tokens, n_head, head_dim]): step 07's triple, so step 09's
            block runs unchanged. The cached keys and values stay in the pages."""
            page: PagedLayer = past_key
            heads = lambda t: F.reshape(t, [-1, self.n_head, self.head_dim])  # noqa: E731
            q, k, v = F.split(self.c_attn(x), [self.n_embd, self.n_embd, self.n_embd], axis=-1)
            q, k, v = heads(q), heads(k), heads(v)
            layer = F.constant(page.layer, DType.uint32, device=CPU())
            # Write this step's keys and values after each sequence's cached ones...
            store_k_cache(page.kv, k, page.input_row_offsets, layer)
            store_v_cache(page.kv, v, page.input_row_offsets, layer)
            # ...then attend over all of them; the kernel builds the causal mask,
            # offset by each sequence's cache length (step 02's past_len).
            out = flash_attention_ragged(
                page.kv_params, input=q, input_row_offsets=page.input_row_offsets, kv_collection=page.kv,
                layer_idx=layer, mask_variant=MHAMaskVariant.CAUSAL_MASK, scale=1.0 / math.sqrt(self.head_dim),
            )
            return self.c_proj(F.reshape(out, [1, -1, self.n_embd])), k, v

    PagedAttention.__name__ = PagedAttention.__qualname__ = f"Paged{attention_class.__name__}"
    return PagedAttention


class GPT2Ragged(nn.Module):
    """The course's GPT-2 for the engine: tokens of a ragged batch -> each
    sequence's next-token logits [batch, vocab] (float32, as the sampler
    wants), and with ``every_position`` also every token's [total_tokens,
    vocab] (``python -m serve --echo``: the prompt's log-probabilities).

    ``transformer`` and ``lm_head`` are step 11's own, built with the paged
    attention; ``impl`` picks the solutions or the learner's steps/.
    ``linear`` makes every Linear layer, as in steps 04-11: nn.Linear, or
    model/layers' FewRowsLinear (serve/model.py asks model/layers for the
    build options' maker: float32 on the CPU, where a decode step of a few
    requests is a few rows)."""

    def __init__(self, config, kv_params: KVCacheParams, linear=nn.Linear, impl: str = "solutions",
                 every_position: bool = False) -> None:
        super().__init__()
        kit = course(impl)
        lm = kit.GPT2LMHeadModel(config, linear, attention=paged(kit.GPT2MultiHeadAttention))
        # Step 11's parts, not the wrapper: the names stay transformer.* and lm_head.*.
        self.transformer = lm.transformer
        self.lm_head = lm.lm_head
        self.kv_params = kv_params
        self.every_position = every_position

    def forward(self, tokens: Tensor, kv: PagedCacheValues, input_row_offsets: Tensor):
        t = self.transformer
        positions = ragged_positions(input_row_offsets, Tensor.from_graph_value(kv.cache_lengths), tokens.shape[0])
        # Step 05's table, and step 06's gathered at each token's own position:
        # its forward takes one contiguous range, and a ragged step holds one
        # per sequence.
        x = F.unsqueeze(t.wte(tokens) + F.gather(t.wpe.weight, positions, axis=0), 0)
        for i, block in enumerate(t.h):
            x, _, _ = block(x, PagedLayer(kv, self.kv_params, input_row_offsets, i), None)
        last_rows = F.cast(input_row_offsets[1:], DType.int64) - 1
        score = lambda h: F.cast(F.squeeze(self.lm_head(t.ln_f(h)), 0), DType.float32)  # noqa: E731
        if self.every_position:
            every = score(x)  # [total_tokens, vocab]
            return F.gather(every, last_rows, axis=0), every
        # Each sequence's last token, gathered along the sequence axis as step
        # 11's ``positions`` are, then step 10's ln_f and step 11's head.
        return score(F.gather(x, last_rows, axis=1))  # [batch, vocab]
