"""Two versions of microbatch side by side, from the ``bench.json`` files of
``python -m benchmarks`` runs of each (run in turn on one machine, the order alternated:
before, after, after, before).

    python -m benchmarks.compare --before A1.json A2.json --after B1.json B2.json

For every cell: microbatch's median over the runs of each version, the change, and
microbatch's ratio to Spark's engine measured in the same runs (which takes out some of
the machine's drift between runs). A cell whose time and whose ratio both grew by more
than ``--tolerance`` (5% by default) is marked SLOWER; the exit code says whether any is.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def cells(path: str) -> dict[tuple[str, int], tuple[float, float]]:
    """(cell, rows per batch) -> (microbatch ms, the anchor's ms) of one run's bench.json."""
    with open(path) as f:
        run = json.load(f)
    found = {(r["query"], r["rows_per_batch"]): (r["microbatch"]["wall_s"] * 1000, r["spark"]["wall_s"] * 1000)
             for r in run["results"]}
    found.update({(c["cell"], c["rows_per_batch"]): (c["microbatch_ms"], c["anchor_ms"]) for c in run["cells"]})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True, help="bench.json files of the earlier version")
    parser.add_argument("--after", nargs="+", required=True, help="bench.json files of the later version")
    parser.add_argument("--tolerance", type=float, default=0.05, help="the slowdown allowed (0.05: 5%%)")
    args = parser.parse_args(argv)
    before = [cells(p) for p in args.before]
    after = [cells(p) for p in args.after]
    keys = [k for k in before[0] if all(k in run for run in before + after)]
    print(f"{'cell':44} {'rows':>8} {'before ms':>10} {'after ms':>9} {'change':>7} "
          f"{'ratio before':>12} {'ratio after':>11} {'change':>7}")
    slower = []
    for key in keys:
        ours_before = statistics.median(run[key][0] for run in before)
        ours_after = statistics.median(run[key][0] for run in after)
        ratio_before = statistics.median(run[key][0] / run[key][1] for run in before)
        ratio_after = statistics.median(run[key][0] / run[key][1] for run in after)
        change, ratio_change = ours_after / ours_before - 1, ratio_after / ratio_before - 1
        mark = ""
        if change > args.tolerance and ratio_change > args.tolerance:
            mark = "  SLOWER"
            slower.append(key)
        print(f"{key[0]:44} {key[1]:>8} {ours_before:>10.0f} {ours_after:>9.0f} {change:>+7.1%} "
              f"{ratio_before:>12.2f} {ratio_after:>11.2f} {ratio_change:>+7.1%}{mark}")
    total_before = sum(statistics.median(run[k][0] for run in before) for k in keys)
    total_after = sum(statistics.median(run[k][0] for run in after) for k in keys)
    print(f"all cells: {total_before / 1000:.1f} s before, {total_after / 1000:.1f} s after "
          f"({total_after / total_before - 1:+.1%}); slower by more than {args.tolerance:.0%}: {len(slower)}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
