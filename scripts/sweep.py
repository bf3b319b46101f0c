"""Sweeps: rows of script commands from one SFT checkpoint, the runs behind a default or a claim.

    python scripts/sweep.py topr-report --sft runs/sft-countdown-TIME/final   # ~15 min, 2 cores
    python scripts/sweep.py agro-spo --sft runs/sft-countdown-TIME/final      # ~45 min, 2 cores

Every row is one command of an algorithm script from the same SFT checkpoint, for each of --seeds,
two runs side by side on one thread each, run by scripts/compare.py's runner (a finished run is
kept, so an interrupted sweep goes on where it stopped). The table gives each run's held-out
accuracy at its end (its own last evaluation: 200 problems a size, greedy and 8 samples at T = 1),
mean ± sd over seeds, beside the SFT model's; the hand-written reading (DOC-notes.md) is appended.

  topr-report  docs/RESULTS-topr-report.md: [CR]'s three TOPR rows as the report ran them (Table 1,
               §3.6 Eq. 4) and the experiments that explain their order; each run to its end.
               exp. 1: the same data labelled so that a wrong answer weighs +0.1 (original), 0
               (reward B: 0 a wrong value, -0.1 invalid, -0.2 no answer) or -1 (pm1, c = 0,
               split 1); exp. 2: mu sampled at T = 1, top-p 1 instead of T = 0.15, top-p 0.85;
               exp. 3: A then B against two rounds of A (A+B's curve logged every 16 steps);
               then topr.py's own defaults at three learning rates (its --lr) and variations.
  agro-spo     docs/RESULTS-agro-spo.md: where agro.py's and spo.py's defaults come from, each
               run --minutes of wall clock (default 5: loading, reference samples, SPO's Q0
               estimate and the run's own evaluations included) beside rloo.py; adds pass@8, the
               gain in sampled points as a share of rloo.py's, steps, KL to the SFT model, a plot
               of Figs. 2, 4 and 6 of [AGRO] in miniature (seed 0), and pass@k against k of SFT
               and the final models ([SPO] §5's claim of kept diversity, with its half-online
               row); keeps the time-to-accuracy block scripts/time_to_accuracy.py writes there.

[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning".
[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm",
2025, arXiv:2503.19612. [SPO] Cohen et al., "Soft Policy Optimization: Online Off-Policy RL for
Sequence Models", 2025, arXiv:2503.05453.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from statistics import mean, stdev

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its runner: one command to completion, a finished run kept)
from compare import ROOT, common  # noqa: E402
import topr  # noqa: E402

# ---- The sweeps: name -> (script, flags, what the row tests) ------------------------------------
REPORT = [f"--{k.replace('_', '-')}={v}" for k, v in topr.REPORT_SETTING.items()]  # [CR] §4.1
TOPR_REPORT = {
    "report: original": ("topr.py", ["--report-variant", "original"], "[CR] Table 1 row"),
    "report: A": ("topr.py", ["--report-variant", "A"], "[CR] Table 1 row"),
    "report: A then B": ("topr.py", ["--report-variant", "A+B", "--eval-every", "16"],
                         "[CR] Table 1 row"),
    "exp 1: wrong = 0 (reward B)": ("topr.py", REPORT + ["--reward", "B"], "what the +0.1 does"),
    "exp 1: wrong = -1 (pm1)": ("topr.py", REPORT + ["--reward", "pm1", "--c", "0", "--split", "1"],
                                "what the +0.1 does"),  # [CR] Eq. 4's c and split, not pm1's
    "exp 2: mu at T = 1": ("topr.py", ["--report-variant", "original", "--temperature", "1",
                                       "--top-p", "1"], "T = 0.15 against T = 1"),
    "exp 3: A, two rounds": ("topr.py", ["--report-variant", "A", "--iterations", "2"],
                             "does B add to A"),
    **{f"defaults, lr {lr}": ("topr.py", ["--lr", lr], "topr.py's --lr")
       for lr in ("1e-4", "5e-5", "3e-5")},
    **{f"defaults, lr 5e-5, {name}": ("topr.py", ["--lr", "5e-5", *flags], tests) for name, flags,
       tests in [("10 rounds", ["--iterations", "10"], "more rounds"),
                 ("c = -0.5", ["--c", "-0.5"], "topr.py's --c"),
                 ("mu at T = 0.7", ["--temperature", "0.7"], "topr.py's --temperature"),
                 ("1000 prompts x 4", ["--prompts", "1000", "--group-size", "4"],
                  "topr.py's --prompts / --group-size"),
                 ("c = -0.9", ["--c", "-0.9"], "topr.py's --c, p~ higher"),
                 ("anna-karenina", ["--sampling", "anna-karenina"], "[TOPR] §4.3's selection")]},
}
ON, OFF = ["--mode", "onpolicy"], ["--mode", "offpolicy"]  # agro.py's two modes
AGRO_SPO = {
    "rloo": ("rloo.py", [], "the reference"),
    "rloo-b0.05": ("rloo.py", ["--beta", "0.05"], "RLOO with the KL in the reward (§8.1)"),
    "spo-b0.5": ("spo.py", ["--beta", "0.5"], "spo.py's former default"),
    "spo-b0.087": ("spo.py", ["--beta", "0.087"], "the paper's beta, 1/ln 1e5"),
    "spo-b0.087-p1024-q16": ("spo.py", ["--beta", "0.087", "--train-size", "1024",
                                        "--q0-samples", "16"],
                             "4x the prompts, 1/4 the Q0 samples"),
    "agro-off-b0.3": ("agro.py", OFF + ["--beta", "0.3", "--sizes", "3", "--eval-every", "25"],
                      "agro.py's former off-policy default (3-number puzzles)"),
    "agro-off-b0.1-s34": ("agro.py", OFF + ["--beta", "0.1", "--sizes", "3,4", "--eval-every",
                                            "50"], "off-policy, smaller beta, both sizes"),
    "agro-on-b0.5-default": ("agro.py", ON + ["--beta", "0.5", "--lambda-lr", "1", "--sizes", "3",
                                              "--eval-every", "50"],
                             "agro.py's former on-policy default (beta 0.5, lambda_LR 1)"),
    **{name: ("agro.py", ON + ["--beta", "0.05", "--lambda-lr", lam, "--sizes", "3,4",
                               "--eval-every", "50", *flags], tests)
       for name, lam, flags, tests in [
           ("agro-on-b0.05-k0", "0", [], "on-policy, no g_LR (= RLOO with the KL in the reward, "
            "§8.1)"),
           ("agro-on-b0.05-k0.25", "0.025", [], "on-policy, g_LR at lambda_LR = beta / 2"),
           ("agro-on-b0.05-paper", "1", [], "on-policy as the paper writes it (lambda_LR = 1) at "
            "beta 0.05"),
           ("agro-on-b0.05-k0.25-lr1.2e-4", "0.025", ["--lr", "1.2e-4"],
            "on-policy at twice the lr"),
           ("agro-on-b0.05-k0.25-p64n4", "0.025", ["--prompts", "64", "--group-size", "4"],
            "on-policy, rloo.py's 64 prompts x 4")]},
    "agro-off-b0.3-s34": ("agro.py", OFF + ["--beta", "0.3", "--sizes", "3,4", "--eval-every",
                                            "50"], "off-policy at beta 0.3, both sizes"),
    "spo-b0.2": ("spo.py", ["--beta", "0.2"], "beta between the paper's and 0.5"),
    "spo-b0.087-lr1.2e-4": ("spo.py", ["--beta", "0.087", "--lr", "1.2e-4"],
                            "the paper's beta at twice the lr"),
    # [AGRO] Fig. 6: beta ablated on on-policy samples, for off-policy AGRO's weights (lambda_LR
    # 0), which on fresh samples are also the KL-regularised policy gradient's (§8.1)
    **{f"agro-on-b{b}-k0": ("agro.py", ON + ["--beta", b, "--lambda-lr", "0", "--sizes", "3,4",
                                             "--eval-every", "50"],
                            f"Fig. 6: beta {b} on on-policy samples")
       for b in ("0", "0.02", "0.2", "0.5")},
    # [SPO] §5: half online, half offline (correct samples of pi_0, made by
    # scripts/spo_offline_data.py --correct-only before the run: OFFLINE)
    "spo-mix": ("spo.py", ["--online-fraction", "0.5", "--offline-data", "OFFLINE"],
                "[SPO] §5's half-online run: half of each batch from correct pi_0 samples"),
}
SWEEPS = {  # name: (rows, default seeds and minutes (None: each run to its end), doc, title, intro)
    "topr-report": (
        TOPR_REPORT, "0,1,2", None, "docs/RESULTS-topr-report.md",
        "TOPR as [CR] ran it, and why its rows come in their order",
        "Held-out accuracy (%) after training, mean ± sd over seeds; [CR]'s Table 1 figure is its "
        "mean reward at T = 0.15 with the base Qwen2.5-0.5B (not comparable in scale, only in "
        "order)."),
    "agro-spo": (
        AGRO_SPO, "0", 5.0, "docs/RESULTS-agro-spo.md",
        "agro.py and spo.py beside rloo.py: the runs their defaults come from",
        "Each run: MINUTES minutes of wall clock, one thread, two runs side by side; held-out "
        "accuracy (%) at its end, 200 problems a size, sampled = 8 samples at T = 1 (pass@8 from "
        "the same 8); mean ± sd over seeds. \"% of rloo\" is the run's gain in sampled points "
        "over the SFT model as a share of rloo.py's (3 / 4 numbers)."),
}
OFFLINE = "spo-offline-correct.jsonl"  # in --out: the offline data of the rows that name OFFLINE
SIZES = (3, 4)
KEYS = [(f"eval{n}/{mode}/accuracy", f"{n}: {label}") for n in SIZES
        for mode, label in (("greedy", "greedy"), ("sampled", "T=1"))]
PASS_KEYS = [(f"eval{n}/pass@8", f"{n}: pass@8") for n in SIZES]  # [SPO]'s diversity claim
# [CR] Table 1: "average score" (mean reward at T = 0.15 decoding) of the base Qwen2.5-0.5B.
CR_TABLE1 = {"sft": 0.3385, "report: original": 0.2270, "report: A": 0.4060,
             "report: A then B": 0.4849}
TIME_START, TIME_END = "<!-- time-to-accuracy:start -->", "<!-- time-to-accuracy:end -->"


# ---- Running: every row and seed, two side by side ---------------------------------------------
def run(name: str, seed: int, args) -> dict:
    """One run to completion (or the finished one in its folder): its evaluation rows."""
    script, flags, _ = args.commands[name]
    slug = "".join(c for c in name.replace(" ", "_") if c.isalnum() or c in "_-.")
    out = os.path.join(args.out, f"{slug}-s{seed}")
    flags = [os.path.join(args.out, OFFLINE) if f == "OFFLINE" else f for f in flags]
    limit = ["--time-limit", f"{args.minutes:g}"] if args.minutes else []
    cmd = [sys.executable, script, "--model", args.sft, "--seed", str(seed), "--threads", "1",
           *limit, "--out", out, *flags]
    compare.run_script(os.path.basename(out), cmd, out, args.out)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    evals = [r for r in rows if KEYS[0][0] in r]
    return {"first": evals[0], "last": evals[-1], "steps": rows[-1]["step"], "curve": evals,
            "out": out}


def run_all(names: list[str], seeds: list[int], args) -> dict:
    """name -> its runs' results, seed by seed."""
    jobs = [(name, seed) for name in names for seed in seeds]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda job: run(*job, args), jobs))
    results = {}
    for (name, _), r in zip(jobs, done):
        results.setdefault(name, []).append(r)
    return results


def cell(values: list[float]) -> str:
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
                 "| step | " + " | ".join(map(str, steps)) + " |", "|---" * (len(steps) + 1) + "|",
                 "| 3: greedy | " + " | ".join(f"{100 * mean(c[i][KEYS[0][0]] for c in curves):.1f}"
                                              for i in range(len(steps))) + " |"]
    return ["[CR] Table 1"], {"sft": [f"{CR_TABLE1['sft']:.4f}"], **extra}, lines


def agro_spo_lines(results: dict, args) -> tuple[list, dict, list]:
    """Each row's gain as a share of rloo.py's, its steps and KL; the plot, the commands and the
    pass@k table."""
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
    png = os.path.splitext(args.doc)[0] + ".png"
    plot(results, png)
    lines = ["", f"![AGRO's figures in miniature]({os.path.basename(png)})", "",
             f"Commands (each with `--model SFT --seed S --threads 1 --time-limit "
             f"{args.minutes:g}`):", ""]
    for name in results:
        script, flags, _ = args.commands[name]
        lines.append(f"- {name}: `python {shlex.join([script, *flags])}`")
    return ["% of rloo", "steps", "KL to SFT"], extra, lines + pass_table(results, args)


FIGURES = {  # panel title: (x, rows), seed 0's evaluations along each run
    "[AGRO] Fig. 2's three variants at beta 0.05": (
        "step", {"rloo-b0.05": "RLOO, KL in the reward (rloo.py)",
                 "agro-on-b0.05-k0": "off-policy AGRO on on-policy samples",
                 "agro-on-b0.05-k0.25": "on-policy AGRO (lambda_LR = beta/2)"}),
    "[AGRO] Fig. 4's shape: accuracy against KL": (
        "kl_to_ref", {"agro-on-b0.05-k0.25": "on-policy, beta 0.05",
                      "agro-off-b0.1-s34": "off-policy, beta 0.1",
                      "agro-off-b0.3-s34": "off-policy, beta 0.3"}),
    **{f"[AGRO] Fig. 6's shape: beta on on-policy samples, by {x}": (
        x, {f"agro-on-b{b}-k0": f"beta {b}" for b in ("0", "0.02", "0.05", "0.2", "0.5")})
       for x in ("step", "kl_to_ref")},
}


def plot(results: dict, path: str) -> None:
    """Held-out sampled accuracy on 3-number puzzles along the runs FIGURES names."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, (len(FIGURES) + 1) // 2, figsize=(12, 8.4),
                             constrained_layout=True)
    for ax, (title, (x, rows)) in zip(axes.flat, FIGURES.items()):
        for name, label in rows.items():
            if name in results:
                curve = results[name][0]["curve"]
                ax.plot([r[x] for r in curve], [100 * r[KEYS[1][0]] for r in curve], marker="o",
                        label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step" if x == "step" else "KL to the SFT model (nats a sequence)")
        ax.set_ylabel("held-out accuracy, 3 numbers, T = 1 (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)


PASS_ROWS = ("rloo", "spo-b0.087", "spo-mix", "agro-on-b0.05-k0.25")  # [SPO]'s diversity claim
PASS_K = (1, 2, 4, 8)


def pass_at_ks(model_path: str) -> dict:
    """pass@k, k = 1..8, of a model on the held-out sets (the runs' own: seed 0, 200 problems a
    size), from 8 samples at T = 1 a problem drawn with seed 0; cached beside the model."""
    cache = os.path.join(model_path, "pass_at_k.json")
    if os.path.exists(cache):
        return compare.read_json(cache)
    from tasks import get_task, scoring
    model, tok = common.load_model(model_path)
    task, out = get_task("countdown"), {}
    engine = common.make_engine("auto", model, tok, model_path)
    for size in SIZES:
        problems = task.get_problems("test", 200, size=size, seed=0)
        prompts = common.encode_prompts(task, problems, tok, common.prompt_style(model, tok))
        groups = engine.generate(prompts, common.SamplingConfig(8, 64, seed=0))
        wins = [sum(task.is_correct(p, s.text) for s in g) for p, g in zip(problems, groups)]
        out[str(size)] = [mean(scoring.pass_at_k(8, c, k) for c in wins) for k in range(1, 9)]
    compare.write_json(cache, out)
    return out


def pass_table(results: dict, args) -> list[str]:
    """[SPO]'s diversity claim in miniature: pass@k against k, SFT and the final models (seed 0)."""
    models = {"SFT (start)": args.sft, **{name: os.path.join(results[name][0]["out"], "final")
                                         for name in PASS_ROWS if name in results}}
    head = [f"{size}: pass@{k}" for size in SIZES for k in PASS_K]
    lines = ["", "pass@k at the end of the runs (seed 0): 8 samples at T = 1 a held-out problem, "
             "the unbiased estimator; \"gap\" = pass@8 - pass@1, the diversity [SPO] §5 says SPO "
             "keeps where a policy gradient method loses it.", "",
             "| model | " + " | ".join(head) + " | 3: gap | 4: gap |",
             "|---" * (len(head) + 3) + "|"]
    for name, path in models.items():
        pk = pass_at_ks(path)
        cells = [f"{100 * pk[str(size)][k - 1]:.1f}" for size in SIZES for k in PASS_K]
        gaps = [f"{100 * (pk[str(size)][7] - pk[str(size)][0]):.1f}" for size in SIZES]
        lines.append(f"| {name} | " + " | ".join(cells + gaps) + " |")
    return lines


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
    args.commands, seeds, minutes, doc, title, intro = SWEEPS[args.sweep]
    args.seeds, args.doc = args.seeds or seeds, args.doc or doc
    args.minutes = args.minutes or minutes
    args.out = os.path.abspath(args.out or os.path.join("runs", args.sweep))
    args.sft = os.path.abspath(args.sft)
    names = args.rows.split(",") if args.rows else list(args.commands)
    unknown = [n for n in names if n not in args.commands]
    if unknown or (args.sweep == "agro-spo" and "rloo" not in names):
        p.error(f"--rows: unknown {unknown}; choose from {', '.join(args.commands)}"
                + (" (rloo included)" if args.sweep == "agro-spo" else ""))
    if not os.path.exists(os.path.join(args.sft, "config.json")):
        p.error(f"--sft {args.sft}: no model there")
    os.makedirs(args.out, exist_ok=True)
    offline = os.path.join(args.out, OFFLINE)
    if any("OFFLINE" in args.commands[name][1] for name in names) and not os.path.exists(offline):
        subprocess.run([sys.executable, "scripts/spo_offline_data.py", "--model", args.sft,
                        "--out", offline, "--correct-only"], cwd=ROOT, check=True)
    results = run_all(names, [int(s) for s in args.seeds.split(",")], args)

    head, extra, more = (topr_report_lines if args.sweep == "topr-report" else agro_spo_lines)(
        results, args)
    keys = KEYS + (PASS_KEYS if args.sweep == "agro-spo" else [])
    limit = f" --minutes {args.minutes:g}" if args.minutes else ""
    first = next(iter(results.values()))
    lines = [f"# {title}", "", f"Generated by `python scripts/sweep.py {args.sweep} --sft SFT "
             f"--seeds {args.seeds}{limit}` (SFT: `{os.path.relpath(args.sft, ROOT)}`); do not "
             "edit. " + intro.replace("MINUTES", f"{args.minutes or 0:g}"), "",
             "| row | " + " | ".join([label for _, label in keys] + head) + " | tests |",
             "|---" * (len(keys) + len(head) + 2) + "|",
             "| SFT (start) | " + " | ".join([cell([r["first"][k] for r in first])
                                             for k, _ in keys] + extra["sft"]) + " | |"]
    for name, runs in results.items():
        lines.append(f"| {name} | " + " | ".join([cell([r["last"][k] for r in runs])
                                                 for k, _ in keys] + extra[name])
                     + f" | {args.commands[name][2]} |")
    lines += more
    notes = os.path.splitext(args.doc)[0] + "-notes.md"  # the hand-written reading, appended
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    if os.path.exists(args.doc):  # keep the block scripts/time_to_accuracy.py writes there
        old = open(args.doc).read()
        if TIME_START in old and TIME_END in old:
            lines += ["", old[old.index(TIME_START):old.index(TIME_END) + len(TIME_END)]]
    with open(args.doc, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
