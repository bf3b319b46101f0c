"""[CR]'s three TOPR rows as the report ran them, and the experiments that explain their order.

[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning", Table 1 and §3.6 Eq. 4.

    python scripts/topr_report.py --sft runs/sft-countdown-TIME/final     # ~15 min on 2 cores

Every row is one topr.py command from the same SFT checkpoint, seeds 0-2, two runs side by side on
one thread each; the table (docs/RESULTS-topr-report.md) gives held-out accuracy after training,
greedy and sampled at T = 1, 3- and 4-number puzzles, mean +- sd over seeds, and the SFT model's.
  rows 1-3   `--report-variant original | A | A+B`: [CR] §4.1's setting (topr.REPORT_SETTING)
  exp. 1     the same data labelled so that a wrong answer weighs +0.1 (original), 0 (reward B:
             0 for a wrong value, -0.1 invalid, -0.2 no answer) or -1 (pm1), all with c = 0, split 1
  exp. 2     mu sampled at T = 1, top-p 1 instead of T = 0.15, top-p 0.85 (reward original)
  exp. 3     A then B (two rounds) against two rounds of A alone; the A+B row's curve is logged
             every 16 steps (RUN/metrics.jsonl)
  defaults   topr.py's own defaults (6 rounds of 500 prompts x 8 from pi_{i-1}, pm1, c = -0.8)
             at three learning rates (the sweep its --lr default comes from), and at 5e-5 with
             10 rounds, c = -0.5, mu at T = 0.7, or 1,000 prompts x 4 samples a round
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import topr  # noqa: E402

REPORT = [f"--{k.replace('_', '-')}={v}" for k, v in topr.REPORT_SETTING.items()]
ROWS = {  # name: (flags, the sentence the row tests)
    "report: original": (["--report-variant", "original"], "[CR] Table 1 row"),
    "report: A": (["--report-variant", "A"], "[CR] Table 1 row"),
    "report: A then B": (["--report-variant", "A+B", "--eval-every", "16"], "[CR] Table 1 row"),
    "exp 1: wrong = 0 (reward B)": (REPORT + ["--reward", "B"], "what the +0.1 does"),
    "exp 1: wrong = -1 (pm1)": (REPORT + ["--reward", "pm1", "--c", "0", "--split", "1"],
                                "what the +0.1 does"),  # [CR] Eq. 4's c and split, not pm1's
    "exp 2: mu at T = 1": (["--report-variant", "original", "--temperature", "1", "--top-p", "1"],
                           "T = 0.15 against T = 1"),
    "exp 3: A, two rounds": (["--report-variant", "A", "--iterations", "2"], "does B add to A"),
    "defaults, lr 1e-4": (["--lr", "1e-4"], "topr.py's --lr"),
    "defaults, lr 5e-5": (["--lr", "5e-5"], "topr.py's --lr"),
    "defaults, lr 3e-5": (["--lr", "3e-5"], "topr.py's --lr"),
    "defaults, lr 5e-5, 10 rounds": (["--lr", "5e-5", "--iterations", "10"], "more rounds"),
    "defaults, lr 5e-5, c = -0.5": (["--lr", "5e-5", "--c", "-0.5"], "topr.py's --c"),
    "defaults, lr 5e-5, mu at T = 0.7": (["--lr", "5e-5", "--temperature", "0.7"],
                                         "topr.py's --temperature"),
    "defaults, lr 5e-5, 1000 prompts x 4": (["--lr", "5e-5", "--prompts", "1000", "--n", "4"],
                                            "topr.py's --prompts / --n"),
    "defaults, lr 5e-5, c = -0.9": (["--lr", "5e-5", "--c", "-0.9"], "topr.py's --c, p~ higher"),
    "defaults, lr 5e-5, anna-karenina": (["--lr", "5e-5", "--sampling", "anna-karenina"],
                                         "[TOPR] §4.3's selection"),
}
# [CR] Table 1: "average score" (mean reward at T = 0.15 decoding) of the base Qwen2.5-0.5B.
CR_TABLE1 = {"sft": 0.3385, "report: original": 0.2270, "report: A": 0.4060,
             "report: A then B": 0.4849}
KEYS = [("eval3/greedy/accuracy", "3: greedy"), ("eval3/sampled/accuracy", "3: T=1"),
        ("eval4/greedy/accuracy", "4: greedy"), ("eval4/sampled/accuracy", "4: T=1")]


def run(name: str, seed: int, args) -> dict:
    """One topr.py run (or the one already finished in its folder): its first and last
    evaluation rows."""
    slug = "".join(c for c in name.replace(" ", "_") if c.isalnum() or c in "_-.")
    out = os.path.join(args.out, f"{slug}-s{seed}")
    if not os.path.exists(os.path.join(out, "final", "config.json")):
        subprocess.run(["rm", "-rf", out])
        cmd = [sys.executable, "topr.py", "--model", args.sft, "--seed", str(seed), "--threads",
               "1", "--out", out, *ROWS[name][0]]
        with open(out + ".log", "w") as log:
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    evals = [r for r in rows if KEYS[0][0] in r]
    return {"first": evals[0], "last": evals[-1], "curve": evals}


def run_all(run, names: list[str], args) -> dict:
    """run(name, seed, args) for every row and --seeds, two side by side (one thread each):
    name -> its results, seed by seed."""
    args.out, args.sft = os.path.abspath(args.out), os.path.abspath(args.sft)
    os.makedirs(args.out, exist_ok=True)
    jobs = [(name, int(s)) for name in names for s in args.seeds.split(",")]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda job: run(*job, args), jobs))
    results = {}
    for (name, _), r in zip(jobs, done):
        results.setdefault(name, []).append(r)
    return results


def cell(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sft", required=True, help="the SFT checkpoint every row starts from")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=os.path.join("runs", "topr-report"))
    p.add_argument("--doc", default=os.path.join("docs", "RESULTS-topr-report.md"))
    args = p.parse_args()
    results = run_all(run, list(ROWS), args)
    lines = ["# TOPR as [CR] ran it, and why its rows come in their order", "",
             "Generated by `python scripts/topr_report.py --sft SFT` "
             f"(SFT: `{os.path.relpath(args.sft, ROOT)}`, seeds {args.seeds}); do not edit.",
             "Held-out accuracy (%) after training, mean ± sd over seeds; [CR]'s Table 1 figure "
             "is its mean reward at T = 0.15 with the base Qwen2.5-0.5B (not comparable in scale, "
             "only in order).", "",
             "| row | " + " | ".join(label for _, label in KEYS) + " | [CR] Table 1 | tests |",
             "|---" * (len(KEYS) + 3) + "|"]
    first = next(iter(results.values()))
    lines.append("| SFT (start) | " + " | ".join(cell([r["first"][k] for r in first])
                                                  for k, _ in KEYS)
                 + f" | {CR_TABLE1['sft']:.4f} | |")
    for name, runs in results.items():
        cr = f"{CR_TABLE1[name]:.4f}" if name in CR_TABLE1 else ""
        lines.append(f"| {name} | " + " | ".join(cell([r["last"][k] for r in runs])
                                                 for k, _ in KEYS)
                     + f" | {cr} | {ROWS[name][1]} |")
    curve = results["report: A then B"]
    lines += ["", "A then B, greedy accuracy on 3-number puzzles (%) along the run, mean over "
              "seeds (the A round is the first half):", "",
              "| step | " + " | ".join(str(r["step"]) for r in curve[0]["curve"]) + " |",
              "|---" * (len(curve[0]["curve"]) + 1) + "|",
              "| 3: greedy | " + " | ".join(
                  f"{100 * statistics.mean(run['curve'][i][KEYS[0][0]] for run in curve):.1f}"
                  for i in range(len(curve[0]["curve"]))) + " |"]
    notes = os.path.splitext(args.doc)[0] + "-notes.md"  # the hand-written reading, appended
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    with open(args.doc, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
