"""Where agro.py's and spo.py's defaults come from: short runs of each setting beside rloo.py.

    python scripts/agro_spo_sweep.py --sft runs/sft-countdown-TIME/final        # ~45 min, 2 cores

Every row is one command from the same SFT checkpoint, `--time-limit` minutes of wall clock
(default 5: loading, reference samples, SPO's Q0 estimate and the run's own evaluations included),
two runs side by side on one thread each, seed 0 unless --seeds says more. The table
(docs/RESULTS-agro-spo.md) gives each run's held-out accuracy at its end, greedy and sampled at
T = 1 on 3- and 4-number puzzles, pass@8, its gain in sampled points as a share of rloo.py's, the
optimizer steps it took and its KL to the SFT model, with a plot of Figs. 2, 4 and 6 of [AGRO] in
miniature (seed 0), and pass@k against k of SFT and the final models ([SPO] §5's claim of kept
diversity, with its half-online row); the hand-written reading (RESULTS-agro-spo-notes.md) is
appended, and the time-to-accuracy block that `scripts/time_to_accuracy.py --results` writes into
the same file is kept. An interrupted sweep keeps its finished runs.

[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm",
2025, arXiv:2503.19612. [SPO] Cohen et al., "Soft Policy Optimization: Online Off-Policy RL for
Sequence Models", 2025, arXiv:2503.05453.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from statistics import mean

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from topr_report import run_all  # noqa: E402  (every row and seed, two runs side by side)
ROWS = {  # name: (script, flags, what the row tests)
    "rloo": ("rloo.py", [], "the reference"),
    "rloo-b0.05": ("rloo.py", ["--beta", "0.05"], "RLOO with the KL in the reward (§8.1)"),
    "spo-b0.5": ("spo.py", ["--beta", "0.5"], "spo.py's former default"),
    "spo-b0.087": ("spo.py", ["--beta", "0.087"], "the paper's beta, 1/ln 1e5"),
    "spo-b0.087-p1024-q16": ("spo.py", ["--beta", "0.087", "--train-prompts", "1024",
                                        "--q0-samples", "16"],
                             "4x the prompts, 1/4 the Q0 samples"),
    "agro-off-b0.3": ("agro.py", ["--beta", "0.3", "--sizes", "3", "--eval-every", "25"],
                      "agro.py's former off-policy default (3-number puzzles)"),
    "agro-off-b0.1-s34": ("agro.py", ["--beta", "0.1", "--sizes", "3,4", "--eval-every", "50"],
                          "off-policy, smaller beta, both sizes"),
    "agro-on-b0.5-default": ("agro.py", ["--mode", "onpolicy", "--beta", "0.5", "--lambda-lr",
                                         "1", "--sizes", "3", "--eval-every", "50"],
                             "agro.py's former on-policy default (beta 0.5, lambda_LR 1)"),
    "agro-on-b0.05-k0": ("agro.py", ["--mode", "onpolicy", "--beta", "0.05", "--lambda-lr", "0",
                                     "--sizes", "3,4", "--eval-every", "50"],
                         "on-policy, no g_LR (= RLOO with the KL in the reward, §8.1)"),
    "agro-on-b0.05-k0.25": ("agro.py", ["--mode", "onpolicy", "--beta", "0.05", "--lambda-lr",
                                        "0.025", "--sizes", "3,4", "--eval-every", "50"],
                            "on-policy, g_LR at lambda_LR = beta / 2"),
    "agro-on-b0.05-paper": ("agro.py", ["--mode", "onpolicy", "--beta", "0.05", "--lambda-lr",
                                        "1", "--sizes", "3,4", "--eval-every", "50"],
                            "on-policy as the paper writes it (lambda_LR = 1) at beta 0.05"),
    "agro-on-b0.05-k0.25-lr1.2e-4": ("agro.py", ["--mode", "onpolicy", "--beta", "0.05",
                                                 "--lambda-lr", "0.025", "--sizes", "3,4",
                                                 "--eval-every", "50", "--lr", "1.2e-4"],
                                     "on-policy at twice the lr"),
    "agro-on-b0.05-k0.25-p64n4": ("agro.py", ["--mode", "onpolicy", "--beta", "0.05",
                                              "--lambda-lr", "0.025", "--sizes", "3,4",
                                              "--eval-every", "50", "--prompts", "64", "--n", "4"],
                                  "on-policy, rloo.py's 64 prompts x 4"),
    "agro-off-b0.3-s34": ("agro.py", ["--beta", "0.3", "--sizes", "3,4", "--eval-every", "50"],
                          "off-policy at beta 0.3, both sizes"),
    "spo-b0.2": ("spo.py", ["--beta", "0.2"], "beta between the paper's and 0.5"),
    "spo-b0.087-lr1.2e-4": ("spo.py", ["--beta", "0.087", "--lr", "1.2e-4"],
                            "the paper's beta at twice the lr"),
    # [AGRO] Fig. 6: beta ablated on on-policy samples, for off-policy AGRO's weights (lambda_LR
    # 0), which on fresh samples are also the KL-regularised policy gradient's (§8.1)
    **{f"agro-on-b{b}-k0": ("agro.py", ["--mode", "onpolicy", "--beta", b, "--lambda-lr", "0",
                                        "--sizes", "3,4", "--eval-every", "50"],
                            f"Fig. 6: beta {b} on on-policy samples")
       for b in ("0", "0.02", "0.2", "0.5")},
    # [SPO] §5: half online, half offline (correct samples of pi_0, made by
    # scripts/spo_offline_data.py --correct-only before the run: OFFLINE)
    "spo-mix": ("spo.py", ["--online-fraction", "0.5", "--offline-data", "OFFLINE"],
                "[SPO] §5's half-online run: half of each batch from correct pi_0 samples"),
}
OFFLINE = "spo-offline-correct.jsonl"  # in --out: the offline data of the rows that name OFFLINE
TIME_START, TIME_END = "<!-- time-to-accuracy:start -->", "<!-- time-to-accuracy:end -->"
KEYS = [("eval3/greedy/accuracy", "3: greedy"), ("eval3/sampled/accuracy", "3: T=1"),
        ("eval4/greedy/accuracy", "4: greedy"), ("eval4/sampled/accuracy", "4: T=1"),
        ("eval3/pass@8", "3: pass@8"), ("eval4/pass@8", "4: pass@8")]  # [SPO]'s diversity claim


def run(name: str, seed: int, args) -> dict:
    """One run (or the finished one in its folder): its first and last evaluations, its steps."""
    out = os.path.join(args.out, name if seed == 0 else f"{name}-s{seed}")
    if not os.path.exists(os.path.join(out, "final", "config.json")):
        subprocess.run(["rm", "-rf", out])
        script, flags, _ = ROWS[name]
        flags = [os.path.join(args.out, OFFLINE) if f == "OFFLINE" else f for f in flags]
        cmd = [sys.executable, script, "--model", args.sft, "--seed", str(seed), "--threads", "1",
               "--time-limit", f"{args.minutes:g}", "--out", out, *flags]
        with open(out + ".log", "w") as log:
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    evals = [r for r in rows if KEYS[0][0] in r]
    return {"first": evals[0], "last": evals[-1], "steps": rows[-1]["step"], "curve": evals,
            "out": out}


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
        return json.load(open(cache))
    sys.path.insert(0, ROOT)
    import common
    from tasks import get_task, scoring
    model, tok = common.load_model(model_path)
    task, out = get_task("countdown"), {}
    engine = common.make_engine("auto", model, tok, model_path)

    for size in task.SIZES:
        problems = task.get_problems("test", 200, size=size, seed=0)
        prompts = common.encode_prompts(task, problems, tok, common.prompt_style(model, tok))
        groups = engine.generate(prompts, common.SamplingConfig(8, 64, seed=0))
        wins = [sum(task.is_correct(p, s.text) for s in g) for p, g in zip(problems, groups)]
        out[str(size)] = [mean(scoring.pass_at_k(8, c, k) for c in wins) for k in range(1, 9)]
    with open(cache + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(cache + ".tmp", cache)
    return out


def pass_table(results: dict, args) -> list[str]:
    """[SPO]'s diversity claim in miniature: pass@k against k, SFT and the final models (seed 0)."""
    models = {"SFT (start)": args.sft, **{name: os.path.join(results[name][0]["out"], "final")
                                         for name in PASS_ROWS if name in results}}
    head = [f"{size}: pass@{k}" for size in ("3", "4") for k in PASS_K]
    lines = ["", "pass@k at the end of the runs (seed 0): 8 samples at T = 1 a held-out problem, "
             "the unbiased estimator; \"gap\" = pass@8 - pass@1, the diversity [SPO] §5 says SPO "
             "keeps where a policy gradient method loses it.", "",
             "| model | " + " | ".join(head) + " | 3: gap | 4: gap |",
             "|---" * (len(head) + 3) + "|"]
    for name, path in models.items():
        pk = pass_at_ks(path)
        cells = [f"{100 * pk[size][k - 1]:.1f}" for size in ("3", "4") for k in PASS_K]
        gaps = [f"{100 * (pk[size][7] - pk[size][0]):.1f}" for size in ("3", "4")]
        lines.append(f"| {name} | " + " | ".join(cells + gaps) + " |")
    return lines


def cell(values: list[float]) -> str:
    sd = f" ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{100 * mean(values):.1f}{sd}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sft", required=True, help="the SFT checkpoint every row starts from")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of the rows")
    p.add_argument("--seeds", default="0")
    p.add_argument("--minutes", type=float, default=5.0, help="wall clock of each run")
    p.add_argument("--out", default=os.path.join("runs", "agro-spo-sweep"))
    p.add_argument("--doc", default=os.path.join("docs", "RESULTS-agro-spo.md"))
    args = p.parse_args()
    names = args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown or "rloo" not in names:
        p.error(f"--rows: unknown {unknown}; choose from {', '.join(ROWS)} (rloo included)")
    offline = os.path.join(os.path.abspath(args.out), OFFLINE)
    if any("OFFLINE" in ROWS[name][1] for name in names) and not os.path.exists(offline):
        os.makedirs(args.out, exist_ok=True)  # [SPO] §5's offline data: correct samples of pi_0
        subprocess.run([sys.executable, "scripts/spo_offline_data.py", "--model", args.sft,
                        "--out", offline, "--correct-only"], cwd=ROOT, check=True)
    results = run_all(run, names, args)  # two runs side by side, one thread each
    sampled = [k for k, label in KEYS if "T=1" in label]
    start = {k: mean([r["first"][k] for r in results["rloo"]]) for k, _ in KEYS}
    rloo_gain = {k: mean([r["last"][k] for r in results["rloo"]]) - start[k] for k in sampled}
    lines = ["# agro.py and spo.py beside rloo.py: the runs their defaults come from", "",
             f"Generated by `python scripts/agro_spo_sweep.py --sft SFT --seeds {args.seeds} "
             f"--minutes {args.minutes:g}` (SFT: `{os.path.relpath(args.sft, ROOT)}`); do not "
             f"edit. Each run: {args.minutes:g} minutes of wall clock, one thread, two runs side "
             "by side; held-out accuracy (%) at its end, 200 problems a size, sampled = 8 samples "
             "at T = 1 (pass@8 from the same 8); mean ± sd over seeds. \"% of rloo\" is the "
             "run's gain in sampled points over the SFT model as a share of rloo.py's (3 / 4 "
             "numbers).", "",
             "| row | " + " | ".join(label for _, label in KEYS)
             + " | % of rloo | steps | KL to SFT | tests |", "|---" * (len(KEYS) + 5) + "|",
             "| SFT (start) | " + " | ".join(f"{100 * start[k]:.1f}" for k, _ in KEYS)
             + " | | | | |"]
    for name, runs in results.items():
        share = " / ".join(
            f"{100 * (mean([r['last'][k] for r in runs]) - start[k]) / rloo_gain[k]:.0f}"
            if rloo_gain[k] > 0 else "-" for k in sampled)
        kl = [r["last"]["kl_to_ref"] for r in runs if "kl_to_ref" in r["last"]]
        lines.append(f"| {name} | " + " | ".join(cell([r["last"][k] for r in runs])
                                                 for k, _ in KEYS)
                     + f" | {share} | {mean([r['steps'] for r in runs]):.0f} | "
                     + (f"{mean(kl):.2f}" if kl else "") + f" | {ROWS[name][2]} |")
    png = os.path.splitext(args.doc)[0] + ".png"
    plot(results, png)
    lines += ["", f"![AGRO's figures in miniature]({os.path.basename(png)})",
              "", "Commands (each with `--model SFT --seed S --threads 1 --time-limit "
              f"{args.minutes:g}`):", ""]
    lines += [f"- {name}: `python {shlex.join([ROWS[name][0], *ROWS[name][1]])}`"
              for name in results]
    lines += pass_table(results, args)
    notes = os.path.splitext(args.doc)[0] + "-notes.md"  # the hand-written reading, appended
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    if os.path.exists(args.doc):  # keep the block scripts/time_to_accuracy.py writes here
        old = open(args.doc).read()
        if TIME_START in old and TIME_END in old:
            lines += ["", old[old.index(TIME_START):old.index(TIME_END) + len(TIME_END)]]
    with open(args.doc, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
