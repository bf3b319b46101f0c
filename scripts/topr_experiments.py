"""[TOPR]'s two claims in miniature, on ONE off-policy dataset sampled once from the SFT model.

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement
       learning for LLMs", 2025, arXiv:2503.14286.

1. Central claim ([TOPR] §2.1, Prop. 3.2, Fig. 1): with rewards +1/-1 and several epochs over the
   same samples, naive off-policy REINFORCE (no ratio, Eq. 3) pushes the negatives' probability
   towards 0 without limit and drags format rate and accuracy below the SFT model's; TOPR (Eq. 8)
   does not.
2. Dataset composition ([TOPR] §3.1, Eqs. 9-12): the baseline c re-weights positives against
   negatives. Each c gives an effective positive share p~; one TOPR run per c.

    python scripts/topr_experiments.py --model runs/sft-countdown-.../final

Defaults: 500 prompts x 8 samples, 4 epochs, lr 1e-4; the naive-vs-TOPR table at c = 0 ([TOPR]'s
setting) and at c = -0.8; TOPR for c in {-0.8, -0.5, 0, 0.5}: six runs. Every run is an ordinary
topr.py run (its folder, metrics.jsonl and final/ model) under --out; the first one samples the
dataset (OUT/topr-c0/data-0.jsonl) and the others train on that file with --data. The tables are
printed and written to OUT/summary.md. Sampled accuracy is at temperature 1 on held-out puzzles.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import topr  # noqa: E402


def metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def evals(run_dir, size):
    return [m for m in metrics(run_dir) if f"eval{size}/sampled/accuracy" in m]


def pct(m, key):
    return f"{100 * m[key]:.1f}%"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="sft")
    p.add_argument("--out", default=os.path.join(
        "runs", f"topr-experiments-{time.strftime('%Y%m%d-%H%M%S')}"))
    p.add_argument("--prompts", default="500", help="prompts sampled once (x --group-size samples)")
    p.add_argument("--group-size", default="8", help="completions a prompt")
    p.add_argument("--sizes", default="3,4",
                   help="difficulty levels of the dataset and of the evaluation (the first two "
                        "are tabulated)")
    p.add_argument("--epochs", type=int, default=4, help="passes over the one dataset")
    p.add_argument("--lr", default="1e-4")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--c", default="-0.8,-0.5,0,0.5", help="baselines for the composition table")
    p.add_argument("--c-main", default="0,-0.8",
                   help="baselines of the naive-vs-TOPR tables (the first one samples the dataset)")
    p.add_argument("--eval-size", default="200")
    p.add_argument("--eval-k", default="8")
    p.add_argument("--engine", default="hf")
    p.add_argument("--data", default=None, help="train every run on this sample file")
    args, extra = p.parse_known_args()  # anything else goes to every topr.py run

    cs = [float(c) for c in args.c.split(",")]
    mains = [float(c) for c in args.c_main.split(",")]
    s1, s2 = (args.sizes.split(",") * 2)[:2]
    steps_per_epoch = math.ceil(int(args.prompts) * int(args.group_size) / args.batch_size)
    shared = ["--model", args.model, "--engine", args.engine, "--reward", "pm1",
              "--iterations", "1", "--epochs", str(args.epochs), "--prompts", args.prompts,
              "--group-size", args.group_size, "--lr", args.lr, "--sizes", args.sizes,
              "--eval-sizes", args.sizes,
              "--batch-size", str(args.batch_size), "--eval-every", str(steps_per_epoch),
              "--eval-size", args.eval_size, "--eval-k", args.eval_k] + extra
    os.makedirs(args.out, exist_ok=True)

    def run(loss, c, extra_args):
        """One topr.py run, or the finished one already in its folder (so that a second call with
        another --c-main, or after an interruption, reruns only what is missing)."""
        out = os.path.join(args.out, f"{loss}-c{c:g}")
        if os.path.exists(os.path.join(out, "final", "config.json")):
            return out
        return topr.main(shared + ["--loss", loss, "--c", str(c), "--out", out] + extra_args)

    runs = {}
    data = args.data
    if data is None:
        runs[("topr", mains[0])] = run("topr", mains[0], [])
        data = os.path.join(runs[("topr", mains[0])], "data-0.jsonl")
    plan = [(loss, c) for c in mains for loss in ("topr", "naive")] + [("topr", c) for c in cs]
    for loss, c in plan:
        if (loss, c) not in runs:
            runs[(loss, c)] = run(loss, c, ["--data", data])

    rows = [json.loads(line) for line in open(data)]
    p_true = sum(r["grade"] == "correct" for r in rows) / len(rows)
    a1, a2, f1 = f"eval{s1}/sampled/accuracy", f"eval{s2}/sampled/accuracy", \
        f"eval{s1}/sampled/format_rate"
    lines = [f"Dataset: {len(rows)} samples of {args.prompts} training prompts x "
             f"{args.group_size} from the SFT model (T=1), {100 * p_true:.1f}% correct; "
             f"reward +1/-1; {args.epochs} epochs, "
             f"lr {args.lr}, batch {args.batch_size}. Held-out puzzles, sampled at T=1 "
             f"({args.eval_k} per puzzle)."]
    for cm in mains:
        lines += ["", f"Baseline c = {cm:g} (p~ = {100 * topr.p_tilde_pm1(p_true, cm):.1f}%):", "",
                  f"| epoch | naive acc (size {s1} / {s2}) | naive format rate | "
                  f"TOPR acc (size {s1} / {s2}) | TOPR format rate |", "|---|---|---|---|---|"]
        for e, (nv, tp) in enumerate(zip(evals(runs[("naive", cm)], s1),
                                         evals(runs[("topr", cm)], s1))):
            lines.append(f"| {e}{' (SFT)' if e == 0 else ''} | {pct(nv, a1)} / {pct(nv, a2)} | "
                         f"{pct(nv, f1)} | {pct(tp, a1)} / {pct(tp, a2)} | {pct(tp, f1)} |")
    lines += ["", f"| baseline c | p~ (Eq. 12) | acc size {s1} | acc size {s2} | format rate |",
              "|---|---|---|---|---|"]
    base = evals(runs[("topr", mains[0])], s1)[0]
    lines.append(f"| (SFT model) | | {pct(base, a1)} | {pct(base, a2)} | {pct(base, f1)} |")
    for c in sorted(cs):
        last = evals(runs[("topr", c)], s1)[-1]
        lines.append(f"| {c:g} | {100 * topr.p_tilde_pm1(p_true, c):.1f}% | {pct(last, a1)} | "
                     f"{pct(last, a2)} | {pct(last, f1)} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
