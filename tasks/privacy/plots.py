"""The plots an auditor opens in MLflow (artifacts under ``plots/``), drawn with matplotlib.

- ``plots/epsilon_by_stage.png``: the run's total ε after each stage, each stage alone, and
  ε over steps or rounds of the iterative stages;
- ``plots/accuracy_vs_epsilon.png``: every recorded run's test accuracy against its total ε,
  the frontier (best accuracy at or below each ε) marked, this run highlighted;
- ``plots/lifetime_budget.png``: the dataset's cumulative ε, run by run, against its budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from privpipe.privacy import Ledger, LifetimeLedger, compute_epsilon

if TYPE_CHECKING:  # a type only: the audit reads MLflow, the plots only draw
    from tasks.privacy.audit import AuditRow

__all__ = ["epsilon_by_stage_figure", "frontier_figure", "lifetime_figure", "frontier"]


def epsilon_by_stage_figure(ledger: Ledger, curves: dict[str, list[tuple[int, float]]]) -> Figure:
    stages = ledger.stages()
    total_after = [compute_epsilon([e for e in ledger.events if e.stage in stages[:i + 1]], delta=ledger.delta,
                                   accountant=ledger.accountant).epsilon for i in range(len(stages))]
    alone = [ledger.stage_epsilon(s).epsilon for s in stages]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    positions = range(len(stages))
    left.bar(positions, alone, color="tab:blue", alpha=0.5, label="stage alone")
    left.plot(positions, total_after, "o-", color="tab:red", label=f"run total ({ledger.accountant})")
    left.axhline(ledger.epsilon_budget, color="grey", linestyle="--", label="privacy.epsilon_budget")
    left.set_xticks(list(positions), stages)
    left.set_ylabel(f"ε at δ = {ledger.delta:g}")
    left.set_title("ε by stage")
    left.legend()
    for name, points in curves.items():
        if points:
            right.plot([p[0] for p in points], [p[1] for p in points], label=name)
    right.set_xlabel("step or round")
    right.set_ylabel("ε of the stage so far")
    right.set_title("ε over steps / rounds")
    if curves:
        right.legend()
    fig.tight_layout()
    return fig


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (ε, accuracy) points no other point beats with less or equal ε and higher accuracy."""
    best, out = float("-inf"), []
    for eps, acc in sorted(points, key=lambda p: (p[0], -p[1])):
        if acc > best:
            out.append((eps, acc))
            best = acc
    return out


def frontier_figure(runs: list[AuditRow], current: str) -> Figure:
    points = [(r.epsilon, r.accuracy, r.run) for r in runs if r.epsilon is not None and r.accuracy is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([p[0] for p in points], [p[1] for p in points], color="tab:blue", alpha=0.6, label="runs")
    edge = frontier([(p[0], p[1]) for p in points])
    ax.step([p[0] for p in edge], [p[1] for p in edge], where="post", color="tab:green", label="frontier")
    mine = [p for p in points if p[2] == current]
    if mine:
        ax.scatter([mine[0][0]], [mine[0][1]], color="tab:red", s=80, marker="*", label="this run", zorder=3)
    ax.set_xlabel("total ε")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"accuracy vs ε over {len(points)} runs")
    ax.legend()
    fig.tight_layout()
    return fig


def lifetime_figure(lifetime: LifetimeLedger) -> Figure:
    history = lifetime.history()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(range(1, len(history) + 1), [h[1] for h in history], where="post", marker="o", label="spent (Σε)")
    ax.axhline(lifetime.epsilon_budget, color="grey", linestyle="--", label="lifetime budget")
    ax.set_xticks(range(1, len(history) + 1), [h[0][:10] for h in history], rotation=45, ha="right")
    ax.set_xlabel("run (recorded on)")
    ax.set_ylabel("ε")
    ax.set_title(f"lifetime budget of {lifetime.dataset!r}")
    ax.legend()
    fig.tight_layout()
    return fig
