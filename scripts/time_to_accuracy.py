"""Time to accuracy: held-out accuracy of each RL script after 1, 2, 5 and 10 minutes of wall clock.

    python scripts/time_to_accuracy.py                  # CPU: rloo, topr, agro, spo; seeds 0,1,2
    python scripts/time_to_accuracy.py --sft runs/compare/sft/final --minutes 1,2,5

1. sft.py trains the starting checkpoint once (or `--sft PATH` reuses one).
2. Each script runs from it with its own defaults but no cap on steps (rloo.py keeps its --steps:
   its lr decays to 0 over them), `--seed s` and `--time-limit m`, once for each minute m: the
   run's final model is the model as it stands m minutes after the script started, everything
   included (loading, data generation, SPO's Q0 estimate, the script's own periodic evaluations).
   Runs of one seed follow the same path until their limits, so this costs the sum of the
   minutes instead of the last, and keeps the algorithm scripts free of it. `--jobs` runs go side
   by side.
3. Every final model, and the SFT model, is evaluated here in one way (lab.evaluate: the scripts'
   own evaluation, on the problems that seed holds out, so that minute 0 at seed s is every
   seed-s run's step 0): --eval-k samples at T = 1 (the policy itself).
4. Writes the table and a plot of accuracy against wall clock into the time-to-accuracy block of
   --results (docs/RESULTS.md; scripts/compare.py keeps that block when it rewrites the file).

An interrupted invocation picks up where it stopped: finished runs and evaluations are kept.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its argument checks and plot colours)
from compare import common, get_task  # noqa: E402
from lab import (TIME_BLOCK, commit, evaluate_runs, machine, mean_sd, md_table,  # noqa: E402
                 replace_block, repo_relative, run_commands, run_flags, script_command,
                 start_model)

# name -> (script, flags): each script's defaults (agro: each of its two modes) without its
# cap on steps or iterations, so that --time-limit ends the run; rloo keeps its --steps, the length
# of its lr decay, and stands at its final weights once it has made them
ROWS = {"rloo": ("rloo.py", []), "topr": ("topr.py", ["--iterations", "1000"]),
        "agro-onpolicy": ("agro.py", ["--mode", "onpolicy", "--steps", "1000000"]),  # its default
        "agro-offpolicy": ("agro.py", ["--mode", "offpolicy", "--steps", "1000000"]),
        "spo": ("spo.py", ["--steps", "1000000"])}
START, END = TIME_BLOCK  # the block of --results this writes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    run_flags(p)  # --task, --model, --sft, --seeds, --jobs, --threads, --engine, --eval-*
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: "
                   + ", ".join(ROWS))
    p.add_argument("--minutes", type=minutes_list, default=[1.0, 2.0, 5.0, 10.0],
                   help="wall-clock minutes at which each run's model is evaluated")
    p.add_argument("--out", default="runs/time", help="folder for the runs")
    p.add_argument("--results", default="docs/RESULTS.md",
                   help="the generated results file whose time-to-accuracy block is replaced")
    return p, p.parse_args(argv)


def check_args(args, parser):
    """Every bad input as one line and exit status 2, before anything runs."""
    try:
        task = get_task(args.task)
        rows = compare.row_list(args.rows, ROWS)
        seeds = compare.int_list(args.seeds, "--seeds")
        if args.sft is not None and not os.path.isdir(args.sft):
            raise ValueError(f"--sft {args.sft}: no such checkpoint")
        if not os.path.exists(args.results):
            raise ValueError(f"--results {args.results}: no such file (run scripts/compare.py)")
    except ValueError as e:
        parser.error(str(e))
    return task, rows, seeds


def last_step(run_dir: str) -> int:
    """The optimizer steps a finished run took: the step of its metrics' last row."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return json.loads(f.readlines()[-1])["step"]


def minutes_list(text: str) -> list[float]:
    """argparse type: comma-separated positive minutes, e.g. "1,2,5,10", returned sorted."""
    return sorted(common.positive_float(m) for m in text.split(","))


minutes_list.__name__ = "comma-separated positive minutes"  # argparse's "invalid ... value"


def table(curves: dict, sizes: list[int], minutes: list[float]) -> str:
    """Rows: scripts; columns: sampled accuracy (%) of each size at each minute, mean ± sd."""
    head = ["script"] + [f"{n}: {m:g} min" for n in sizes for m in minutes]
    rows = [[name, *(mean_sd(by_minute[m][n], 100) for n in sizes for m in minutes)]
            for name, by_minute in curves.items()]
    return "\n".join(md_table(head, rows)) + "\n"


def plot(curves: dict, sizes: list[int], minutes: list[float], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4.2), squeeze=False,
                             constrained_layout=True)
    for ax, n in zip(axes[0], sizes):
        for color, (name, by_minute) in zip(compare.COLORS[1:], curves.items()):
            xs = sorted(by_minute)
            means = [statistics.mean(by_minute[m][n]) * 100 for m in xs]
            sds = [statistics.stdev(by_minute[m][n]) * 100 if len(by_minute[m][n]) > 1 else 0
                   for m in xs]
            ax.errorbar(xs, means, yerr=sds, color=color, marker="o", capsize=3, label=name)
        ax.set_xlabel("wall clock since the script started (min)")
        ax.set_ylabel(f"held-out accuracy, size {n}, T = 1 (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, title="mean ± sd over seeds")
    fig.savefig(path, dpi=100)


def write_block(args, argv, curves, sizes, seeds, steps) -> str:
    """The time-to-accuracy block of --results, replaced in place (or appended)."""
    png = os.path.splitext(args.results)[0] + "-time.png"
    plot(curves, sizes, args.minutes, png)
    snap = f"--time-limit M (M = {', '.join(f'{m:g}' for m in args.minutes)})"
    rows = "\n".join(f"- {name}: `python {shlex.join([ROWS[name][0], *ROWS[name][1]])} {snap}`"
                     for name in curves)
    step_cells = "; ".join(f"{name} {statistics.mean(s):.0f}" for name, s in steps.items())
    block = f"""{START}
## Time to accuracy

Generated by `python scripts/time_to_accuracy.py {shlex.join(map(repo_relative, argv))}`;
do not edit by hand.
Commit {commit()}, {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {machine()};
{args.jobs} runs side by side, {args.threads} torch thread(s) each, engine {args.engine}; seeds
{','.join(map(str, seeds))}. Each script runs with its defaults (no cap on steps; rloo keeps its
--steps, over which its lr decays to 0, and stands at its final weights after them) from the same
SFT checkpoint, once for each number of minutes M with `--time-limit M`, and its final model is
evaluated: the model as it stands M minutes of wall clock after the script started, everything
included (loading, data generation, SPO's Q0 estimate, its own periodic evaluations). Held-out
sampled accuracy: {args.eval_k} samples at T = 1 of the {args.eval_size} problems per size that
the seed holds out (the scripts' own evaluation, lab.evaluate); % mean ± sd over seeds. Minute 0
is the SFT checkpoint, each seed's run's step 0.

{table(curves, sizes, [0.0] + args.minutes)}
Optimizer steps by {args.minutes[-1]:g} minutes (mean over seeds): {step_cells}.

![time to accuracy]({os.path.basename(png)})

{rows}
{END}"""
    if not replace_block(args.results, START, END, block):  # no block yet: appended
        text = open(args.results).read().rstrip("\n") + "\n\n" + block + "\n"
        with open(args.results, "w") as f:
            f.write(text)
    return block


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser, args = parse_args(argv)
    task, rows, seeds = check_args(args, parser)
    out = os.path.abspath(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    started, minutes = time.time(), args.minutes
    sft_path = start_model(args, out, log_dir)[0]  # 1. where every run starts

    # 2. each script, seed and time limit: one run
    runs = {(name, s, m): os.path.join(out, f"{name}-s{s}-{m:g}min")
            for s in seeds for name in rows for m in minutes}
    run_commands({d: script_command(*ROWS[name], sft_path, s, d, args, m)
                  for (name, s, m), d in runs.items()}, args.jobs, log_dir)

    # 3. every snapshot, and the SFT model, evaluated the same way
    sft, evals = evaluate_runs(sft_path, {d: s for (_, s, _), d in runs.items()}, seeds, out, None,
                               args)
    key = "eval{}/sampled/accuracy".format
    curves = {name: {m: {n: [(evals[runs[name, s, m]] if m else sft[s])[key(n)] for s in seeds]
                         for n in task.SIZES} for m in [0.0] + minutes}
              for name in rows}  # minute 0: the SFT model every run starts from
    steps = {name: [last_step(runs[name, s, minutes[-1]]) for s in seeds] for name in rows}
    print(write_block(args, argv, curves, list(task.SIZES), seeds, steps))
    print(f"[time_to_accuracy] {time.time() - started:.0f} s in all; {args.results}")


if __name__ == "__main__":
    main()
