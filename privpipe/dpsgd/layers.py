"""Which layers DP-SGD can clip per example, whichever engine runs it: :class:`UnsupportedLayer`, and
:func:`refuse_batch_mixing` for the layers that no engine can (bk and Opacus' modes alike)."""

from __future__ import annotations

from torch import nn

__all__ = ["UnsupportedLayer", "refuse_batch_mixing", "MIXES_BATCH"]


class UnsupportedLayer(ValueError):
    """The model has a layer the chosen engine cannot clip per example (bk: use an Opacus grad_sample_mode)."""


# Layers that mix the examples of a batch: one example's gradient then depends on the others, and clipping
# each gradient no longer bounds one record's influence, parameters or not. The classes are refused, not the
# mode: a model checked in eval mode may train later. _BatchNorm covers BatchNorm1d/2d/3d, SyncBatchNorm and
# the lazy variants; torch.nn has no other layer that mixes the batch (InstanceNorm, GroupNorm, LayerNorm and
# LocalResponseNorm normalise within an example). Other parameter-free modules are accepted, user-defined ones
# included: most are harmless (a custom activation), and a deny list can be audited where guessing cannot.
MIXES_BATCH: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm,)


def refuse_batch_mixing(model: nn.Module, *, grad_sample_mode: str) -> None:
    """UnsupportedLayer (one line, naming the module) for a layer of ``model`` that mixes the batch, or that
    keeps running statistics of the training data (an InstanceNorm with track_running_stats: its buffers are
    released with the model, and no noise covers them). Opacus' own validator looks only at modules with
    trainable parameters: it takes BatchNorm(affine=False) silently."""
    for name, module in model.named_modules():
        where = f"{name or 'the model'} is {type(module).__name__}"
        if isinstance(module, MIXES_BATCH):
            raise UnsupportedLayer(f"grad_sample_mode {grad_sample_mode} clips each example on its own; {where}, "
                                   "which mixes the examples of a batch: replace it with GroupNorm or LayerNorm, or "
                                   "remove the layer")
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
            raise UnsupportedLayer(f"{where} with track_running_stats, whose running mean and variance of the "
                                   "training data would be released without noise: set track_running_stats=False")
