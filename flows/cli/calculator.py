"""``privpipe privacy dpsgd``: the ε of DP-SGD (Poisson-subsampled Gaussian) for given σ, q, T and δ."""

from __future__ import annotations

import argparse

__all__ = ["dpsgd"]


def dpsgd(args: argparse.Namespace) -> int:
    # the lower bounds are checked by argparse where the options are declared (flows/cli/app.py)
    if not args.sample_rate <= 1:
        raise argparse.ArgumentError(None, f"--sample-rate: must be in (0, 1], got {args.sample_rate}")
    if not args.delta < 1:
        raise argparse.ArgumentError(None, f"--delta: must be in (0, 1), got {args.delta}")
    from privpipe.config.privacy import ACCOUNTANTS  # deferred: help and a refused option import no config

    if args.accountant not in ACCOUNTANTS:
        raise argparse.ArgumentError(None, f"--accountant: unknown {args.accountant!r} (choose one of "
                                           f"{', '.join(ACCOUNTANTS.tags)})")
    from privpipe.privacy import PoissonGaussianEvent, compute_epsilon  # deferred: torch (seconds), input checked

    event = PoissonGaussianEvent(stage="dpsgd", noise_multiplier=args.noise_multiplier,
                                 sample_rate=args.sample_rate, steps=args.steps)
    spend = compute_epsilon([event], delta=args.delta, accountant=args.accountant)
    print(f"ε = {spend.epsilon:.4f} at δ = {spend.delta:g} ({spend.accountant.upper()} accountant; "
          f"σ = {args.noise_multiplier:g}, q = {args.sample_rate:g}, T = {args.steps}, Poisson sampling, "
          "add-or-remove-one adjacency)")
    return 0
