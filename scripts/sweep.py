"""Sweeps: rows of script commands from one SFT checkpoint, the runs behind a default or a claim.

    python scripts/sweep.py topr-report --sft runs/sft-countdown-TIME/final   # ~40 min, 2 cores
    python scripts/sweep.py agro-spo --sft runs/sft-countdown-TIME/final      # ~40 min, 2 cores

Every row (data in docs/sweeps.toml) is one command of an algorithm script from the same SFT
checkpoint, for each of --seeds, two runs side by side on one thread each, run by scripts/lab.py's
runner (a finished run is kept, so an interrupted sweep goes on where it stopped). The table gives
each run's held-out accuracy at its end (its own last evaluation: 200 problems a size, greedy and 8
samples at T = 1), mean ± sd over seeds, beside the SFT model's; the hand-written reading
(DOC-notes.md) is appended.

  topr-report  docs/RESULTS-topr-report.md: [CR]'s three TOPR rows as the report ran them (Table 1,
               §3.6 Eq. 4) and the experiments that explain their order; each run to its end.
               exp. 1: the same data labelled so that a wrong answer weighs +0.1 (original), 0
               (reward B: 0 a wrong value, -0.1 invalid, -0.2 no answer) or -1 (pm1, c = 0,
               split 1); exp. 2: mu sampled at T = 1, top-p 1 instead of T = 0.15, top-p 0.85;
               exp. 3: A then B against two rounds of A (A+B's curve logged every 16 steps);
               then topr.py's own defaults ([TOPR] §4.3's Anna Karenina selection, 1,000 of
               4,000 samples kept a round) at three learning rates (its --lr) and variations.
  agro-spo     docs/RESULTS-agro-spo.md: where agro.py's and spo.py's defaults come from, each
               run --minutes of wall clock (default 5: loading, reference samples, SPO's Q0
               estimate and the run's own evaluations included) beside rloo.py; adds pass@8, the
               gain in sampled points as a share of rloo.py's (our measure, not the papers'),
               steps and KL to the SFT model; keeps the time-to-accuracy block
               scripts/time_to_accuracy.py writes there. The papers' own claims, run like for
               like, are scripts/claims.py's (docs/CLAIMS.md).

[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning".
[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm",
2025, arXiv:2503.19612. [SPO] Cohen et al., "Soft Policy Optimization: Online Off-Policy RL for
Sequence Models", 2025, arXiv:2503.05453.
"""
import argparse
import json
import os
import shlex
import sys
import time
import tomllib
from statistics import mean, stdev

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab import (ROOT, commit, machine, md_table, run_commands, script_command,  # noqa: E402
                 write_doc)
sys.path.insert(0, ROOT)
import common  # noqa: E402
import topr  # noqa: E402

# ---- The sweeps: data in docs/sweeps.toml -------------------------------------------------------
SWEEPS_FILE = os.path.join(ROOT, "docs", "sweeps.toml")
REPORT = [f"--{k.replace('_', '-')}={v}" for k, v in topr.REPORT_SETTING.items()]  # [CR] §4.1


def load_sweeps() -> dict:
    """name -> its settings (seeds, minutes, doc, title, intro) and rows, each row's name ->
    (script, flags, what the row tests); a row with report_setting has REPORT before its flags."""
    with open(SWEEPS_FILE, "rb") as f:
        sweeps = tomllib.load(f)
    for sweep in sweeps.values():
        for name, row in sweep["rows"].items():
            script, *flags = shlex.split(row["command"])
            before = REPORT if row.get("report_setting") else []
            sweep["rows"][name] = (script, before + flags, row["tests"])
    return sweeps


SWEEPS = load_sweeps()

SIZES = (3, 4)
KEYS = [(f"eval{n}/{mode}/accuracy", f"{n}: {label}") for n in SIZES
        for mode, label in (("greedy", "greedy"), ("sampled", "T=1"))]
PASS_KEYS = [(f"eval{n}/pass@8", f"{n}: pass@8") for n in SIZES]  # [SPO]'s diversity claim
# [CR] Table 1: "average score" (mean reward at T = 0.15 decoding) of the base Qwen2.5-0.5B.
CR_TABLE1 = {"sft": 0.3385, "report: original": 0.2270, "report: A": 0.4060,
             "report: A then B": 0.4849}


# ---- Running: every row and seed, two side by side ---------------------------------------------
def run_all(names: list[str], seeds: list[int], args) -> dict:
    """name -> its runs, seed by seed, each to completion (or the finished one in its folder): its
    own first and last evaluation, its steps, its evaluations along the way."""
    runs = {}  # (name, seed) -> its folder, named by the name's letters, digits and _-.
    for name in names:
        slug = "".join(c for c in name.replace(" ", "_") if c.isalnum() or c in "_-.")
        runs.update({(name, seed): os.path.join(args.out, f"{slug}-s{seed}") for seed in seeds})
    run_commands({out: script_command(*args.commands[name][:2], args.sft, seed, out, args,
                                      args.minutes) for (name, seed), out in runs.items()},
                 2, args.out)
    results = {}
    for (name, _), out in runs.items():
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        evals = [r for r in rows if KEYS[0][0] in r]
        results.setdefault(name, []).append({"first": evals[0], "last": evals[-1], "curve": evals,
                                             "steps": rows[-1]["step"], "out": out})
    return results


def cell(values: list[float]) -> str:
    """100 x mean ± sd: not lab.mean_sd(values, 100), which means the scaled values (a tie can
    round the other way)."""
    sd = f" ± {100 * stdev(values):.1f}" if len(values) > 1 else ""
    return f"{100 * mean(values):.1f}{sd}"


# ---- What each sweep adds to its table -----------------------------------------------------------
def topr_report_lines(results: dict, args) -> tuple[list, dict, list]:
    """[CR] Table 1's figure beside each row, and the A then B row's curve."""
    extra = {name: [f"{CR_TABLE1[name]:.4f}" if name in CR_TABLE1 else ""] for name in results}
    lines = []
    if "report: A then B" in results:
        curves = [r["curve"] for r in results["report: A then B"]]
        steps = [r["step"] for r in curves[0]]
        lines = ["", "A then B, greedy accuracy on 3-number puzzles (%) along the run, mean over "
                 "seeds (the A round is the first half):", "",
                 *md_table(["step", *map(str, steps)],
                           [["3: greedy", *(f"{100 * mean(c[i][KEYS[0][0]] for c in curves):.1f}"
                                            for i in range(len(steps)))]])]
    return ["[CR] Table 1"], {"sft": [f"{CR_TABLE1['sft']:.4f}"], **extra}, lines


def agro_spo_lines(results: dict, args) -> tuple[list, dict, list]:
    """Each row's gain as a share of rloo.py's, its steps and KL; the commands."""
    sampled = [k for k, label in KEYS if "T=1" in label]
    start = {k: mean([r["first"][k] for r in results["rloo"]]) for k in sampled}
    rloo_gain = {k: mean([r["last"][k] for r in results["rloo"]]) - start[k] for k in sampled}
    extra = {"sft": ["", "", ""]}
    for name, runs in results.items():
        share = " / ".join(
            f"{100 * (mean([r['last'][k] for r in runs]) - start[k]) / rloo_gain[k]:.0f}"
            if rloo_gain[k] > 0 else "-" for k in sampled)
        kl = [r["last"]["kl_to_ref"] for r in runs if "kl_to_ref" in r["last"]]
        extra[name] = [share, f"{mean([r['steps'] for r in runs]):.0f}",
                       f"{mean(kl):.2f}" if kl else ""]
    lines = ["", f"Commands (each with `--model SFT --seed S --threads 1 --time-limit "
             f"{args.minutes:g}`):", ""]
    for name in results:
        script, flags, _ = args.commands[name]
        lines.append(f"- {name}: `python {shlex.join([script, *flags])}`")
    return ["% of rloo", "steps", "KL to SFT"], extra, lines


# ---- The doc -------------------------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", choices=SWEEPS)
    p.add_argument("--sft", required=True, help="the SFT checkpoint every row starts from")
    p.add_argument("--rows", default=None, help="comma-separated subset of the sweep's rows")
    p.add_argument("--seeds", default=None, help="comma-separated (default: the sweep's)")
    p.add_argument("--minutes", type=common.positive_float, default=None,
                   help="wall clock of each run (default: the sweep's)")
    p.add_argument("--out", default=None, help="run folder (default runs/SWEEP)")
    p.add_argument("--doc", default=None, help="the generated file (default: the sweep's)")
    args = p.parse_args(argv)
    sweep = SWEEPS[args.sweep]
    args.commands, args.seeds = sweep["rows"], args.seeds or sweep["seeds"]
    args.minutes = args.minutes or sweep.get("minutes")  # none: each run to its end
    args.doc = args.doc or sweep["doc"]
    args.out = os.path.abspath(args.out or os.path.join("runs", args.sweep))
    args.sft = os.path.abspath(args.sft)
    args.task, args.threads, args.engine = "countdown", 1, "auto"  # every run: one thread each
    names = args.rows.split(",") if args.rows else list(args.commands)
    unknown = [n for n in names if n not in args.commands]
    if unknown or (args.sweep == "agro-spo" and "rloo" not in names):
        p.error(f"--rows: unknown {unknown}; choose from {', '.join(args.commands)}"
                + (" (rloo included)" if args.sweep == "agro-spo" else ""))
    if not os.path.exists(os.path.join(args.sft, "config.json")):
        p.error(f"--sft {args.sft}: no model there")
    os.makedirs(args.out, exist_ok=True)
    results = run_all(names, [int(s) for s in args.seeds.split(",")], args)

    head, extra, more = (topr_report_lines if args.sweep == "topr-report" else agro_spo_lines)(
        results, args)
    keys = KEYS + (PASS_KEYS if args.sweep == "agro-spo" else [])
    limit = f" --minutes {args.minutes:g}" if args.minutes else ""
    first = next(iter(results.values()))
    lines = [f"# {sweep['title']}", "", f"Generated by `python scripts/sweep.py {args.sweep} --sft "
             f"SFT --seeds {args.seeds}{limit}` (SFT: `{os.path.relpath(args.sft, ROOT)}`); do not "
             "edit. " + sweep["intro"].replace("MINUTES", f"{args.minutes or 0:g}"), "",
             f"Commit {commit()}, {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {machine()}.", "",
             "| row | " + " | ".join([label for _, label in keys] + head) + " | tests |",
             "|---" * (len(keys) + len(head) + 2) + "|",
             "| SFT (start) | " + " | ".join([cell([r["first"][k] for r in first])
                                             for k, _ in keys] + extra["sft"]) + " | |"]
    for name, runs in results.items():
        lines.append(f"| {name} | " + " | ".join([cell([r["last"][k] for r in runs])
                                                 for k, _ in keys] + extra[name])
                     + f" | {args.commands[name][2]} |")
    lines += more  # then the hand-written reading and time_to_accuracy.py's block (lab.write_doc)
    print(write_doc(args.doc, "\n".join(lines)))


if __name__ == "__main__":
    main()
