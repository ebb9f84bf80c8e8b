"""Coverage of the gain's interval over training seeds: what 3, 5 or 10 seeds buy.

Simulated experiments (``tests.stats.test_bootstrap.simulate``: 40 groups of 1-7 pieces, a true
relative improvement of 3%, group, seed and group-by-seed effects) are judged by two intervals
at ``--level``:

- ``bootstrap``: groups and each model's seeds resampled together, the seeds' deviation widened
  by ``sqrt(S / (S - 1))`` (:func:`pipeline.stats.bootstrap.hierarchical_paired_ci`);
- ``t``: what ``symkit evaluate`` judges (:func:`pipeline.stats.bootstrap.seed_t_paired_ci`):
  the group bootstrap of the seed-averaged model, each side widened in quadrature by a Student-t
  term for the seeds, ``t_{S-1} · sd_seed / sqrt(S)``, with ``sd_seed`` the spread of the
  per-seed gains on the same groups.

Printed per (seed share, S): the share of experiments whose interval holds the truth, and the
mean width. Nothing is timed; the baseline is the nominal level itself.

    python benchmarks/bench_seed_coverage.py                  # 400 experiments per cell
    python benchmarks/bench_seed_coverage.py --experiments 100
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.stats.bootstrap import hierarchical_paired_ci, seed_t_paired_ci
from tests.stats.test_bootstrap import simulate

TRUE_GAIN = 0.03


def cell(n_seeds: int, sd_seed: float, experiments: int, n_boot: int, level: float,
         seed: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng([seed, n_seeds, round(sd_seed * 1e6)])
    hits = {"bootstrap": [], "t": []}
    widths = {"bootstrap": [], "t": []}
    for _ in range(experiments):
        nll_a, nll_b, notes, codes = simulate(rng, n_seeds=n_seeds, sd_seed=sd_seed)
        g = int(codes.max()) + 1
        ci = hierarchical_paired_ci(nll_a, nll_b, notes, codes, g, n_boot, rng,
                                    level)["rel_improvement"]
        t = seed_t_paired_ci(nll_a, nll_b, notes, codes, g, n_boot, rng,
                             level)["rel_improvement"]
        for name, (lo, hi) in (("bootstrap", (ci["ci_low"], ci["ci_high"])),
                               ("t", (t["ci_low"], t["ci_high"]))):
            hits[name].append(lo <= TRUE_GAIN <= hi)
            widths[name].append(hi - lo)
    return {k: (float(np.mean(hits[k])), float(np.mean(widths[k]))) for k in hits}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=400)
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tol = 3 * math.sqrt(args.level * (1 - args.level) / args.experiments)
    print(f"nominal {args.level:.0%}; {args.experiments} experiments a cell (3 binomial standard "
          f"errors: ±{tol:.1%}); true gain {TRUE_GAIN:.0%}")
    print("| seed sd | seeds | bootstrap coverage | bootstrap width | t coverage | t width |")
    print("|---|---|---|---|---|---|")
    for sd_seed in (0.01, 0.03):  # ~30% of the variance; seeds dominating
        for n_seeds in (3, 5, 10):
            r = cell(n_seeds, sd_seed, args.experiments, args.n_boot, args.level, args.seed)
            print(f"| {sd_seed:g} | {n_seeds} | {r['bootstrap'][0]:.1%} | {r['bootstrap'][1]:.4f}"
                  f" | {r['t'][0]:.1%} | {r['t'][1]:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
