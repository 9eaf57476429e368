"""GPT-2 for MAX's serving engine: the course's own model around a paged KV cache.

``max serve`` batches requests *raggedly*: the tokens of every sequence in a
step are laid end to end in one ``[total_tokens]`` vector, and
``input_row_offsets`` [batch + 1] says where each sequence starts. Each
sequence's past keys and values live in the engine's paged cache, which it
allocates, grows and frees per request (continuous batching).

The model that runs is the course's: ``kit.GPT2LMHeadModel(config, linear)``,
where ``kit`` is ``model.course.course(impl)`` (the solutions, or the
learner's ``steps/`` with ``python -m serve --impl steps``). That builds step
10's stack of step 09's blocks, each with step 03's layer norms, step 04's
MLP and step 07's attention. The parameter names are therefore the
checkpoint's (``transformer.h.0.attn.c_attn.weight``, ..., ``lm_head.weight``)
and weights/ loads them as it does for the app.

What serve/ adds, and why each part cannot be a course step's:

* ``PagedCache``: the cache object step 07's forward calls, as it calls the
  course's ConcatCache and the app's InPlaceCache. ``update`` writes this
  step's keys and values into the engine's pages after each sequence's
  cached ones; ``attend`` runs the engine's ragged flash attention over them,
  with a causal mask offset by each sequence's cache length (step 02's
  past_len). It cannot call the layer's ``_attn`` with one mask as the
  course's cache does: the batch holds several sequences end to end, and one
  mask over all of them would let a sequence attend to another's tokens.
* ``GPT2Ragged.forward`` in place of steps 10 and 11's forwards. Step 10
  adds the positions of one contiguous range (``self.wpe(seq, past_len)``),
  but a ragged step holds one range per sequence, so step 06's table is
  gathered at ``ragged_positions(...)``; the blocks, ``ln_f`` and
  ``lm_head`` are then called as step 10 and 11 call them, each block with
  its layer's PagedCache, and only each sequence's last tokens are scored
  (step 11's ``positions``: the last one, or with ``--echo`` every one).

The blocks see x as ``[1, total_tokens, n_embd]``: one "sequence" holding the
batch's tokens end to end. That is the ``[batch, seq, n_embd]`` every step was
written and checked for; layer norm, the MLP and the residuals act on each
token alone, so laying sequences end to end changes nothing for them, and
only the cache's attention knows where each sequence starts.
"""

from __future__ import annotations

import math
from dataclasses import replace

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


class PagedCache:
    """One layer's view of the engine's paged cache, for the call being
    traced: the engine's cache values, its sizes, where each sequence starts
    in the ragged batch, and the layer index. Step 07's forward hands it its
    keys and values [1, n_head, total_tokens, head_dim] (``_split_heads`` of
    the ragged batch) and lets it attend. A plain object (not a module, not
    a tensor)."""

    def __init__(self, kv: PagedCacheValues, kv_params: KVCacheParams, input_row_offsets: Tensor,
                 layer: int) -> None:
        self.kv, self.kv_params, self.input_row_offsets = kv, kv_params, input_row_offsets
        self.layer = F.constant(layer, DType.uint32, device=CPU())

    @staticmethod
    def _tokens_first(t: Tensor) -> Tensor:
        """[1, n_head, total_tokens, head_dim] -> [total_tokens, n_head, head_dim], the kernels' layout."""
        return F.squeeze(t, 0).transpose(0, 1)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's keys and values after each sequence's cached ones.
        The pages hold them now; what comes back is only what went in (the
        attention reads the pages, not these)."""
        store_k_cache(self.kv, self._tokens_first(k), self.input_row_offsets, self.layer)
        store_v_cache(self.kv, self._tokens_first(v), self.input_row_offsets, self.layer)
        return k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn) -> Tensor:
        """Ragged flash attention over each sequence's pages, the mask causal
        from each sequence's cache length; ``attn`` (the layer's ``_attn``)
        is not called: see the module's docstring. [1, n_head, total_tokens,
        head_dim] back, as ``_attn`` returns, for the layer's ``_merge_heads``."""
        out = flash_attention_ragged(
            self.kv_params, input=self._tokens_first(q), input_row_offsets=self.input_row_offsets,
            kv_collection=self.kv, layer_idx=self.layer, mask_variant=MHAMaskVariant.CAUSAL_MASK,
            scale=1.0 / math.sqrt(self.kv_params.head_dim),
        )
        return F.unsqueeze(out.transpose(0, 1), 0)


class GPT2Ragged(nn.Module):
    """The course's GPT-2 for the engine: tokens of a ragged batch -> each
    sequence's next-token logits [batch, vocab] (float32, as the sampler
    wants), and the logits of the rows ``rows_to_score`` names [rows,
    vocab]: each sequence's last token, or with ``python -m serve --echo``
    every token (the prompt's log-probabilities). The rows are an input of
    the graph, not a build option: the server compiles one graph, with or
    without --echo (serve/model.py's GPT2BatchProcessor picks them).

    ``transformer`` and ``lm_head`` are step 11's own; ``impl`` picks the
    solutions or the learner's steps/.
    ``linear`` makes every Linear layer, as in steps 04-11: nn.Linear, or
    model/layers' FewRowsLinear (serve/model.py asks model/layers for the
    build options' maker: float32 on the CPU, where a decode step of a few
    requests is a few rows)."""

    def __init__(self, config, kv_params: KVCacheParams, linear=nn.Linear, impl: str = "solutions",
                 head_width: int | None = None) -> None:
        super().__init__()
        kit = course(impl)
        # ``head_width``: the LM head's rows (model/gpt2.py's graph_vocab: wider
        # on a GPU), the logits past the vocabulary cut off in ``score``.
        self.vocab_size = config.vocab_size
        lm = kit.GPT2LMHeadModel(replace(config, vocab_size=head_width or config.vocab_size), linear)
        # Step 11's parts, not the wrapper: the names stay transformer.* and lm_head.*.
        self.transformer = lm.transformer
        self.lm_head = lm.lm_head
        self.kv_params = kv_params

    def forward(self, tokens: Tensor, kv: PagedCacheValues, input_row_offsets: Tensor,
                rows_to_score: Tensor) -> tuple[Tensor, Tensor]:
        t = self.transformer
        positions = ragged_positions(input_row_offsets, Tensor.from_graph_value(kv.cache_lengths), tokens.shape[0])
        # Step 05's table, and step 06's gathered at each token's own position:
        # its forward takes one contiguous range, and a ragged step holds one
        # per sequence.
        x = F.unsqueeze(t.wte(tokens) + F.gather(t.wpe.weight, positions, axis=0), 0)
        for i, block in enumerate(t.h):
            x = block(x, PagedCache(kv, self.kv_params, input_row_offsets, i))
        # The rows to score, gathered along the sequence axis as step 11's
        # ``positions`` are, then step 10's ln_f and step 11's head: only
        # these rows pay for the head (the vocabulary's width).
        rows = F.cast(rows_to_score, DType.int64).to(input_row_offsets.device)
        h = F.gather(x, rows, axis=1)
        scored = F.cast(F.squeeze(self.lm_head(t.ln_f(h)), 0)[:, : self.vocab_size], DType.float32)
        return F.gather(scored, last_of_each(rows, input_row_offsets), axis=0), scored  # [batch, vocab], [rows, vocab]


def last_of_each(rows: Tensor, input_row_offsets: Tensor) -> Tensor:
    """[batch]: where each sequence's last token is among ``rows`` (ascending,
    each sequence's last token among them): the count of rows before the
    sequence's end, less one."""
    ends = F.cast(input_row_offsets[1:], DType.int64)
    before = F.sum(F.cast(F.unsqueeze(rows, 0) < F.unsqueeze(ends, 1), DType.int64), axis=-1)
    return F.reshape(before, [-1]) - 1
