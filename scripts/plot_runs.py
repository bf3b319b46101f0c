"""Plot held-out accuracy curves of finished (or running) runs side by side, from their
metrics.jsonl.

    python scripts/plot_runs.py runs/rloo-x runs/agro-y:"off-policy AGRO" --out curves.png

Each argument is RUN_DIR or RUN_DIR:LABEL. Three panels per puzzle size: accuracy against the run's
wall clock, against its optimizer steps, and against the completions it trained on (the `samples` of
each step), so that scripts with different costs per step can be read both ways. Prints the same
points as a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# (wall clock, completions trained on, value) at each evaluation
from compare import curve  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR:LABEL")
    p.add_argument("--numbers", default="3,4",
                   help="puzzle sizes to plot (eval{n}/sampled/accuracy)")
    p.add_argument("--out", default="curves.png")
    p.add_argument("--title", default="Countdown, held-out sampled accuracy (T=1)")
    args = p.parse_args(argv)
    runs = []
    for spec in args.runs:
        path, _, label = spec.partition(":")
        if not os.path.exists(os.path.join(path, "metrics.jsonl")):
            p.error(f"{path}: no metrics.jsonl")
        runs.append((path, label or os.path.basename(path.rstrip("/"))))
    try:
        sizes = [int(s) for s in args.numbers.split(",")]
    except ValueError:
        p.error(f"--numbers: expected comma-separated integers, got {args.numbers!r}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(sizes), 3, figsize=(15, 4.2 * len(sizes)), squeeze=False,
                             constrained_layout=True)
    for row, n in enumerate(sizes):
        key = f"eval{n}/sampled/accuracy"
        for path, label in runs:
            seconds, completions, acc = curve(path, key)
            with open(os.path.join(path, "metrics.jsonl")) as f:
                steps = [r["step"] for r in map(json.loads, f) if key in r]
            acc = [100 * a for a in acc]
            for col, xs in enumerate((seconds, steps, completions)):
                axes[row][col].plot(xs, acc, marker=".", label=label)
            print(f"{label} ({n} numbers): " + ", ".join(f"step {s} {t:.0f}s {a:.1f}"
                                                          for s, t, a in zip(steps, seconds, acc)))
        for col, xlabel in enumerate(("wall clock (s)", "optimizer steps",
                                      "completions trained on")):
            ax = axes[row][col]
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{n}-number accuracy (%)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=9)
    fig.suptitle(args.title)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
