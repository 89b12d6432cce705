"""Per-example clipping in one backward pass: book-keeping (Bu et al. 2023) with mixed ghost norms.

    taps = BookKeeping(model)                       # Linear and Conv2d layers, nothing else trainable
    loss_fn(model(x), y, reduction="sum").backward()  # fills taps, not p.grad
    squared = taps.squared_norms()                    # per layer and tensor, (B,): each example's ‖grad‖²
    factors = clip_factors(squared, max_grad_norm=C, clipping="flat")
    taps.add_clipped(factors)                         # p.summed_grad += Σᵢ factorᵢ · gradᵢ
    taps.close()

Each tapped layer runs through an autograd function that, on the way back, computes only
the gradient of its *input* (what the layers below need) and keeps its input A and output
gradient G; the summed weight gradient autograd would compute is skipped. An example's weight
gradient is Gᵢᵀ Aᵢ (T positions, a inputs, p outputs; for a convolution Aᵢ are its im2col
patches, a = C·kh·kw). Its norm comes either from the Gram matrices, ‖Gᵢᵀ Aᵢ‖² = ⟨Aᵢ Aᵢᵀ, Gᵢ Gᵢᵀ⟩,
which never forms the gradient (ghost norms: Goodfellow 2015, Li et al. 2022, for convolutions
Bu et al. 2022), or by forming it, T·p·a; each layer takes the cheaper (mixed ghost clipping).
A convolution keeps its input as it came and never forms the patches for a ghost norm: Aᵢ Aᵢᵀ
is gathered from the Gram matrix of its input positions, and the clipped sum Σᵢ cᵢ Gᵢᵀ Aᵢ is the
convolution's own weight-gradient kernel run on the scaled output gradients cᵢ Gᵢ, the cost of
the ordinary weight gradient; only a layer whose gradients are cheaper to form than its Gram
matrices (many positions, few weights, as a first layer on raw pixels) copies out its patches.
Opacus 1.6 has ghost norms for Linear only, and its ghost clipping runs a second backward pass;
this runs one.

A first layer whose input is a fixed function of the record (the model starts with layers that hold
no trainable weights and treat each record alone, as GroupNorm on ScatterNet features) has the same
Aᵢ Aᵢᵀ at every step: given how many records there are (``records``) and, per batch, which ones
(``with taps.batch(positions)``), it is computed at a record's first step and read back after.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight
from torch.nn.modules import module as torch_module

from privpipe.dpsgd.layers import UnsupportedLayer, refuse_batch_mixing

__all__ = ["BookKeeping", "UnsupportedLayer", "clip_factors"]

# torch leaves these unannotated (torch.nn.grad) or Any (torch.linalg, torch.ops): each returns one tensor, but
# convolution_backward three (the input's, the weight's and the bias's gradient, None where not asked for)
_convolution_backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = \
    torch.ops.aten.convolution_backward
_conv2d_weight: Callable[..., torch.Tensor] = conv2d_weight
_vector_norm: Callable[..., torch.Tensor] = torch.linalg.vector_norm


@dataclass
class _Record:
    activations: torch.Tensor  # Linear: (B, T, a), its input; Conv2d: its input as it came, (B, C, H, W)
    output_grads: torch.Tensor  # Linear: (B, T, p); Conv2d: (B, p, H', W'): d loss_i / d output, per example
    per_example: torch.Tensor | None = None  # (B, p, a) when the layer formed its gradients
    bias_grads: torch.Tensor | None = None  # (B, p): each example's bias gradient, once computed
    channels_last: bool = False  # per_example's inputs in (kh, kw, C) order, not the weight's (C, kh, kw)


# The cost model that picks a convolution's norm, in multiply-adds per example: an element copied into the
# patches (a strided gather, ~3 ns on one core) and one gathered from the Gram matrices (~1 ns) weigh as
# much as this many multiply-adds of a batched matrix product (~0.15 ns), as measured on a 2-core x86 host
_COPY, _GATHER = 20.0, 8.0

#: layers that hold no trainable weight and map each record alone, the same way at every step: in front of a
#: model's first tapped layer they leave its input a fixed function of the record (Dropout, RReLU and any type
#: not named here are not assumed to)
_FIXED_PER_RECORD = (nn.Flatten, nn.Unflatten, nn.Identity, nn.GroupNorm, nn.LayerNorm, nn.Tanh, nn.ReLU,
                     nn.Sigmoid, nn.MaxPool2d, nn.AvgPool2d, nn.ZeroPad2d)


class _GramCache:
    """Each record's patch Gram matrix (its T(T + 1)/2 pairs) for a layer whose input depends on the record
    alone, by the record's position in the training set: computed at its first batch, read back after."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.grams: torch.Tensor | None = None  # (records, T(T + 1)/2), allocated at the first batch
        self.known: torch.Tensor | None = None  # (records,) bool

    def grams_of(self, positions: torch.Tensor, x: torch.Tensor,
                 compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """(B, T(T + 1)/2) for the records at ``positions`` whose layer input is ``x``."""
        if self.grams is None or self.known is None:
            fresh = compute(x)
            self.grams = fresh.new_empty((self.records, fresh.shape[1]))
            self.known = torch.zeros(self.records, dtype=torch.bool, device=fresh.device)
            self.grams[positions], self.known[positions] = fresh, True
            return fresh
        positions = positions.to(self.known.device)
        missing = (~self.known[positions]).nonzero().reshape(-1)
        if len(missing) == len(positions):
            fresh = compute(x)
        elif len(missing):
            fresh = self.grams.index_select(0, positions)
            fresh[missing] = compute(x[missing])
        else:
            return self.grams.index_select(0, positions)
        self.grams[positions[missing]], self.known[positions[missing]] = fresh[missing], True
        return fresh


class _Tap:
    """One Linear or Conv2d layer: its op, its input gradient, and what the backward left behind."""

    def __init__(self, module: nn.Linear | nn.Conv2d, scratch: _Scratch | None = None) -> None:
        self.module = module
        self.record: _Record | None = None
        self.scratch = scratch or _Scratch()  # where its patches are copied (BookKeeping shares one among its layers)
        # its patch Gram matrices by record, where its input is a fixed function of the record
        self.cache: _GramCache | None = None
        self.positions: torch.Tensor | None = None  # the batch's records, within ``BookKeeping.batch``
        # the Gram matrices' gather, per shape: key, device, positions of each stride class, pairs
        self._pairs: tuple[tuple[int, ...], torch.device, list[torch.Tensor], torch.Tensor] | None = None
        self._upper: tuple[tuple[int, torch.device, torch.dtype], torch.Tensor, torch.Tensor] | None = None

    def op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        m = self.module
        if isinstance(m, nn.Conv2d):
            return F.conv2d(x, weight, bias, m.stride, m.padding, m.dilation, m.groups)
        return F.linear(x, weight, bias)

    def input_grad(self, x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        m = self.module
        if isinstance(m, nn.Conv2d):
            # from x itself, not torch.nn.grad.conv2d_input's stand-in of x's shape: oneDNN then takes x's memory
            # order, and channels last ran 3× faster (4 against 12 ms on the MNIST CNN's second layer, lot 512)
            grad_x, _, _ = _convolution_backward(grad, x, weight, None, m.stride, m.padding, m.dilation, False,
                                                 [0, 0], m.groups, [True, False, False])
            return grad_x
        return grad @ weight

    def keep(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        m = self.module
        if self.record is not None:
            raise RuntimeError(f"{m} ran twice in one pass (shared weights): bk cannot clip it; use an Opacus mode")
        if isinstance(m, nn.Conv2d):  # kept as they are: the patches are formed only where a norm needs them
            self.record = _Record(x, grad)
        else:
            batch = len(x)
            self.record = _Record(x.reshape(batch, -1, x.shape[-1]), grad.reshape(batch, -1, grad.shape[-1]))

    def squared_norms(self) -> dict[str, torch.Tensor]:
        """Per parameter tensor, each example's squared gradient norm, (B,)."""
        r = self._record()
        m = self.module
        # (B, p): each example's bias gradient, needed for the bias and, on vectors, for the weight
        on_vectors = isinstance(m, nn.Linear) and r.output_grads.shape[1] == 1
        bias_grads = self._bias_grads(r) if m.bias is not None or on_vectors else None
        bias = _vector_norm(bias_grads, dim=1).square() if bias_grads is not None else None
        norms = {"weight": self._conv_norms(r) if isinstance(m, nn.Conv2d) else self._linear_norms(r, bias)}
        if bias is not None and m.bias is not None:
            norms["bias"] = bias
            r.bias_grads = bias_grads
        return norms

    def _bias_grads(self, r: _Record) -> torch.Tensor:
        """(B, p): each example's output gradient summed over the layer's positions."""
        g = r.output_grads
        if isinstance(self.module, nn.Conv2d):
            return g.reshape(*g.shape[:2], -1).sum(2)
        return g[:, 0] if g.shape[1] == 1 else g.sum(1)

    def _linear_norms(self, r: _Record, bias: torch.Tensor | None) -> torch.Tensor:
        a, g = r.activations, r.output_grads
        positions, width_in, width_out = a.shape[1], a.shape[2], g.shape[2]
        if positions == 1 and bias is not None:  # on vectors: ‖gᵢ aᵢᵀ‖ = ‖gᵢ‖·‖aᵢ‖, gᵢ the bias gradient
            return _vector_norm(a[:, 0], dim=1).square() * bias
        if positions * (width_in + width_out) < width_in * width_out:  # ghost: the Gram matrices are smaller
            return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
        r.per_example = torch.bmm(g.transpose(1, 2), a)  # (B, p, a)
        return _vector_norm(r.per_example, dim=(1, 2)).square()

    def norm_strategy(self, input_shape: Sequence[int], output_shape: Sequence[int]) -> str:
        """How a Conv2d layer's per-example norms are computed, the cheaper of (per example, in
        multiply-adds; T output positions, C·K = a inputs per position, p outputs):
        ``gram``, the ghost norm ⟨AᵢAᵢᵀ, GᵢGᵢᵀ⟩ with AᵢAᵢᵀ gathered from the input's own Gram matrices
        (about (HW)²·C/(sh·sw) + T²·(K + p), no patches; the clipped sum is then the convolution's
        weight-gradient kernel, T·a·p) or ``per_example``, the gradients Gᵢᵀ Aᵢ from the patches (T·a
        copied, T·a·p; the clipped sum is then a weighted sum of them, a·p)."""
        m = self.module
        assert isinstance(m, nn.Conv2d)
        _, channels, height, width = input_shape
        outputs, positions = output_shape[1], output_shape[2] * output_shape[3]
        (sh, sw), kernel = m.stride, m.kernel_size[0] * m.kernel_size[1]
        inputs = channels * kernel
        class_grams = channels * sum(len(range(i, height, sh)) ** 2 for i in range(sh)) \
            * sum(len(range(j, width, sw)) ** 2 for j in range(sw))
        gram = class_grams + positions ** 2 * (_GATHER * kernel + outputs) \
            + positions * inputs * outputs
        per_example = positions * inputs * (_COPY + outputs) + inputs * outputs
        return "gram" if gram < per_example else "per_example"

    def _conv_norms(self, r: _Record) -> torch.Tensor:
        m = self.module
        assert isinstance(m, nn.Conv2d)
        x, g = r.activations, r.output_grads
        g = g.reshape(*g.shape[:2], -1)  # (B, p, T)
        if self.norm_strategy(x.shape, r.output_grads.shape) == "gram":
            # ⟨AᵢAᵢᵀ, GᵢGᵢᵀ⟩ over the pairs t ≤ s, those off the diagonal counted twice (both are symmetric)
            patch_gram = self._patch_grams(x, r.output_grads.shape)  # (B, T(T + 1)/2)
            pairs, weights = self._triangle(g.shape[2], g.device, g.dtype)
            grad_gram = torch.bmm(g.transpose(1, 2), g).reshape(len(g), -1).index_select(1, pairs)
            return (patch_gram * grad_gram) @ weights
        patches, r.channels_last = _patches(x, m, self.scratch)
        r.per_example = torch.bmm(g, patches)  # (B, p, a)
        return _vector_norm(r.per_example, dim=(1, 2)).square()

    def _patch_grams(self, x: torch.Tensor, output_shape: torch.Size) -> torch.Tensor:
        """``_patch_gram``, read from the cache for the records it holds (where the layer has one and the batch
        named its records)."""
        if self.cache is None or self.positions is None:
            return self._patch_gram(x, output_shape)
        if len(self.positions) != len(x):
            raise RuntimeError(f"{self.module}: the batch names {len(self.positions)} records but holds {len(x)}")
        pairs = output_shape[2] * output_shape[3] * (output_shape[2] * output_shape[3] + 1) // 2
        if pairs > x[0].numel():  # kept only where a record's entry is no larger than its input, which the set holds
            self.cache = None
            return self._patch_gram(x, output_shape)
        return self.cache.grams_of(self.positions, x, lambda part: self._patch_gram(part, output_shape))

    def _patch_gram(self, x: torch.Tensor, output_shape: torch.Size) -> torch.Tensor:
        """(B, T(T + 1)/2): ⟨patch t, patch s⟩ for t ≤ s of every example, from its input's Gram matrices
        over positions: Σₖ X[pₜₖ]·X[pₛₖ] over the kernel's K offsets k, where pₜₖ is the input position
        offset k of output position t reads (or a zero where it reads the padding). Never forms the
        patches. pₜₖ − pₛₖ is a multiple of the stride, so only positions in one class modulo the stride
        (row and column) ever meet: one Gram matrix per class, ~1/(sh·sw) of the whole one's work."""
        m = self.module
        assert isinstance(m, nn.Conv2d)
        batch, channels, height, width = x.shape
        kernel = m.kernel_size[0] * m.kernel_size[1]
        classes, pairs = self._gram_pairs(x.shape, output_shape, x.device)
        flat = x.reshape(batch * channels, height * width)
        # one gather per class, to a contiguous block (strided slices cost more); index_select runs on one
        # thread, gather on all of torch's: the faster on one thread, and the slower (3.3 against 1.7 ms
        # on the ScatterNet CNN's first layer) on two
        gather = torch.get_num_threads() > 1
        grams = []
        for positions in classes:
            part = flat if len(classes) == 1 else \
                torch.gather(flat, 1, positions.expand(len(flat), -1)) if gather else flat.index_select(1, positions)
            part = part.reshape(batch, channels, -1)
            grams.append(torch.bmm(part.transpose(1, 2), part).reshape(batch, -1))
        grams.append(x.new_zeros(batch, 1))  # what a read of the padding finds
        # index_select, not [:, pairs]: advanced indexing is ~6× slower here
        return torch.cat(grams, 1).index_select(1, pairs).reshape(batch, kernel, -1).sum(1)

    def _gram_pairs(self, input_shape: torch.Size, output_shape: torch.Size,
                    device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The input positions of each class modulo the stride, and (K·T(T + 1)/2,): for kernel offset k
        and output positions t ≤ s, the index of (pₜₖ, pₛₖ) among the classes' Gram matrices flattened
        one after the other, or of the zero after them where either reads the padding. Once per shape."""
        key = (*input_shape[2:], *output_shape[2:])
        if self._pairs is not None and self._pairs[0] == key and self._pairs[1] == device:
            return self._pairs[2], self._pairs[3]
        m = self.module
        assert isinstance(m, nn.Conv2d) and not isinstance(m.padding, str)
        height, width = input_shape[2], input_shape[3]
        out_h, out_w = output_shape[2], output_shape[3]
        (sh, sw), (ph, pw), (dh, dw), (kh, kw) = m.stride, m.padding, m.dilation, m.kernel_size
        rows = (torch.arange(out_h)[:, None] * sh - ph + torch.arange(kh)[None, :] * dh)  # (H', kh)
        cols = (torch.arange(out_w)[:, None] * sw - pw + torch.arange(kw)[None, :] * dw)  # (W', kw)
        r = rows[:, None, :, None].expand(out_h, out_w, kh, kw).reshape(-1, kh * kw).T  # (K, T)
        c = cols[None, :, None, :].expand(out_h, out_w, kh, kw).reshape(-1, kh * kw).T
        inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        r, c = r.clamp(0, height - 1), c.clamp(0, width - 1)
        class_rows = torch.tensor([len(range(i, height, sh)) for i in range(min(sh, height))])
        class_cols = torch.tensor([len(range(j, width, sw)) for j in range(min(sw, width))])
        sizes = (class_rows[:, None] * class_cols[None, :]).reshape(-1)  # positions per class
        offsets = torch.cumsum(sizes.square(), 0) - sizes.square()
        classes = [torch.tensor([y * width + z for y in range(i, height, sh) for z in range(j, width, sw)],
                                device=device) for i in range(len(class_rows)) for j in range(len(class_cols))]
        cls = (r % sh) * len(class_cols) + c % sw  # (K, T)
        local = (r // sh) * class_cols[c % sw] + c // sw  # the position's index within its class
        first, second = torch.triu_indices(r.shape[1], r.shape[1])
        pairs = offsets[cls[:, first]] + local[:, first] * sizes[cls[:, first]] + local[:, second]
        both = inside[:, first] & inside[:, second]  # (then both read one class: pₜₖ − pₛₖ = stride·(t − s))
        pairs = torch.where(both, pairs, sizes.square().sum()).reshape(-1).to(device)  # (K·T(T + 1)/2,)
        self._pairs = (key, device, classes, pairs)
        return classes, pairs

    def _triangle(self, positions: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The flat indices of the pairs t ≤ s of a (T, T) matrix, in ``_gram_pairs``' order, and their
        weights in a sum over all pairs of a symmetric one's entries: 1 on the diagonal, 2 off it."""
        key = (positions, device, dtype)
        if self._upper is None or self._upper[0] != key:
            first, second = torch.triu_indices(positions, positions)
            weights = torch.where(first == second, 1.0, 2.0).to(device=device, dtype=dtype)
            self._upper = (key, (first * positions + second).to(device), weights)
        return self._upper[1], self._upper[2]

    def add_clipped(self, factors: dict[str, torch.Tensor]) -> None:
        """Add Σᵢ cᵢ·gradᵢ to each parameter's ``summed_grad``, then drop the record."""
        r = self._record()
        m = self.module
        c = factors["weight"]
        if r.per_example is not None:
            weight = torch.einsum("b,bpa->pa", c, r.per_example)
            if r.channels_last and isinstance(m, nn.Conv2d):  # (p, kh·kw·C) to the weight's (p, C, kh, kw)
                weight = weight.reshape(m.out_channels, *m.kernel_size, -1).permute(0, 3, 1, 2)
        elif isinstance(m, nn.Conv2d):  # the convolution's own weight-gradient kernel on the scaled gᵢ
            g = r.output_grads * c.to(r.output_grads.dtype)[:, None, None, None]
            weight = _conv2d_weight(r.activations, m.weight.shape, g, m.stride, m.padding, m.dilation, m.groups)
        else:  # Σᵢ cᵢ Gᵢᵀ Aᵢ as one product, the factors applied to the narrower of G and A
            a, g = r.activations, r.output_grads
            if a.shape[-1] < g.shape[-1]:
                a = a * c[:, None, None]
            else:
                g = g * c[:, None, None]
            weight = g.reshape(-1, g.shape[-1]).T @ a.reshape(-1, a.shape[-1])
        _accumulate(m.weight, weight.reshape(m.weight.shape))
        if m.bias is not None:
            # (squared_norms keeps them; a caller that skipped it gets them here)
            bias_grads = r.bias_grads if r.bias_grads is not None else self._bias_grads(r)
            _accumulate(m.bias, factors["bias"] @ bias_grads)
        self.record = None

    def _record(self) -> _Record:
        if self.record is None:
            raise RuntimeError(f"no backward pass has run through {self.module} since the last step")
        return self.record


class _Scratch:
    """One buffer a layer copies its patches into at every step, kept from step to step: a fresh one of tens of
    MB is new pages to fault in each time (3.5 ms a copy on the MNIST CNN's first layer, and up to 250 ms when
    the host was reclaiming memory)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def take(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of ``shape``, ``like``'s dtype and device, in the buffer (grown as needed)."""
        size = math.prod(shape)
        if self.buffer is None or self.buffer.numel() < size or self.buffer.dtype != like.dtype \
                or self.buffer.device != like.device:
            self.buffer = like.new_empty(size + size // 8)  # room for lots a little larger than this one
        return self.buffer[:size].view(*shape)


def _patches(x: torch.Tensor, conv: nn.Conv2d, scratch: _Scratch | None = None) -> tuple[torch.Tensor, bool]:
    """(B, T, a): every output position's receptive field, and whether it is channels last, in
    (kh, kw, C) order, or in the weight's (C, kh, kw). One strided view of the padded input and one
    copy, whose innermost runs are C long channels last and kw long (1 where dilated) in the weight's
    order: the longer wins (channels last took 0.6× the time on the ScatterNet CNN's first layer, 81
    channels, but 1.3× on the pixel CNN's, 1 channel, 8 wide). F.unfold (im2col) loops over the
    batch on the CPU."""
    padding = conv.padding
    if isinstance(padding, str):  # ("same", "valid": refused by _check_supported before any pass)
        raise UnsupportedLayer(f"grad_sample_mode bk needs a numeric padding, got {padding!r}")
    (ph, pw), (kh, kw), (sh, sw), (dh, dw) = padding, conv.kernel_size, conv.stride, conv.dilation
    channels_last = x.shape[1] >= (kw if dw == 1 else 1)
    source = x.permute(0, 2, 3, 1) if channels_last else x  # (B, H, W, C) or (B, C, H, W)
    pad = (0, 0, pw, pw, ph, ph) if channels_last else (pw, pw, ph, ph)
    source = (F.pad(source, pad) if ph or pw else source).contiguous()
    if channels_last:
        batch, height, width, channels = source.shape
        b, row, col, c = source.stride()
    else:
        batch, channels, height, width = source.shape
        b, c, row, col = source.stride()
    out_h, out_w = (height - dh * (kh - 1) - 1) // sh + 1, (width - dw * (kw - 1) - 1) // sw + 1
    size, stride = [batch, out_h, out_w], [b, sh * row, sw * col]
    inner = [(kh, dh * row), (kw, dw * col), (channels, c)] if channels_last else \
        [(channels, c), (kh, dh * row), (kw, dw * col)]
    windows = source.as_strided(size + [n for n, _ in inner], stride + [step for _, step in inner])
    if scratch is None:
        return windows.reshape(batch, out_h * out_w, channels * kh * kw), channels_last
    patches = scratch.take(windows.shape, like=x)
    patches.copy_(windows)
    return patches.view(batch, out_h * out_w, channels * kh * kw), channels_last


def _accumulate(param: torch.Tensor, value: torch.Tensor) -> None:
    summed = getattr(param, "summed_grad", None)
    # summed_grad: the attribute Opacus' optimisers read, set on the tensor at run time (torch's stubs lack it)
    param.summed_grad = value.detach() if summed is None else summed + value.detach()  # type: ignore[attr-defined]


class _TappedOp(torch.autograd.Function):
    """y = layer(x) on the way forward; on the way back, the input gradient only (when needed),
    and (x, dy) kept for the per-example computation. The weights get no gradient from autograd."""

    # ctx: autograd's context for one call (FunctionCtx, with saved_tensors and needs_input_grad, which its stubs
    # lack), and the tap set on it here
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tap: _Tap) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.tap = tap
        return tap.op(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        x, weight = ctx.saved_tensors
        ctx.tap.keep(x, grad)
        grad_x = ctx.tap.input_grad(x, weight, grad) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def _check_supported(model: nn.Module) -> list[nn.Linear | nn.Conv2d]:
    layers: list[nn.Linear | nn.Conv2d] = []
    refuse_batch_mixing(model, grad_sample_mode="bk")
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if type(module) is nn.Linear:
            layers.append(module)
        elif type(module) is nn.Conv2d:
            problems = [f"{field}={value!r}" for field, value, ok in [
                ("groups", module.groups, module.groups == 1),
                ("padding_mode", module.padding_mode, module.padding_mode == "zeros"),
                ("padding", module.padding, not isinstance(module.padding, str))] if not ok]
            if problems:
                raise UnsupportedLayer(f"grad_sample_mode bk clips Conv2d layers with numeric zero padding and "
                                       f"groups 1 only; {name or 'the model'} has {', '.join(problems)}: use an "
                                       f"Opacus mode (ghost, hooks)")
            layers.append(module)
        else:
            raise UnsupportedLayer(f"grad_sample_mode bk clips Linear and Conv2d layers (zero padding, groups 1) "
                                   f"only; {name or 'the model'} is {type(module).__name__} with trainable "
                                   f"parameters: use an Opacus mode (ghost, hooks)")
    return layers


def _input_fixed_per_record(model: nn.Module, first: nn.Module) -> bool:
    """Whether ``first`` (the model's first tapped layer) takes a fixed function of each record: ``model`` is a
    plain Sequential (nested plain ones flattened; a subclass may override forward) whose layers before it are all
    of the ``_FIXED_PER_RECORD`` kinds, and no forward hook, the model's, a layer's or a global one, may change
    what reaches it."""
    def layers(module: nn.Module) -> Iterator[nn.Module]:
        for child in module.children():
            yield child
            if type(child) is nn.Sequential:
                yield from layers(child)

    def hooked(module: nn.Module) -> bool:
        return bool(module._forward_pre_hooks or module._forward_hooks)

    if _global_module_hooks():
        return False
    if type(model) is not nn.Sequential:
        return model is first and not hooked(model)
    if hooked(model):
        return False
    for layer in layers(model):
        if layer is first:
            return not hooked(layer)
        if type(layer) is nn.Sequential:
            if hooked(layer):
                return False
            continue
        if type(layer) not in _FIXED_PER_RECORD or hooked(layer) or any(p.requires_grad for p in layer.parameters()):
            return False
    return False


def _global_module_hooks() -> bool:
    """Whether forward hooks are registered for every module (torch.nn.modules.module.register_module_forward_hook
    and its pre-hook; their registries are module-level dicts): they may change any layer's input."""
    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


class BookKeeping:
    """Tap every trainable layer of ``model`` (see the module docstring); ``close`` restores it. With
    ``records``, the size of the training set, a first convolution that takes a fixed function of each
    record keeps its records' patch Gram matrices (used inside ``batch``, which names a batch's records)."""

    def __init__(self, model: nn.Module, *, records: int | None = None) -> None:
        layers = _check_supported(model)
        # one patch buffer for all layers: each layer's patches are used up (by its per-example product) before the
        # next layer's are copied, so the buffer need only fit the largest, not the sum
        self._scratch = _Scratch()
        self.taps = [_Tap(layer, self._scratch) for layer in layers]
        if records is not None and layers and isinstance(layers[0], nn.Conv2d) \
                and _input_fixed_per_record(model, layers[0]):
            self.taps[0].cache = _GramCache(records)
        for tap in self.taps:
            # an instance attribute that shadows the class's forward (close() deletes it); mypy sees a method replaced
            tap.module.forward = self._forward_for(tap)  # type: ignore[method-assign, assignment]

    @staticmethod
    def _forward_for(tap: _Tap) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = _TappedOp.apply(x, tap.module.weight, tap.module.bias, tap)  # (apply: Any)
            return out
        return forward

    @contextmanager
    def batch(self, positions: torch.Tensor) -> Iterator[None]:
        """The forward pass, backward pass and norms of one batch, whose records are those at ``positions`` in the
        training set (in the batch's order): what a layer's cache is keyed by."""
        for tap in self.taps:
            tap.positions = positions
        try:
            yield
        finally:
            for tap in self.taps:
                tap.positions = None

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
            tap.record, tap.cache = None, None
        self._scratch.buffer = None
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
