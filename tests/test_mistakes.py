"""Seeded learner mistakes: each is a small edit of the solution, and each must
fail its step's check with the hint that names it."""

from __future__ import annotations

import pytest
from conftest import check_file, mutate

# (step, mistake, [(old, new), ...], text the failing message or hint must contain)
MISTAKES = [
    # step 01: the config
    ("01", "default width of gpt2-medium", [("n_embd: int = 768", "n_embd: int = 1024")], "with your defaults raised"),
    ("01", "default width of gpt2-xl's head count", [("n_head: int = 12", "n_head: int = 16")], "GPT2Config().n_head is 16"),
    ("01", "context of 512", [("n_positions: int = 1024", "n_positions: int = 512")], "n_positions"),
    ("01", "BERT-like eps", [("layer_norm_epsilon: float = 1e-5", "layer_norm_epsilon: float = 1e-6")], "layer_norm_epsilon"),
    ("01", "no divisibility validation",
     [("if self.n_embd % self.n_head != 0:", "if False:")], "n_embd % n_head == 0"),
    ("01", "zero sizes accepted", [("value <= 0", "value < 0")], "every size must be > 0"),
    ("01", "divisibility tested before the sizes",
     [("        for name in (\"vocab_size\",",
       "        if self.n_embd % self.n_head != 0:\n            raise ValueError(\"n_embd % n_head\")\n"
       "        for name in (\"vocab_size\",")], "with n_head = 0 the remainder divides by zero"),
    ("01", "a size of 1 refused", [("value <= 0", "value <= 1")], "a size of 1 is valid"),
    ("01", "head_dim with true division", [("return self.n_embd // self.n_head", "return self.n_embd / self.n_head")], "use //"),
    ("01", "wrong gpt2-medium heads",
     [('"gpt2-medium": dict(n_layer=24, n_head=16', '"gpt2-medium": dict(n_layer=24, n_head=12')], "gpt2-medium"),
    # step 02: the causal mask
    ("02", "mask hides the diagonal", [("hidden = F.greater(", "hidden = F.greater_equal(")], "use >, not >="),
    ("02", "mask off by the offset", [("Tensor.arange(past_len, total,", "Tensor.arange(0, seq_len,")], "add past_len"),
    ("02", "mask inverted", [("F.where(hidden, minus_inf, zero)", "F.where(hidden, zero, minus_inf)")], "not the other way round"),
    ("02", "finite mask values", [('float("-inf")', "-1.0")], "float('-inf')"),
    ("02", "mask in float64", [("Tensor.full([], float(\"-inf\"), dtype=dtype", "Tensor.full([], float(\"-inf\"), dtype=DType.float64"),
                               ("Tensor.zeros([], dtype=dtype", "Tensor.zeros([], dtype=DType.float64")], "float32"),
    ("02", "default past_len of 1", [("past_len: DimLike = 0,", "past_len: DimLike = 1,")], "past_len defaults to 0"),
    ("02", "lengths used as ints (numpy mask)",
     [("    total = past_len + seq_len\n",
       "    import numpy as np\n    return Tensor.from_dlpack(np.triu(np.full((int(seq_len), int(past_len) + int(seq_len)), "
       "-np.inf, np.float32), k=int(past_len) + 1))\n    total = past_len + seq_len\n")], "symbolic dimensions"),
    ("02", "both where branches plain floats",
     [("F.where(hidden, minus_inf, zero)", 'F.where(hidden, float("-inf"), 0.0)')], "at least one a float32 tensor"),
    # step 03: layer norm
    ("03", "variance with Bessel's correction",
     [("var = (centered * centered).mean(axis=-1)",
       "var = (centered * centered).sum(axis=-1) / (int(x.shape[-1]) - 1)")], "Bessel"),
    ("03", "variance divided by a shape's dim (an int64)",
     [("var = (centered * centered).mean(axis=-1)",
       "var = (centered * centered).sum(axis=-1) / (x.shape[-1] - 1)")], "int(x.shape[-1])"),
    ("03", "layer norm without eps", [("F.rsqrt(var + self.eps)", "F.rsqrt(var)")], "add eps = 1e-5"),
    ("03", "wrong eps value", [("eps: float = 1e-5", "eps: float = 1e-6")], "1e-5"),
    ("03", "BERT's eps value", [("eps: float = 1e-5", "eps: float = 1e-12")], "1e-12"),
    ("03", "eps outside the square root", [("F.rsqrt(var + self.eps)", "(1.0 / (F.sqrt(var) + self.eps))")], "inside the square root"),
    ("03", "eps argument ignored", [("self.eps = eps", "self.eps = 1e-5")], "use the eps you are given"),
    ("03", "bias forgotten", [("* self.weight + self.bias", "* self.weight")], "bias"),
    ("03", "scale starts at zero", [("self.weight = Tensor.ones([dim])", "self.weight = Tensor.zeros([dim])")], "weight is not all 1"),
    ("03", "parameter named as in PyTorch docs",
     [("self.bias = Tensor.zeros([dim])", "self.beta = Tensor.zeros([dim])"), ("+ self.bias", "+ self.beta")], "`bias`"),
    # step 04: the MLP
    ("04", "exact GELU", [("return 0.5 * x * (1.0 + F.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))", "return F.gelu(x)")], "not the exact erf GELU"),
    ("04", "ReLU", [("return 0.5 * x * (1.0 + F.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))", "return F.relu(x)")], "ReLU"),
    ("04", "gelu constant off by 10", [("(x + 0.044715 * x * x * x)", "(x + 0.44715 * x * x * x)")], "0.044715"),
    ("04", "hidden width 3 * n_embd",
     [("linear(config.n_embd, 4 * config.n_embd)", "linear(config.n_embd, 3 * config.n_embd)"),
      ("linear(4 * config.n_embd, config.n_embd)", "linear(3 * config.n_embd, config.n_embd)")], "4 * n_embd"),
    ("04", "no activation", [("self.c_proj(gelu_new(self.c_fc(x)))", "self.c_proj(self.c_fc(x))")], "apply gelu_new between"),
    # step 05: token embeddings
    ("05", "scaled by sqrt(n_embd)",
     [("return F.gather(self.weight, ids, axis=0)", "return F.gather(self.weight, ids, axis=0) * float(int(self.weight.shape[1]) ** 0.5)")],
     "does not scale"),
    ("05", "table transposed",
     [("random.normal([vocab_size, n_embd])", "random.normal([n_embd, vocab_size])"),
      ("F.gather(self.weight, ids, axis=0)", "F.gather(self.weight, ids, axis=1).transpose(1, 2)")], "[vocab_size, n_embd]"),
    ("05", "ids shifted by one", [("F.gather(self.weight, ids, axis=0)", "F.gather(self.weight, ids - 1, axis=0)")], "no shift"),
    # step 06: position embeddings
    ("06", "positions start at 1",
     [("past_len, past_len + seq_len, dtype", "past_len + 1, past_len + seq_len + 1, dtype")], "not 1"),
    ("06", "default past_len of 1",
     [("def forward(self, seq_len: DimLike, past_len: DimLike = 0)", "def forward(self, seq_len: DimLike, past_len: DimLike = 1)")],
     "past_len defaults to 0"),
    ("06", "offset ignored", [("past_len, past_len + seq_len, dtype", "0, seq_len, dtype")], "add past_len"),
    ("06", "table transposed",
     [("random.normal([n_positions, n_embd])", "random.normal([n_embd, n_positions])")], "[n_positions, n_embd]"),
    # step 07: attention (every mistake a learner is likely to make there, each with its own hint)
    ("07", "mask without past_len", [("causal_mask(seq, k.shape[2] - seq, dtype", "causal_mask(seq, dtype")],
     "causal_mask(seq, k.shape[2] - seq, dtype=q.dtype, device=q.device), where seq = q.shape[2] and k holds"),
    ("07", "mask built from self.length", [("causal_mask(seq, k.shape[2] - seq, dtype", "causal_mask(seq, self.length, dtype")],
     "not self.length, which after update counts the new rows too"),
    ("07", "mask not in q's dtype", [("causal_mask(seq, k.shape[2] - seq, dtype=q.dtype, device=q.device)",
                                      "causal_mask(seq, k.shape[2] - seq)")], "make the mask in q's dtype"),
    ("07", "no 1/sqrt(head_dim) scale", [(" * (1.0 / math.sqrt(self.head_dim))", "")], "scale the scores by 1 / sqrt(head_dim)"),
    ("07", "scaled by sqrt(n_embd)", [("math.sqrt(self.head_dim)", "math.sqrt(self.n_embd)")], "not 1 / sqrt(n_embd)"),
    ("07", "no causal mask", [("F.softmax(scores + mask, axis=-1)", "F.softmax(scores, axis=-1)")], "add the causal mask"),
    ("07", "mask after softmax", [("F.softmax(scores + mask, axis=-1)", "F.softmax(scores, axis=-1) + mask")], "*before* the softmax"),
    ("07", "heads split without transpose",
     [("return x.reshape([batch, seq, self.n_head, self.head_dim]).transpose(1, 2)",
       "return x.reshape([batch, self.n_head, seq, self.head_dim])")], "a reshape to [b, h, t, d] alone"),
    ("07", "heads merged in the wrong order",
     [("return x.transpose(1, 2).reshape([batch, seq, self.n_embd])", "return x.reshape([batch, seq, self.n_embd])")],
     "merge heads with transpose(1, 2) first"),
    ("07", "Q/K/V split in the wrong order", [("q, k, v = F.split(", "k, q, v = F.split(")], "Q, K, V in that order"),
    ("07", "softmax over the wrong axis", [("F.softmax(scores + mask, axis=-1)", "F.softmax(scores + mask, axis=-2)")], "softmax over the last axis"),
    ("07", "cache concatenated after the new keys",
     [("F.concat([self.keys, k], axis=2)", "F.concat([k, self.keys], axis=2)"),
      ("F.concat([self.values, v], axis=2)", "F.concat([v, self.values], axis=2)")], "cached keys followed by the new ones"),
    ("07", "update does not keep the result", [("        self.keys, self.values = k, v\n        return k, v\n", "        return k, v\n")],
     "keep the result: self.keys, self.values = k, v"),
    ("07", "update keeps only this call's keys",
     [("        if self.keys is not None:\n            k = F.concat(", "        new = k, v\n        if self.keys is not None:\n            k = F.concat("),
      ("        self.keys, self.values = k, v\n        return k, v\n", "        self.keys, self.values = new\n        return k, v\n")],
     "not only this call's"),
    ("07", "length always 0", [("return 0 if self.keys is None else self.keys.shape[2]", "return 0")],
     "then self.keys.shape[2]"),
    ("07", "forward still returns the keys and values",
     [("return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))",
       "return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn))), k, v")],
     "forward returns the output alone now; the keys and values stay in the cache"),
    ("07", "forward without c_proj",
     [("return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))",
       "return self._merge_heads(cache.attend(q, k, v, self._attn))")], "project the merged heads with c_proj"),
    ("07", "c_proj on the heads unmerged",
     [("return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))",
       "return self.c_proj(cache.attend(q, k, v, self._attn))")], "merge the heads first"),
    ("07", "forward returns the heads unmerged",
     [("return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))",
       "return cache.attend(q, k, v, self._attn)")], "merge the heads before c_proj"),
    ("07", "forward masks without the cache",
     [("return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))",
       "seq = x.shape[1]\n        mask = causal_mask(seq, k.shape[2] - seq, dtype=x.dtype, device=x.device)\n"
       "        return self.c_proj(self._merge_heads(self._attn(q, k, v, mask)))")],
     "expected cache.update, then cache.attend"),
    # step 08: residual wiring
    ("08", "post-LN", [("return x + sublayer(norm(x))", "return norm(x + sublayer(x))")], "post-LN"),
    ("08", "no residual", [("return x + sublayer(norm(x))", "return sublayer(norm(x))")], "add the residual"),
    ("08", "norm on the output", [("return x + sublayer(norm(x))", "return x + norm(sublayer(x))")], "not its output"),
    ("08", "residual adds the normalised x", [("return x + sublayer(norm(x))", "return norm(x) + sublayer(norm(x))")], "*raw* x"),
    # step 09: the block
    ("09", "norms swapped",
     [("self.attn(self.ln_1(x), cache)", "self.attn(self.ln_2(x), cache)"),
      ("pre_norm_residual(x, self.ln_2, self.mlp)", "pre_norm_residual(x, self.ln_1, self.mlp)")], "they are swapped"),
    ("09", "no attention residual", [("x = x + self.attn(self.ln_1(x), cache)", "x = self.attn(self.ln_1(x), cache)")], "add the attention's output"),
    ("09", "no MLP residual", [("return pre_norm_residual(x, self.ln_2, self.mlp)", "return self.mlp(self.ln_2(x))")], "add the MLP's output"),
    ("09", "post-LN block",
     [("x = x + self.attn(self.ln_1(x), cache)", "x = self.ln_1(x + self.attn(x, cache))"),
      ("return pre_norm_residual(x, self.ln_2, self.mlp)", "return self.ln_2(x + self.mlp(x))")], "GPT-2 is pre-LN"),
    ("09", "cache not passed on", [("self.attn(self.ln_1(x), cache)", "self.attn(self.ln_1(x))")], "pass the cache on to the attention"),
    ("09", "MLP named ffn", [("self.mlp = GPT2MLP(config, linear)", "self.ffn = GPT2MLP(config, linear)"), ("self.ln_2, self.mlp)", "self.ln_2, self.ffn)")],
     "ln_1, attn, ln_2, mlp"),
    ("09", "norms with LayerNorm's default eps",
     [(f"self.{n} = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)", f"self.{n} = LayerNorm(config.n_embd)")
      for n in ("ln_1", "ln_2")],
     "ln_1 and ln_2 with eps=config.layer_norm_epsilon"),
    # step 10: the model
    ("10", "ln_f with LayerNorm's default eps",
     [("self.ln_f = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)", "self.ln_f = LayerNorm(config.n_embd)")],
     "build ln_f with eps=config.layer_norm_epsilon"),
    ("10", "no final layer norm", [("return self.ln_f(x)", "return x")], "ln_f"),
    ("10", "no position embeddings", [("x = self.wte(ids) + self.wpe(seq, past_len)", "x = self.wte(ids)")], "add the position embeddings"),
    ("10", "positions not offset by the cache", [("self.wpe(seq, past_len)", "self.wpe(seq, 0)")], "not 0"),
    ("10", "every block gets the first cache", [("caches[i] if caches", "caches[0] if caches")], "give block i its own cache"),
    ("10", "blocks not named h",
     [("self.h = nn.ModuleList", "self.blocks = nn.ModuleList"), ("enumerate(self.h)", "enumerate(self.blocks)")], "h (an nn.ModuleList"),
    # step 11: the LM head
    ("11", "head reads wte directly", [("return self.lm_head(hidden)", "return hidden @ self.transformer.wte.weight.T")],
     "not wte directly"),
    ("11", "head with a bias", [("linear(config.n_embd, config.vocab_size, bias=False)", "linear(config.n_embd, config.vocab_size)")],
     "lm_head"),
    ("11", "positions gathered over the batch", [("hidden = F.gather(hidden, positions, axis=1)", "hidden = F.gather(hidden, positions, axis=0)")],
     "forward(ids, None, positions="),
    ("11", "cache not passed on", [("self.transformer(ids, caches)", "self.transformer(ids)")],
     "pass caches on"),
    # step 12: generation
    ("12", "temperature multiplied", [("logits.astype(np.float64) / temperature", "logits.astype(np.float64) * temperature")], "you multiplied"),
    ("12", "softmax adds the max", [("np.exp(scaled - scaled.max())", "np.exp(scaled + scaled.max())")],
     "subtract the largest logit"),
    ("12", "greedy picks the lowest", [("return int(np.argmax(logits))", "return int(np.argmin(logits))")], "argmax"),
    ("12", "tokens not fed back", [("        ids.append(token)\n", "")], "feed each new token back in"),
    ("12", "prompt returned with the new tokens", [("    return new\n", "    return ids\n")], "not the prompt in front of them"),
    ("12", "eos ignored", [("        if token == eos_token:\n            break\n", "")], "stop right after producing eos_token"),
    ("12", "fresh rng each token",
     [("sample_next_token(next_logits(ids), temperature, rng)", "sample_next_token(next_logits(ids), temperature, np.random.default_rng())")],
     "the same seed gave different text"),
    # bonus step 13: numpy multi-head attention
    ("13", "numpy: no scale", [(" / np.sqrt(d_h), axis=-1)", ", axis=-1)")], "divide the scores by sqrt(d_h)"),
    ("13", "numpy: scaled by sqrt(D)", [("/ np.sqrt(d_h), axis=-1)", "/ np.sqrt(D), axis=-1)")], "not 1 / sqrt(D)"),
    ("13", "numpy: softmax over queries", [("np.sqrt(d_h), axis=-1)", "np.sqrt(d_h), axis=-2)")], "softmax over the last axis"),
    ("13", "numpy: heads split without transpose",
     [("return x.reshape(x.shape[0], n_heads, d_h).transpose(1, 0, 2)", "return x.reshape(n_heads, x.shape[0], d_h)")],
     "mixes positions"),
    ("13", "numpy: heads merged without transpose",
     [("heads.transpose(1, 0, 2).reshape(Q.shape[0], D)", "heads.reshape(Q.shape[0], D)")], "merge with transpose"),
    ("13", "numpy: unstable softmax", [("np.exp(x - x.max(axis=axis, keepdims=True))", "np.exp(x)")], "subtract each row's max"),
    ("13", "numpy: no divisibility check", [("if D % n_heads != 0:", "if False:")], "name both numbers"),
    # bonus step 14: post-LN block
    ("14", "post-LN written as pre-LN",
     [("q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)",
       "h = normalize(x)\n    q, k, v = split(h @ w_q), split(h @ w_k), split(h @ w_v)"),
      ("return normalize(x + heads @ w_o)", "return x + heads @ w_o")], "GPT-2's pre-LN"),
    ("14", "post-LN without residual", [("normalize(x + heads @ w_o)", "normalize(heads @ w_o)")], "add x before normalizing"),
    ("14", "post-LN weights transposed",
     [("split(x @ w_q), split(x @ w_k), split(x @ w_v)", "split(x @ w_q.T), split(x @ w_k.T), split(x @ w_v.T)"),
      ("heads @ w_o", "heads @ w_o.T")], "not x @ w.T"),
    ("14", "post-LN Bessel variance",
     [("var = (centered * centered).mean(axis=-1)", "var = (centered * centered).sum(axis=-1) / (int(x.shape[-1]) - 1)")],
     "population variance"),
    ("14", "post-LN eps subtracted", [("F.rsqrt(var + eps)", "F.rsqrt(var - eps)")], "not subtract it"),
    ("14", "post-LN scaled by d_model", [("math.sqrt(d_h)", "math.sqrt(d_model)")], "not 1 / sqrt(d_model)"),
    # bonus step 15: attention weights
    ("15", "weights are the raw scores",
     [("self.kept.weights = weights\n", "self.kept.weights = q @ k.transpose(-1, -2)\n")],
     "not the raw scores"),
    ("15", "weights always returned", [("return (out, self.kept.weights) if return_weights else out", "return out, self.kept.weights")],
     "return the weights only when"),
    ("15", "weights never kept", [("self.kept.weights = weights\n", "")], "mutant_15.py:"),
    # bonus step 16: rotary attention
    ("16", "rotate_half signs swapped", [("F.concat([-second, first], axis=-1)", "F.concat([second, -first], axis=-1)")],
     "negate the *second* half"),
    ("16", "rope on values too",
     [("q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)",
       "q, k, v = apply_rope(q, cos, sin), apply_rope(k, cos, sin), apply_rope(v, cos, sin)")], "values carry no position"),
    ("16", "rope on queries only", [("q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)", "q = apply_rope(q, cos, sin)")],
     "rotate both q and k"),
    ("16", "positions ignored",
     [("angles = positions.cast(DType.float32).reshape([positions.shape[0], 1])",
       "angles = Tensor.arange(0, positions.shape[0], dtype=DType.float32, device=positions.device).reshape([positions.shape[0], 1])")],
     "the angles start at 0"),
    ("16", "rope without causal mask",
     [("F.softmax(scores + causal_mask(seq, 0, dtype=x.dtype, device=x.device), axis=-1)", "F.softmax(scores, axis=-1)")],
     "add the causal mask"),
]


# Each test is named by its step and mistake: `-k 07` runs step 07's.
@pytest.mark.parametrize("step, mistake, edits, expected", MISTAKES, ids=[f"{m[0]} {m[1]}" for m in MISTAKES])
def test_seeded_mistake_fails_with_its_hint(step, mistake, edits, expected, tmp_path):
    outcomes = check_file(step, mutate(step, tmp_path, edits), stop_at_failure=True)
    failures = [o for o in outcomes if not o.passed]
    assert failures, f"{mistake}: every check passed"
    first = failures[0]
    assert expected in first.message + " " + first.hint, (
        f"{mistake}: first failure was {first.name!r}: {first.message} / hint: {first.hint}"
    )


def test_a_shape_error_keeps_maxs_reason(tmp_path):
    """MAX puts why an op failed after its "Diagnostics:" line, below the
    inputs; the report keeps both inputs and that reason, with a shape hint."""
    path = mutate("07", tmp_path, [("scores = (q @ k.transpose(-1, -2))", "scores = (q @ k)")])
    failure = next(o for o in check_file("07", path, stop_at_failure=True) if not o.passed)
    print(failure.message, failure.hint, sep="\n")
    assert "MatmulOp" in failure.message
    assert "input_x: float32 [2, 4, 6, 12]" in failure.message and "input_y:" in failure.message
    assert "why: Matrix multiplication input lhs" in failure.message
    assert "mutant_07.py:" in failure.message and "q @ k" in failure.message
    assert "k.transpose(-1, -2)" in failure.hint
