"""Time to compute ε for long DP-SGD runs with the PLD and RDP accountants.

    .venv/bin/python bench/accountant_speed.py

Abadi et al.'s setting (q = 0.01, σ = 4, δ = 1e-5) at 40,000 steps; median of 5
fresh computations each (no caching between them). Goal: PLD ≤ 100 ms.
"""

from __future__ import annotations

import statistics
import time

from privpipe.privacy import PoissonGaussianEvent, compute_epsilon

STEPS = 40_000


def main() -> None:
    event = PoissonGaussianEvent(stage="finetune", noise_multiplier=4.0, sample_rate=0.01, steps=STEPS)
    for accountant in ("pld", "rdp"):
        times, spend = [], None
        for _ in range(5):
            start = time.perf_counter()
            spend = compute_epsilon([event], delta=1e-5, accountant=accountant)
            times.append(time.perf_counter() - start)
        print(f"{accountant.upper()}: ε = {spend.epsilon:.4f} for {STEPS} steps in "
              f"{statistics.median(times) * 1000:.0f} ms (median of 5)")


if __name__ == "__main__":
    main()
