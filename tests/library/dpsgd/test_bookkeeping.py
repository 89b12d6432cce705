"""Book-keeping clipping against brute force: every example's gradient from its own backward pass."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privpipe.dpsgd import BookKeeping, UnsupportedLayer, clip_factors


def _cnn() -> nn.Sequential:
    # both norm paths: conv1 and the Linear on (B, 40, 4) form per-example gradients, conv2 uses
    # Gram matrices (9 positions, 16 inputs, 40 outputs); GroupNorm and pooling have no weights
    return nn.Sequential(nn.GroupNorm(3, 6, affine=False), nn.Conv2d(6, 4, 3, stride=2, padding=1), nn.Tanh(),
                         nn.Conv2d(4, 40, 2, stride=1, bias=False), nn.MaxPool2d(2, 1), nn.Flatten(2),
                         nn.Linear(4, 30), nn.Tanh(), nn.Flatten(), nn.Linear(40 * 30, 5))


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 5))


def _brute_force(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Per example, the gradient of each trainable tensor, one backward pass each."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for xi, yi in zip(x, y):
        grads = torch.autograd.grad(F.cross_entropy(model(xi[None]), yi[None], reduction="sum"), params)
        out.append([g.detach() for g in grads])
    return out


CASES = [(_cnn, (6, 7, 7)), (_mlp, (7,))]


@pytest.mark.parametrize("make, shape", CASES)
@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_clipped_sum_equals_brute_force(make, shape, clipping):
    torch.manual_seed(0)
    model = make().double()
    x, y = torch.randn(12, *shape, dtype=torch.float64) * 3, torch.randint(0, 5, (12,))
    per_example = _brute_force(model, x, y)
    params = [p for p in model.parameters() if p.requires_grad]
    clip = 0.7
    taps = BookKeeping(model)
    F.cross_entropy(model(x), y, reduction="sum").backward()
    squared = taps.squared_norms()
    flat_norms = torch.stack([n for layer in squared for n in layer.values()]).sum(0).sqrt()
    brute_norms = torch.stack([torch.cat([g.flatten() for g in grads]).norm() for grads in per_example])
    assert torch.allclose(flat_norms, brute_norms, rtol=1e-9)
    assert all(p.grad is None for p in params)  # autograd skipped the summed weight gradient
    taps.add_clipped(clip_factors(squared, max_grad_norm=clip, clipping=clipping))
    got = [p.summed_grad for p in params]
    taps.close()

    if clipping == "flat":
        factors = [[min(1.0, clip / (n.item() + 1e-6))] * len(params) for n in brute_norms]  # Opacus' 1e-6
    else:
        per_tensor = clip / math.sqrt(len(params))
        factors = [[min(1.0, per_tensor / (g.norm().item() + 1e-6)) for g in grads] for grads in per_example]
    assert sum(f < 1 for row in factors for f in row) > len(factors)  # clipping really bites
    for k, g in enumerate(got):
        expected = sum(row[k] * grads[k] for row, grads in zip(factors, per_example))
        assert torch.allclose(g, expected, rtol=1e-8, atol=1e-10)


def test_physical_batches_add_up_to_the_whole_lot():
    torch.manual_seed(1)
    model = _cnn().double()
    x, y = torch.randn(10, 6, 7, 7, dtype=torch.float64), torch.randint(0, 5, (10,))
    taps = BookKeeping(model)
    sums = []
    for parts in ([slice(0, 10)], [slice(0, 3), slice(3, 7), slice(7, 10)]):
        for part in parts:
            F.cross_entropy(model(x[part]), y[part], reduction="sum").backward()
            taps.add_clipped(clip_factors(taps.squared_norms(), max_grad_norm=0.5, clipping="flat"))
        sums.append([p.summed_grad.clone() for p in taps.parameters])
        for p in taps.parameters:
            p.summed_grad = None
    taps.close()
    assert all(torch.allclose(a, b, rtol=1e-10) for a, b in zip(*sums))


def test_close_restores_the_plain_model():
    model = _mlp()
    x = torch.randn(4, 7)
    before = model(x).detach()
    taps = BookKeeping(model)
    taps.close()
    assert "forward" not in vars(model[0])
    F.cross_entropy(model(x), torch.zeros(4, dtype=torch.long)).backward()
    assert model[0].weight.grad is not None and torch.equal(model(x).detach(), before)


@pytest.mark.parametrize(("layer", "message"), [
    (nn.BatchNorm1d(7), "bk clips each example on its own; 0 is BatchNorm1d, which mixes the examples"),
    (nn.LayerNorm(7), "bk clips Linear and Conv2d"), (nn.Embedding(3, 7), "bk clips Linear and Conv2d")])
def test_unsupported_trainable_layers_are_refused(layer, message):
    with pytest.raises(UnsupportedLayer, match=message):
        BookKeeping(nn.Sequential(layer, nn.Linear(7, 2)))


def test_a_layer_run_twice_is_refused():
    layer = nn.Linear(4, 4)
    model = nn.Sequential(layer, nn.Tanh(), layer)
    taps = BookKeeping(model)
    with pytest.raises(RuntimeError, match="ran twice"):
        model(torch.randn(3, 4)).sum().backward()
    taps.close()


CONVS = [  # (in channels, out channels, kernel, stride, padding, dilation, bias, input (H, W))
    (3, 5, 3, 1, 0, 1, True, (6, 6)),
    (3, 5, 3, 2, 1, 1, True, (7, 7)),
    (2, 4, (2, 3), (2, 1), (1, 0), 1, False, (7, 6)),
    (2, 4, 3, 1, 2, 2, True, (6, 5)),  # dilated, padded beyond the kernel's reach
    (1, 3, 4, 3, 2, (2, 1), True, (9, 8)),  # stride above the dilated kernel's step, rows padded
    (4, 6, 1, 1, 0, 1, True, (5, 5)),  # 1×1
    (2, 3, 5, 1, 0, 1, True, (5, 5)),  # one output position
    (2, 3, 2, (4, 3), 1, 1, True, (3, 7)),  # a stride above the input's height: fewer classes than sh
]


@pytest.mark.parametrize("conv", CONVS)
@pytest.mark.parametrize("strategy", ["gram", "per_example"])
def test_each_conv_norm_strategy_equals_brute_force(conv, strategy, monkeypatch):
    channels, outputs, kernel, stride, padding, dilation, bias, (height, width) = conv
    torch.manual_seed(2)
    layer = nn.Conv2d(channels, outputs, kernel, stride=stride, padding=padding, dilation=dilation, bias=bias)
    x, y = torch.randn(9, channels, height, width) * 2, torch.randint(0, 5, (9,))
    model = nn.Sequential(nn.Tanh(), layer, nn.Tanh(), nn.Flatten(), nn.Linear(layer(x)[0].numel(), 5)).double()
    x = x.double()
    monkeypatch.setattr("privpipe.dpsgd.bookkeeping._Tap.norm_strategy", lambda *_: strategy)
    per_example = _brute_force(model, x, y)
    params = [p for p in model.parameters() if p.requires_grad]
    taps = BookKeeping(model)
    F.cross_entropy(model(x), y, reduction="sum").backward()
    squared = taps.squared_norms()
    for tap, layer_norms in zip(taps.taps, squared):  # each tensor's norms, the convolution's included
        for name, norms in layer_norms.items():
            index = next(i for i, p in enumerate(params) if p is getattr(tap.module, name))
            assert torch.allclose(norms, torch.stack([g[index].square().sum() for g in per_example]), rtol=1e-9)
    clip = 0.3
    taps.add_clipped(clip_factors(squared, max_grad_norm=clip, clipping="flat"))
    got = {id(p): p.summed_grad for p in taps.parameters}
    taps.close()
    norms = torch.stack([torch.cat([g.flatten() for g in grads]).norm() for grads in per_example])
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    assert (factors < 1).sum() > 3  # clipping bites
    for index, p in enumerate(params):
        expected = sum(f * grads[index] for f, grads in zip(factors, per_example))
        assert torch.allclose(got[id(p)], expected, rtol=1e-8, atol=1e-10)


def test_the_cost_model_picks_the_gram_matrix_for_small_maps_and_gradients_for_large_ones():
    from privpipe.dpsgd.bookkeeping import _Tap

    scatter = _Tap(nn.Conv2d(81, 32, 3, stride=2, padding=1))  # 7×7 maps to 4×4: T = 16, a = 729
    assert scatter.norm_strategy((1024, 81, 7, 7), (1024, 32, 4, 4)) == "gram"
    second = _Tap(nn.Conv2d(32, 64, 3, padding=1))  # stride 1: the input's Gram matrix is the patches' / 9
    assert second.norm_strategy((1024, 32, 4, 4), (1024, 64, 4, 4)) == "gram"
    pixels = _Tap(nn.Conv2d(1, 16, 8, stride=2, padding=3))  # 28×28 to 14×14: T = 196, a = 64
    assert pixels.norm_strategy((512, 1, 28, 28), (512, 16, 14, 14)) == "per_example"


@pytest.mark.parametrize("layer, match", [
    (nn.Conv2d(4, 4, 3, groups=2), "groups=2"),
    (nn.Conv2d(4, 4, 3, padding="same"), "padding='same'"),
    (nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
])
def test_convolutions_it_cannot_clip_are_refused(layer, match):
    with pytest.raises(UnsupportedLayer, match=match):
        BookKeeping(nn.Sequential(layer, nn.Flatten(), nn.Linear(4, 2)))


def test_the_patch_gram_is_the_same_gathered_on_one_thread_or_several():
    """_patch_gram gathers each stride class with index_select on one torch thread, gather on more."""
    from privpipe.dpsgd.bookkeeping import _Tap

    tap = _Tap(nn.Conv2d(5, 4, 3, stride=2, padding=1))
    x = torch.randn(6, 5, 7, 8)
    shape = tap.module(x).shape
    threads = torch.get_num_threads()
    try:
        grams = []
        for n in (1, 2):
            torch.set_num_threads(n)
            grams.append(tap._patch_gram(x, shape))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(grams[0], grams[1])
    patches = F.unfold(x, 3, padding=1, stride=2).transpose(1, 2)  # (B, T, a)
    first, second = torch.triu_indices(shape[2] * shape[3], shape[2] * shape[3])
    expected = torch.bmm(patches, patches.transpose(1, 2))[:, first, second]
    assert torch.allclose(grams[0], expected, rtol=1e-5, atol=1e-5)


def _scatter_like() -> nn.Sequential:
    """The ScatterNet CNN's shape, small: a first convolution on a fixed function of each record (GroupNorm on
    many channels, few positions: its norms come from Gram matrices), then one that depends on the weights."""
    return nn.Sequential(nn.Unflatten(1, (18, 5, 5)), nn.GroupNorm(6, 18, affine=False),
                         nn.Conv2d(18, 4, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(4, 6, 3, padding=1),
                         nn.Tanh(), nn.Flatten(), nn.Linear(6 * 9, 5))


def _norms_in_batches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches: list[torch.Tensor], *,
                      records: int | None) -> tuple[list[torch.Tensor], int]:
    """Each batch's flat per-example norms, and how many times the first layer computed patch Gram matrices."""
    taps = BookKeeping(model, records=records)
    computed = 0
    compute = taps.taps[0]._patch_gram

    def counted(*args: torch.Tensor) -> torch.Tensor:
        nonlocal computed
        computed += len(args[0])
        return compute(*args)  # type: ignore[arg-type]

    taps.taps[0]._patch_gram = counted  # type: ignore[method-assign, assignment]
    norms = []
    for positions in batches:
        with taps.batch(positions):
            F.cross_entropy(model(x[positions]), y[positions], reduction="sum").backward()
            squared = taps.squared_norms()
        norms.append(torch.stack([n for layer in squared for n in layer.values()]).sum(0))
        taps.add_clipped(clip_factors(squared, max_grad_norm=1.0, clipping="flat"))
    taps.close()
    return norms, computed


def test_a_first_layer_on_a_fixed_function_of_the_record_computes_each_records_gram_once():
    """Each record's patch Gram is computed at its first batch and read back after: the norms are brute force's
    (as without the cache), in batches that repeat records, mix seen and unseen ones, and change in size."""
    torch.manual_seed(0)
    model = _scatter_like().double()
    x, y = torch.randn(20, 18 * 25, dtype=torch.float64), torch.randint(0, 5, (20,))
    batches = [torch.tensor(b) for b in ([0, 3, 5, 7], [3, 5, 7, 0], [1, 3, 9, 11, 19], [19, 1], [2, 4, 6, 8])]
    assert _input_is_fixed(model)
    cached, computed = _norms_in_batches(model, x, y, batches, records=20)
    plain, all_computed = _norms_in_batches(model, x, y, batches, records=None)
    assert computed == 4 + 0 + 4 + 0 + 4 and all_computed == sum(len(b) for b in batches)
    brute = _brute_force(model, x, y)
    for positions, got, uncached in zip(batches, cached, plain):
        expected = torch.stack([sum(g.square().sum() for g in brute[i]) for i in positions.tolist()])
        assert torch.allclose(got, expected, rtol=1e-9) and torch.allclose(uncached, expected, rtol=1e-9)


def _input_is_fixed(model: nn.Module) -> bool:
    return BookKeeping(model, records=1).taps[0].cache is not None


def test_no_cache_where_the_first_layers_input_may_change_between_steps():
    """Dropout (random at every step), a trainable layer in front (refused by bk anyway), a model that is no
    Sequential, or no set size: the patch Gram is computed at every batch."""
    assert _input_is_fixed(_scatter_like())
    dropout = _scatter_like()
    dropout.insert(1, nn.Dropout(0.1))
    assert not _input_is_fixed(dropout)

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _scatter_like()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x * 2)

    assert not _input_is_fixed(Wrapped())

    class Noisy(nn.Sequential):  # a Sequential whose forward changes the input at every step
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x + torch.randn_like(x))

    assert not _input_is_fixed(Noisy(*_scatter_like()))
    for hooked in (0, 1, 2):  # a pre-hook on the model, on the GroupNorm in front, on the first convolution
        model = _scatter_like()
        (model if hooked == 0 else model[hooked]).register_forward_pre_hook(lambda m, args: args)
        assert not _input_is_fixed(model)
    handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: out)
    try:
        assert not _input_is_fixed(_scatter_like())
    finally:
        handle.remove()
    assert _input_is_fixed(nn.Sequential(nn.Sequential(*_scatter_like()[:2]), *_scatter_like()[2:]))  # nested
    assert BookKeeping(_scatter_like()).taps[0].cache is None
    assert BookKeeping(_mlp(), records=10).taps[0].cache is None  # a Linear first: no Gram matrices to keep


def test_a_batch_that_names_other_records_than_it_holds_is_refused():
    model = _scatter_like()
    taps = BookKeeping(model, records=10)
    x, y = torch.randn(4, 18 * 25), torch.randint(0, 5, (4,))
    with taps.batch(torch.tensor([0, 1, 2])):
        F.cross_entropy(model(x), y, reduction="sum").backward()
        with pytest.raises(RuntimeError, match="names 3 records but holds 4"):
            taps.squared_norms()
    taps.close()


def test_training_with_the_cache_takes_the_steps_of_training_without_it(monkeypatch: pytest.MonkeyPatch):
    """Through train_dpsgd (Poisson lots smaller than the set, several epochs): the positions clipped_sum names
    are the records' own, so the weights are those of a run that computes every Gram matrix afresh (up to the
    float rounding of a Gram computed in another batch), and the cache did serve most batches."""
    import numpy as np

    from privpipe.dpsgd import DpSgdSettings, bookkeeping, train_dpsgd

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(120, 18 * 25)).astype(np.float32), rng.integers(0, 5, 120)
    settings = DpSgdSettings(noise_multiplier=1.0, max_grad_norm=0.5, lot_size=20, epochs=4, learning_rate=0.2,
                             momentum=0.9, grad_sample_mode="bk", secure_rng=False, seed=3)
    computed: list[int] = []
    compute = bookkeeping._Tap._patch_gram

    def counted(self: bookkeeping._Tap, x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        if isinstance(self.module, nn.Conv2d) and self.module.in_channels == 18:  # the first layer's, not the second's
            computed.append(len(x))
        return compute(self, x, shape)

    monkeypatch.setattr(bookkeeping._Tap, "_patch_gram", counted)
    weights = []
    for fixed in (bookkeeping._FIXED_PER_RECORD, ()):
        monkeypatch.setattr(bookkeeping, "_FIXED_PER_RECORD", fixed)
        computed.clear()
        torch.manual_seed(0)
        weights.append([p.detach().clone() for p in train_dpsgd(_scatter_like(), x, y, settings).model.parameters()])
        grams = sum(computed)
        if fixed:
            cached_grams = grams
    assert cached_grams <= 120 < grams  # each record's Gram at most once, against once per lot it was drawn in
    for cached, fresh in zip(*weights):
        assert torch.allclose(cached, fresh, rtol=0, atol=1e-5)
