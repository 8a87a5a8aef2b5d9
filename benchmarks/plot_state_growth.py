"""Per-batch time against state size, for every provider the state-growth benchmarks ran.

``python -m benchmarks.plot_state_growth`` reads ``results/<query>_state_growth*.json``
(written by ``python -m benchmarks.dedup_state_growth``) and draws one panel per query:
each engine's ``triggerExecution`` per batch against the state rows after it, for the
map and RocksDB providers. Writes ``results/state_growth.png``.
"""
from __future__ import annotations

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, list] = {}
    for path in sorted(glob.glob(os.path.join(HERE, "results", "*_state_growth*.json"))):
        with open(path) as f:
            result = json.load(f)
        runs.setdefault(result.get("query", "dedup"), []).append(result)
    if not runs:
        raise SystemExit("no results/*_state_growth*.json: run python -m benchmarks.dedup_state_growth first")
    figure, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 4.5), squeeze=False)
    for ax, (query, results) in zip(axes[0], sorted(runs.items())):
        for result in results:
            provider = result.get("provider", "map")
            for engine, style in (("microbatch", "-"), ("spark", "--")):
                if engine not in result:
                    continue
                batches = result[engine]["batches"][1:]     # batch 0 warms the JVM and the workers
                name = "HDFS-backed" if engine == "spark" and provider == "map" else provider
                label = f"{'microbatch' if engine == 'microbatch' else 'Spark'}, {name} provider"
                if "local-cluster" in result.get("machine", ""):
                    label += ", 2 executors"
                ax.plot([b["stateRows"] / 1e6 for b in batches], [b["triggerMs"] for b in batches],
                        style, linewidth=1, label=label)
        sizes = ", ".join(sorted({f"{r['keys'] / 1e6:g}M keys ({r.get('provider', 'map')})" for r in results}))
        ax.set_title(f"{query}: {sizes}, {results[0]['batches']} batches each", fontsize=9)
        ax.set_xlabel("state rows (millions)")
        ax.set_ylabel("triggerExecution per batch (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.tight_layout()
    path = os.path.join(HERE, "results", "state_growth.png")
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
