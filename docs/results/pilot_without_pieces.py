"""The val pilot's spreads with some val pieces left out, and what the registered design would
then reach: how much of the default registration's power two val chorales cost.

    .venv/bin/python docs/results/pilot_without_pieces.py            # the two program outliers
    .venv/bin/python docs/results/pilot_without_pieces.py SHA [SHA ...]   # any sha256 prefixes

Reads the committed val pilot (reports/pilot: val and the train subset only, no test piece),
recomputes its power and gap blocks with evaluate's own functions on the pieces left, turns them
into spreads as `symkit preregister` does (pipeline.decision.spreads.from_pilot, at the
registration's counts) and asks pipeline.decision.criteria_controls.within_corpus what the
registered design would reach with the 51 test pieces as they are. Every random draw is seeded:
the same inputs print the same figures. A counterfactual for planning a new registration, not a
statement of this one.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from pipeline.core import artifacts
from pipeline.core.config import load_section, read_params
from pipeline.decision.criteria import CriteriaConfig
from pipeline.decision.criteria_controls import GOOD_MODEL, Sizes, joint_rates, within_corpus
from pipeline.decision.preregistration import stated_power
from pipeline.decision.spreads import Spreads, from_pilot
from pipeline.stages.evaluate import EvaluateConfig
from pipeline.stats.aggregate import aggregate, generalisation, power_blocks

ROOT = Path(__file__).resolve().parents[2]
OUTLIERS = ("e899d193", "5e114dd0")
"""BWV 274 (all parts MIDI program 52) and BWV 8.6 (a part at program 6), both val: programs no
train piece carries."""
DRAWS = 100


def spreads_without(prefixes: tuple[str, ...], sizes: Sizes):
    table = artifacts.read_parquet(ROOT / "reports/pilot/per_piece.parquet")
    kept = table[~table["sha256"].str.startswith(prefixes)] if prefixes else table
    params = read_params(ROOT / "params.yaml")
    cfg = EvaluateConfig(**{**(params.get("evaluate") or {}), "splits": ["val"]})
    names = sorted(set(kept["model"]))
    n_test_groups = int(artifacts.read_json(ROOT / "reports/pilot/eval.json")["power"]
                        ["ngram_minus_transformer"]["n_groups"])
    _, gap = generalisation(kept, cfg, names)
    _, paired = aggregate(kept, cfg, names)
    report = {"power": power_blocks(kept, cfg, names, n_test_groups), "gap": gap}
    gain = paired["ngram_minus_transformer"]["val"]["rel_improvement"]["value"]
    seeds = [b["nats_per_note"]["value"] for b in gap["transformer"]["per_seed"].values()]
    print(f"  val gain {gain:.1%}; each seed's per-note gap {min(seeds):.2f} to {max(seeds):.2f}")
    spreads = from_pilot(report, kept, held_out=sizes.membership_test,
                         train_pieces=sizes.membership_train,
                         flag_quantile=1 - sizes.human_flag_rate, level=sizes.level)
    return spreads, len(table) - len(kept)


def main(argv: list[str]) -> int:
    prefixes = tuple(argv) or OUTLIERS
    registered = artifacts.read_json(ROOT / "reports/preregistration.json")
    block, _ = stated_power(registered)
    sizes = Sizes(spreads=Spreads.from_dict(block["spreads"]), **block["sizes"])
    criteria = load_section("criteria", ROOT / "params.yaml", CriteriaConfig)
    for label, drop in (("all val pieces", ()), (f"without {', '.join(prefixes)}", prefixes)):
        print(f"{label}:")
        spreads, rows = spreads_without(drop, sizes)
        at = replace(sizes, spreads=spreads)
        print(f"  {rows} per-piece rows left out")
        for f in ("gain_se_groups", "gain_seed_sd", "gap_se_note", "gap_seed_sd_note",
                  "piece_sd_note"):
            print(f"  {f} = {getattr(spreads, f):.4g}")
        joint = joint_rates(criteria, GOOD_MODEL, at, DRAWS)
        print(f"  good model, all rules together at the registered design: {joint['all']:.0%}")
        found = within_corpus(criteria, at, DRAWS)
        print(f"  with these pieces, best of up to 16x samples and 2x seeds: {found['samples']} "
              f"samples, {found['seeds']} seeds -> {found['good_all']:.0%}"
              + (f" (held back by {', '.join(found['limited_by'])})" if found["limited_by"]
                 else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
