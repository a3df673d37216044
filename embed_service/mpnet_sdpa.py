"""MPNet's encoder forward with fused attention (torch scaled_dot_product_attention).

transformers runs MPNet attention eagerly: it materializes the (batch, heads, len, len) score
tensor and passes over it several times per layer (bias, mask, softmax), which on a GPU costs
about as much memory traffic as the matrix products cost compute. Here the relative position
bias and the padding mask are added once per batch into one additive mask, and every layer calls
the fused kernel with it. Weights are the loaded model's own; the result matches the eager
forward (tests compare the two), and the pooler, unused by sentence embeddings, is skipped.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional


def encode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Last hidden states of an `MPNetModel` for a padded batch, in the model's dtype.

    `position_bias`: the relative position bias of this length (`position_bias_for`), made
    beforehand where the forward runs inside a CUDA graph, which cannot make it: some
    transformers releases build it on the CPU."""
    hidden = model.embeddings(input_ids=input_ids)
    encoder = model.encoder
    # Bias depends only on positions: compute it for one row and let the addition broadcast.
    bias = position_bias if position_bias is not None else position_bias_for(model, hidden[:1])
    blocked = (attention_mask[:, None, None, :] == 0).to(hidden.dtype) * torch.finfo(
        hidden.dtype
    ).min
    mask = (bias + blocked).to(hidden.dtype)
    batch, length, width = hidden.shape
    for layer in encoder.layer:
        attn = layer.attention.attn
        heads, head_dim = attn.num_attention_heads, attn.attention_head_size

        def split(x: torch.Tensor, h: int = heads, d: int = head_dim) -> torch.Tensor:
            return x.view(batch, length, h, d).transpose(1, 2)

        context = functional.scaled_dot_product_attention(
            split(attn.q(hidden)), split(attn.k(hidden)), split(attn.v(hidden)), attn_mask=mask
        )
        context = context.transpose(1, 2).reshape(batch, length, width)
        attended = layer.attention.LayerNorm(attn.o(context) + hidden)
        hidden = layer.output(layer.intermediate(attended), attended)
    return hidden  # type: ignore[no-any-return]


def position_bias_for(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The relative position bias for rows of `hidden`'s length, (1, heads, length, length)."""
    bias: torch.Tensor = model.encoder.compute_position_bias(hidden)
    return bias
