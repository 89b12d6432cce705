"""Per-example clipping in one backward pass: book-keeping (Bu et al. 2023) with mixed ghost norms.

    taps = BookKeeping(model)                       # Linear and Conv2d layers, nothing else trainable
    loss_fn(model(x), y, reduction="sum").backward()  # fills taps, not p.grad
    norms = taps.norms()                              # (B,) each example's gradient norm, all layers
    taps.add_clipped(factors)                         # p.summed_grad += Σᵢ factorᵢ · gradᵢ
    taps.close()

Each tapped layer runs through an autograd function that, on the way back, computes only
the gradient of its *input* (what the layers below need) and keeps its activation A and
output gradient G; the summed weight gradient autograd would compute is skipped. From
(A, G) an example's weight gradient is Gᵢᵀ Aᵢ (T positions, a inputs, p outputs). Its norm
comes either from the Gram matrices, ‖Gᵢᵀ Aᵢ‖² = ⟨Aᵢ Aᵢᵀ, Gᵢ Gᵢᵀ⟩, which never forms the
gradient and costs T²(a + p) (ghost norms: Goodfellow 2015, Li et al. 2022, for
convolutions Bu et al. 2022), or by forming it, T·p·a; each layer takes the cheaper (mixed
ghost clipping). The clipped sum Σᵢ cᵢ Gᵢᵀ Aᵢ is then one product, the same cost as the
ordinary weight gradient. Opacus 1.6 has ghost norms for Linear only, and its ghost
clipping runs a second backward pass; this runs one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_input

__all__ = ["BookKeeping", "UnsupportedLayer", "clip_factors"]


class UnsupportedLayer(ValueError):
    """The model has a trainable layer book-keeping cannot clip (use an Opacus grad_sample_mode)."""


@dataclass
class _Record:
    activations: torch.Tensor  # (B, T, a): the layer's input, unfolded for a convolution
    output_grads: torch.Tensor  # (B, T, p): d loss_i / d output, per example
    per_example: torch.Tensor | None = None  # (B, p, a) when the layer formed its gradients
    bias_grads: torch.Tensor | None = None  # (B, p): each example's bias gradient, once computed


class _Tap:
    """One Linear or Conv2d layer: its op, its input gradient, and what the backward left behind."""

    def __init__(self, module: nn.Linear | nn.Conv2d) -> None:
        self.module = module
        self.record: _Record | None = None

    def op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        m = self.module
        if isinstance(m, nn.Conv2d):
            return F.conv2d(x, weight, bias, m.stride, m.padding, m.dilation, m.groups)
        return F.linear(x, weight, bias)

    def input_grad(self, x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        m = self.module
        if isinstance(m, nn.Conv2d):
            return conv2d_input(x.shape, weight, grad, m.stride, m.padding, m.dilation, m.groups)
        return grad @ weight

    def keep(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        m = self.module
        if self.record is not None:
            raise RuntimeError(f"{m} ran twice in one pass (shared weights): bk cannot clip it; use an Opacus mode")
        batch = len(x)
        if isinstance(m, nn.Conv2d):
            activations, grads = _patches(x, m), grad.reshape(batch, grad.shape[1], -1).transpose(1, 2)
        else:
            activations, grads = x.reshape(batch, -1, x.shape[-1]), grad.reshape(batch, -1, grad.shape[-1])
        self.record = _Record(activations, grads)

    def squared_norms(self) -> dict[str, torch.Tensor]:
        """Per parameter tensor, each example's squared gradient norm, (B,)."""
        r = self._record()
        a, g = r.activations, r.output_grads
        positions, width_in, width_out = a.shape[1], a.shape[2], g.shape[2]
        has_bias = self.module.bias is not None
        # (B, p): each example's bias gradient, needed for the bias and, on vectors, for the weight
        bias_grads = g[:, 0] if positions == 1 else g.sum(1) if has_bias else None
        bias = torch.linalg.vector_norm(bias_grads, dim=1).square() if bias_grads is not None else None
        if positions == 1:  # a dense layer on vectors: ‖gᵢ aᵢᵀ‖ = ‖gᵢ‖·‖aᵢ‖, and gᵢ is the bias gradient
            weight = torch.linalg.vector_norm(a[:, 0], dim=1).square() * bias
        elif positions * (width_in + width_out) < width_in * width_out:  # ghost: the Gram matrices are smaller
            weight = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
        else:
            r.per_example = torch.bmm(g.transpose(1, 2), a)  # (B, p, a)
            weight = torch.linalg.vector_norm(r.per_example, dim=(1, 2)).square()
        norms = {"weight": weight}
        if has_bias:
            norms["bias"] = bias
            r.bias_grads = bias_grads
        return norms

    def add_clipped(self, factors: dict[str, torch.Tensor]) -> None:
        """Add Σᵢ cᵢ·gradᵢ to each parameter's ``summed_grad``, then drop the record."""
        r = self._record()
        m = self.module
        c = factors["weight"]
        if r.per_example is not None:
            weight = torch.einsum("b,bpa->pa", c, r.per_example)
        else:  # Σᵢ cᵢ Gᵢᵀ Aᵢ as one product, the factors applied to the narrower of G and A
            a, g = r.activations, r.output_grads
            if a.shape[-1] < g.shape[-1]:
                a = a * c[:, None, None]
            else:
                g = g * c[:, None, None]
            weight = g.reshape(-1, g.shape[-1]).T @ a.reshape(-1, a.shape[-1])
        _accumulate(m.weight, weight.reshape(m.weight.shape))
        if m.bias is not None:
            bias_grads = r.bias_grads if r.bias_grads is not None else r.output_grads.sum(1)
            _accumulate(m.bias, factors["bias"] @ bias_grads)
        self.record = None

    def _record(self) -> _Record:
        if self.record is None:
            raise RuntimeError(f"no backward pass has run through {self.module} since the last step")
        return self.record


def _patches(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """(B, T, C·kh·kw): every output position's receptive field, in the weight's (C, kh, kw) order.
    Strided views of the padded input and one copy; F.unfold (im2col) loops over the batch on the
    CPU and was most of a step's time. Dilated kernels take F.unfold."""
    padding = conv.padding
    if isinstance(padding, str):  # ("same", "valid": refused by _check_supported before any pass)
        raise UnsupportedLayer(f"grad_sample_mode bk needs a numeric padding, got {padding!r}")
    if conv.dilation != (1, 1):
        return F.unfold(x, conv.kernel_size, dilation=conv.dilation, padding=padding,
                        stride=conv.stride).transpose(1, 2)
    (ph, pw), (kh, kw), (sh, sw) = padding, conv.kernel_size, conv.stride
    padded = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    windows = padded.unfold(2, kh, sh).unfold(3, kw, sw)  # (B, C, H', W', kh, kw), a view
    batch, channels, height, width = windows.shape[:4]
    return windows.permute(0, 2, 3, 1, 4, 5).reshape(batch, height * width, channels * kh * kw)


def _accumulate(param: torch.Tensor, value: torch.Tensor) -> None:
    summed = getattr(param, "summed_grad", None)
    # summed_grad: the attribute Opacus' optimisers read, set on the tensor at run time (torch's stubs lack it)
    param.summed_grad = value.detach() if summed is None else summed + value.detach()  # type: ignore[attr-defined]


class _TappedOp(torch.autograd.Function):
    """y = layer(x) on the way forward; on the way back, the input gradient only (when needed),
    and (x, dy) kept for the per-example computation. The weights get no gradient from autograd."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tap: _Tap) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.tap = tap
        return tap.op(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        ctx.tap.keep(x, grad)
        grad_x = ctx.tap.input_grad(x, weight, grad) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def _check_supported(model: nn.Module) -> list[nn.Linear | nn.Conv2d]:
    layers = []
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if type(module) is nn.Linear or (type(module) is nn.Conv2d and module.groups == 1
                                          and module.padding_mode == "zeros" and not isinstance(module.padding, str)):
            layers.append(module)
        else:
            raise UnsupportedLayer(f"grad_sample_mode bk clips Linear and Conv2d layers (zero padding, groups 1) "
                                   f"only; {name or 'the model'} is {type(module).__name__} with trainable "
                                   f"parameters: use an Opacus mode (ghost, hooks)")
    return layers


class BookKeeping:
    """Tap every trainable layer of ``model`` (see the module docstring); ``close`` restores it."""

    def __init__(self, model: nn.Module) -> None:
        self.taps = [_Tap(layer) for layer in _check_supported(model)]
        for tap in self.taps:
            # an instance attribute that shadows the class's forward (close() deletes it); mypy sees a method replaced
            tap.module.forward = self._forward_for(tap)  # type: ignore[method-assign, assignment]

    @staticmethod
    def _forward_for(tap: _Tap) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return _TappedOp.apply(x, tap.module.weight, tap.module.bias, tap)
        return forward

    @property
    def parameters(self) -> list[torch.Tensor]:
        return [p for tap in self.taps for p in (tap.module.weight, tap.module.bias) if p is not None]

    def squared_norms(self) -> list[dict[str, torch.Tensor]]:
        """Per tapped layer and parameter tensor, each example's squared gradient norm."""
        return [tap.squared_norms() for tap in self.taps]

    def add_clipped(self, factors: list[dict[str, torch.Tensor]]) -> None:
        for tap, layer_factors in zip(self.taps, factors):
            tap.add_clipped(layer_factors)

    def close(self) -> None:
        for tap in self.taps:
            if "forward" in vars(tap.module):
                del tap.module.forward
            tap.record = None
        for p in self.parameters:
            if hasattr(p, "summed_grad"):
                del p.summed_grad


def clip_factors(squared: list[dict[str, torch.Tensor]], *, max_grad_norm: float,
                 clipping: str) -> list[dict[str, torch.Tensor]]:
    """min(1, C/‖gᵢ‖) per example: flat (one norm over all parameters) or per_layer (each of the m
    tensors to C/√m, so the whole gradient still has norm ≤ C)."""
    eps = 1e-6  # as Opacus: a zero gradient gets factor C/1e-6, i.e. it is left alone
    if clipping == "flat":
        total = torch.stack([n for layer in squared for n in layer.values()]).sum(0).sqrt()
        factor = (max_grad_norm / (total + eps)).clamp(max=1.0)
        return [{name: factor for name in layer} for layer in squared]
    if clipping == "per_layer":
        per_tensor = max_grad_norm / math.sqrt(sum(len(layer) for layer in squared))
        return [{name: (per_tensor / (n.sqrt() + eps)).clamp(max=1.0) for name, n in layer.items()}
                for layer in squared]
    raise ValueError(f"clipping must be flat or per_layer, got {clipping!r}")
