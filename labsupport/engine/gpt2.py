"""GPT-2's transformer blocks as the engine runs them: each block's weights (views of the model's own)
and its matrices as the kernels the runner multiplies with (:class:`~labsupport.engine.linear.Linear`,
or :class:`~labsupport.quant.int8.Int8Linear` with ``quantization="int8"``).

A block computes ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))`` (Radford et al., 2019); the
runner (:mod:`labsupport.engine.model_runner`) drives the blocks over the paged cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..quant.int8 import Int8Linear
from .linear import Linear

__all__ = ["GPT2Layer", "activation", "gpt2_layers"]


@dataclass
class GPT2Layer:
    """One transformer block's weights: layer-norm parameters (views of the model's own) and its four
    matrices as :class:`~labsupport.engine.linear.Linear` (GPT-2 Conv1D: ``x @ W + b``)."""

    ln_1: tuple[torch.Tensor, torch.Tensor]
    c_attn: Linear                                  # (E, 3E) + (3E,)
    attn_proj: Linear                               # (E, E) + (E,)
    ln_2: tuple[torch.Tensor, torch.Tensor]
    c_fc: Linear                                    # (E, 4E) + (4E,)
    mlp_proj: Linear                                # (4E, E) + (E,)
    act: Callable[[torch.Tensor], torch.Tensor]
    scale: float


def activation(name: str, module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """GPT-2's "gelu_new" is the tanh approximation of GELU: one fused op instead of the module's five."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return module



def gpt2_layers(model: torch.nn.Module, quantization: str | None = None) -> list[GPT2Layer]:
    """Every block of a ``GPT2LMHeadModel`` as a :class:`GPT2Layer` (attention scale included:
    ``1/√d_head``, divided by the layer number with ``scale_attn_by_inverse_layer_idx``)."""
    cfg = model.config
    head_dim = cfg.n_embd // cfg.n_head
    if quantization == "int8":
        lin = lambda m: Int8Linear(m.weight.detach().t(), m.bias.detach())
    else:
        lin = lambda m: Linear(m.weight.detach(), m.bias.detach())         
    wb = lambda m: (m.weight.detach(), m.bias.detach())                    
    layers = []
    for i, block in enumerate(model.transformer.h):
        scale = 1.0 / math.sqrt(head_dim) if cfg.scale_attn_weights else 1.0
        if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
            scale /= i + 1
        layers.append(GPT2Layer(ln_1=wb(block.ln_1), c_attn=lin(block.attn.c_attn), attn_proj=lin(block.attn.c_proj),
                                ln_2=wb(block.ln_2), c_fc=lin(block.mlp.c_fc), mlp_proj=lin(block.mlp.c_proj),
                                act=activation(cfg.activation_function, block.mlp.act), scale=scale))
    return layers
