"""The papers' headline claims in miniature: each run like for like from one start model, 3 seeds,
a verdict by one rule; writes docs/CLAIMS.md and its plots (docs/CLAIMS-<claim>.png).

    python scripts/claims.py all --sft runs/sft-countdown/final        # every claim, 2 cores
    python scripts/claims.py topr-fig5 --sft runs/sft-countdown/final  # one claim
    python scripts/claims.py all --quick --sft runs/sft-countdown/final   # smoke run, ~8 min

Every arm is one command of an algorithm script from the --sft model with --seed s; --jobs runs
side by side, one torch thread each (fixed steps, so the figures do not depend on the clock), run
by scripts/compare.py's runner (a finished run is kept: an interrupted claim goes on where it
stopped). Within a seed every arm of a claim shares the held-out problems, the evaluation draws
and, where a claim trains off-policy, the same samples of the start model (POOL below). Each claim
writes OUT/<claim>/result.json and keeps a copy in docs/claims/ (in git); the doc is rebuilt from
them, so one claim run alone updates its own rows, and --render-only works on a clean checkout.
The hand-written investigations (docs/CLAIMS-notes.md) follow.

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient
reinforcement learning for LLMs", 2025, arXiv:2503.14286. [AGRO] Tang et al., "RL-finetuning LLMs
from on- and off-policy data with a single algorithm", 2025, arXiv:2503.19612. [SPO] Cohen et al.,
"Soft Policy Optimization: Online Off-Policy RL for Sequence Models", 2025, arXiv:2503.05453.
[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning".
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its runner: one command to completion, a finished run kept)
from compare import ROOT, common  # noqa: E402
import topr  # noqa: E402
from tasks import get_task, scoring  # noqa: E402

SIZES = (3, 4)  # Countdown's; every figure below is the mean over both (400 held-out problems)
# [TOPR] §4.2's setting: +1/-1 reward, each log-prob over its length, clip 1, mu at T = 1 and
# top-p 1, constant lr, no KL; every sample of the data (uniform, keep 0), one iteration.
T = ["--reward", "pm1", "--iterations", "1", "--sampling", "uniform", "--keep", "0",
     "--temperature", "1", "--top-p", "1", "--loss-norm", "seq/len", "--clip", "1",
     "--batch-size", "64", "--lr", "5e-5"]
# POOL: 4,000 training prompts x 8 samples of the start model at T = 1 (with LP_mu), one file a
# seed, shared by the TOPR claims; --keep 1 trains one one-sample step after drawing them.
POOL = ["--iterations", "1", "--prompts", "4000", "--group-size", "8", "--sampling", "uniform",
        "--keep", "1", "--eval-size", "1", "--eval-k", "1"]
P67 = "probe: POOL's positives and 33% negatives, [TOPR] §4.3's share"
PTILDE = (0.01, 0.05, 0.10, 0.20, 0.50, 1.00)  # [TOPR] Fig. 5's x axis: 1% ... 100%
N_MIX = 6400  # samples of each composed dataset (p = 10% and 50%): 100 steps of 64
# [AGRO] §8.1: the on-policy variants with identical hyper-parameters (agro.py's batch of
# 32 prompts x 8), both sizes, 125 steps, warm-up then a constant lr for every script.
A = ["--sizes", "3,4", "--prompts", "32", "--group-size", "8", "--steps", "125", "--lr", "6e-5",
     "--warmup", "10", "--eval-every", "25"]
# [AGRO] §8.2: pi_ref's samples fixed (512 prompts x 8), 16 steps an epoch, 10 epochs.
O = ["--mode", "offpolicy", "--offline-prompts", "512", "--sizes", "3,4", "--prompts", "32",
     "--group-size", "8", "--steps", "160", "--eval-every", "16"]
# [SPO] §5: CE loss, T ~ U(0.1, 0.8), top-p 0.95, pi_s updated every 10 steps; beta = 1/ln 1e5.
S = ["--loss", "ce", "--temperature", "0.1,0.8", "--top-p", "0.95", "--model-update-interval",
     "10", "--steps", "125", "--eval-every", "25", "--eval-k", "20", "--eval-size", "50"]
SPO_BETA = 1 / math.log(1e5)
# The PPO stand-in (ours): rloo.py with the KL in the reward at SPO's beta, 32 prompts x 8.
PPO = ["--beta", f"{SPO_BETA:.4f}", "--prompts", "32", "--group-size", "8",
       "--train-size", "256", "--steps", "125", "--lr-schedule", "constant", "--eval-every",
       "25", "--eval-k", "20", "--eval-size", "50"]
SPO_EVAL = dict(temperature=0.4, top_p=0.95)  # [SPO] §5: 20 samples at T = 0.4, top-p 0.95
README_START, README_END = "<!-- claims:start -->", "<!-- claims:end -->"
ARCHIVE = os.path.join(ROOT, "docs", "claims")  # every claim's last result.json, kept in git
# The commit that registered each claim's primary contrast, before the runs that give its verdict.
REGISTERED = {cid: "37c3416" for cid in (
    "topr-fig1", "topr-fig4", "topr-fig5", "topr-fig6", "agro-fig2", "agro-fig5", "agro-fig6",
    "spo-fig1", "cr-table1", "topr-fig3", "topr-s43", "topr-fig7", "topr-fig8", "agro-s81",
    "agro-fig4", "spo-both", "cr-s51", "cr-table2")}
# Probes are investigations added after a claim's results were seen (post hoc): the commit that
# added each, by the start of its arms' names.
PROBES_ADDED = {"topr-p67": "ffbf662", "all-p67": "ffbf662", "all-c-0.8": "ffbf662",
                "lr1e-5-": "cbc177e", "n3-": "cbc177e", "lr2e-6x5-": "d67c7f7",
                "rloo-b0.5": "d6c388b", "agro-l1-b0.5": "d6c388b", "agro-b0.15": "4f65f2d",
                "spo-sq": "5346122", "spo-defaults": "9671d90", "spo-lr1e-5": "d67c7f7",
                "ppo-lr1e-5": "64878c3"}
# The claims registered at 1987642, under the rule of their contrasts then (EARLIER_RULE).
EARLIER = "1987642"  # ARCHIVE/earlier-1987642.json: the results in docs/CLAIMS.md then
EARLIER_CLAIMS = ("topr-fig1", "topr-fig4", "topr-fig5", "topr-fig6", "agro-fig2", "agro-fig5",
                  "agro-fig6", "spo-fig1", "cr-table1")
# The rule: a claim's verdict is its primary contrast's alone (primary_verdict); the other
# contrasts are shown under the rule of 1987642 (EARLIER_RULE), as they were registered.
RULE = ("Each claim has one **primary contrast**, about the paper's own method, registered before "
        "the runs that give its verdict (the commit is named with it): d = arm - comparator, seed "
        "by seed, signed so that the paper's direction is positive, and delta, registered with it, "
        "the smallest difference that counts (1 point of accuracy, 0.01 of mean reward, or a "
        "relative 25% for a ratio). The verdict reads the **median seed**, so that one outlier "
        "seed neither makes nor breaks it: a claim of a difference is **reproduced** if the median "
        "d >= delta, **not reproduced** if it is <= -delta (the opposite) or if all but one seed "
        "lie within +-delta (no difference), **inconclusive** otherwise (run more seeds). A claim "
        "of no difference is **equivalent** if all but one seed lie within +-delta and the median "
        "too, **not reproduced** if the median lies beyond +-delta, inconclusive otherwise. The "
        "margin is how far the median sits past the threshold that decided (negative: short of "
        "the nearest one). With per-seed noise of sd delta and no true effect, the median of 3 "
        "seeds passes delta 7% of the time: a screen, not a test.")
EARLIER_RULE = (
    "The rule of 1987642, for the secondary contrasts: **reproduced** if the mean of d over the "
    "seeds exceeds one sample sd, **not reproduced** if it is below minus one sd, "
    "**inconclusive** otherwise; a claim was reproduced when every contrast was, not reproduced "
    "when none was and one was opposite, inconclusive when all were within the noise, **partly** "
    "otherwise.")


def c_for(p: float, pt: float) -> float:
    """[TOPR] Eq. 12 solved for c: the baseline giving effective positive share pt at share p."""
    c = (p - pt) / (p + pt * (1 - 2 * p))
    assert abs(topr.p_tilde_pm1(p, c) - pt) < 1e-9
    return c


# ---- The claims --------------------------------------------------------------------------------
# Each: the paper's words and setting, ours, the arms (name: script, flags, "paper" or "ours": a
# stand-in for a baseline the project lacks), the contrasts (text, function of one seed's figures
# m[arm][key] giving d) and the plot. Flags may name a seed's files: {pool} {pos} {d10} {d50}
# {d67} {d10n3}.
def one_pass(data: str, c: str, loss: str, every: str | None = None) -> list[str]:
    """topr.py's flags for one pass over a data file at baseline c ([TOPR] §4.2's setting T)."""
    every = ["--eval-every", every] if every else []
    return T + ["--data", data, "--c", c, "--loss", loss] + every


def at(run, step):  # the evaluation at `step` (the last one before it)
    return [e for e in run["curve"] if e["step"] <= step][-1]


def kl_efficiency(run) -> float:
    """Accuracy gained per nat of KL to the start model at the end ([AGRO] Fig. 6's axes); nan
    where either is not positive."""
    gain = run["acc"] - run["start"]
    return gain / run["kl"] if gain > 0 and run["kl"] > 0 else math.nan


CLAIMS = {
    "topr-fig1": dict(
        paper="[TOPR] Fig. 1, §4.3",
        says="trained off-policy for longer, naive REINFORCE degrades while TOPR keeps improving "
             "(\"TOPR rapidly improves on the base model\"; naive \"collapses as pi moves away "
             "from mu\")",
        setting="one iteration: samples of the base model (GSM8K 7,473 x 16), one epoch over "
                "them, reward +1/-1, no baseline (c = 0), no KL; test pass@1 along training",
        ours="one pass over POOL (32,000 samples of the start model at T = 1, 19% correct: "
             "500 steps of 64), c = 0, lr 5e-5; acc at T = 1 every 50 steps",
        arms={"topr": ("topr.py", one_pass("{pool}", "0", "topr", "50"), "paper"),
              "naive": ("topr.py", one_pass("{pool}", "0", "naive", "50"), "paper"),
              "topr-p67": ("topr.py", one_pass("{d67}", "0", "topr", "25"),
                           P67),
              "topr-lr5e-7": ("topr.py", one_pass("{pool}", "0", "topr", "50")
                              + ["--lr", "5e-7"], "the paper's lr, 5e-7 ([TOPR] §4.2)")},
        contrasts=[("TOPR end - naive end", lambda m: m["topr"]["acc"] - m["naive"]["acc"]),
                   ("naive degrades: naive peak - naive end",
                    lambda m: m["naive"]["peak"] - m["naive"]["acc"]),
                   ("TOPR keeps improving: TOPR end - TOPR half-way",
                    lambda m: m["topr"]["acc"] - at(m["topr"], m["topr"]["steps"] // 2)["acc"]),
                   ("TOPR improves on the start: TOPR end - start",
                    lambda m: m["topr"]["acc"] - m["topr"]["start"]),
                   *[(f"probe: TOPR end - start, {n} numbers only", lambda m, n=n:
                      m["topr"][f"acc{n}"] - m["topr"][f"start{n}"], "probe") for n in SIZES],
                   ("probe: at the paper's 67% positives, TOPR end - start",
                    lambda m: m["topr-p67"]["acc"] - m["topr-p67"]["start"], "probe"),
                   ("at the paper's lr 5e-7, TOPR end - start (does the tiny model move?)",
                    lambda m: m["topr-lr5e-7"]["acc"] - m["topr-lr5e-7"]["start"],
                    "the paper's lr")],
        primary=("TOPR improves on the start: TOPR end - start",
                 lambda m: m["topr"]["acc"] - m["topr"]["start"], 1.0, "more"),
        plot="curve", shared={"topr-p67": "topr-fig4/all-p67"}),
    "topr-fig4": dict(
        paper="[TOPR] Fig. 4, §4.3",
        says="training on all examples beats positives alone (\"substantially lower "
             "performance\") and leaves fewer questions with no correct answer",
        setting="the same samples with every negative removed, trained the same way (one "
                "epoch); pass@1, and a histogram of correct generations per question",
        ours="POS: POOL's correct samples (~6,100: one pass, ~96 steps) against topr-fig1's "
             "TOPR arm (all 32,000, 500 steps), c = 0; no correct answer = 1 - pass@8",
        arms={"all": ("topr.py", one_pass("{pool}", "0", "topr", "50"), "paper"),
              "positives": ("topr.py", one_pass("{pos}", "0", "topr", "25"), "paper"),
              "all-p67": ("topr.py", one_pass("{d67}", "0", "topr", "25"),
                          P67),
              "all-c-0.8": ("topr.py", one_pass("{pool}", "-0.8", "topr", "50"),
                            "probe: all, c = -0.8: p~ 68%, the paper's share by Eq. 12")},
        contrasts=[("all - positives (acc, each one pass)",
                    lambda m: m["all"]["acc"] - m["positives"]["acc"]),
                   ("all - positives (acc at positives' last step)",
                    lambda m: at(m["all"], m["positives"]["steps"])["acc"]
                    - m["positives"]["acc"]),
                   ("no correct of 8: positives - all",
                    lambda m: m["all"]["pass"] - m["positives"]["pass"]),
                   ("probe: at the paper's 67% positives, all - positives",
                    lambda m: m["all-p67"]["acc"] - m["positives"]["acc"], "probe"),
                   ("probe: p~ 68% by c = -0.8, all - positives",
                    lambda m: m["all-c-0.8"]["acc"] - m["positives"]["acc"], "probe")],
        primary=("all - positives (acc, each one pass)",
                 lambda m: m["all"]["acc"] - m["positives"]["acc"], 1.0, "more"),
        plot="curve", shared={"all": "topr-fig1/topr"}),
    "topr-fig5": dict(
        paper="[TOPR] Fig. 5, §4.3",
        says="accuracy peaks at an effective positive share p~ of 10-20%, whatever the real "
             "share p, and falls markedly above 50%",
        setting="50,000 examples with p = 10% or 50% positives; c set so that p~ (Eq. 12) runs "
                "from 1% to 100%; test accuracy against p~",
        ours=f"{N_MIX:,} samples drawn from POOL at p = 10% and 50% (one pass, 100 steps), c from "
             "Eq. 12 for p~ = 1, 5, 10, 20, 50, 100%",
        arms={**{f"p{p}-pt{round(100 * pt)}": (
            "topr.py", one_pass("{d%d}" % p, f"{c_for(p / 100, pt):.4f}", "topr"), "paper")
            for p in (10, 50) for pt in PTILDE},
              **{f"{name}-p10-pt{pt}": (
                  "topr.py", one_pass(data, f"{c_for(0.1, pt / 100):.4f}", "topr") + flags,
                  f"probe: {label}")
                 for name, data, flags, label in [
                     ("lr1e-5", "{d10}", ["--lr", "1e-5"], "a fifth of the lr"),
                     ("n3", "{d10n3}", [], "3-number puzzles only, 10% positives"),
                     ("lr2e-6x5", "{d10}", ["--lr", "2e-6", "--epochs", "5"],
                      "lr 2e-6 over 5 passes, lr x steps as at 1e-5")]
                 for pt in (10, 100)}},
        contrasts=[*[(f"p = {p}%: p~ 10-20% - p~ {x}%",
                      lambda m, p=p, x=x: (m[f"p{p}-pt10"]["acc"] + m[f"p{p}-pt20"]["acc"]) / 2
                      - m[f"p{p}-pt{x}"]["acc"]) for p in (10, 50) for x in (1, 50, 100)],
                   ("probe: lr 1e-5, p = 10%: p~ 10% - p~ 100%", lambda m:
                    m["lr1e-5-p10-pt10"]["acc"] - m["lr1e-5-p10-pt100"]["acc"], "probe"),
                   ("probe: 3-number data, p = 10%: p~ 10% - p~ 100% (3-number acc)", lambda m:
                    m["n3-p10-pt10"]["acc3"] - m["n3-p10-pt100"]["acc3"], "probe"),
                   ("probe: lr 2e-6, 5 passes, p = 10%: p~ 10% - p~ 100%", lambda m:
                    m["lr2e-6x5-p10-pt10"]["acc"] - m["lr2e-6x5-p10-pt100"]["acc"], "probe")],
        primary=("the peak at p~ 10-20%: their mean - the best of p~ 1, 5, 50, 100%, the lower "
                 "of p = 10% and 50%", lambda m: min(
                     (m[f"p{p}-pt10"]["acc"] + m[f"p{p}-pt20"]["acc"]) / 2
                     - max(m[f"p{p}-pt{x}"]["acc"] for x in (1, 5, 50, 100)) for p in (10, 50)),
                 1.0, "more"),
        plot="ptilde"),
    "topr-fig6": dict(
        paper="[TOPR] Fig. 6, §4.3",
        says="at a low share of positives (p = 10%), TOPR above truncated IS across p~ (\"TOPR "
             "recovers from these cases while TIS cannot\"); no difference at a high share",
        setting="the p = 10% dataset of Fig. 5, TIS or TOPR, accuracy against p~",
        ours="topr-fig5's p = 10% arms (TOPR) against --loss tis on the same data and c",
        arms={**{f"{loss}-pt{round(100 * pt)}": (
            "topr.py", one_pass("{d10}", f"{c_for(0.1, pt):.4f}", loss),
            "paper") for loss in ("topr", "tis") for pt in PTILDE}},
        contrasts=[("TOPR - TIS, mean over p~ 1, 5, 10%",
                    lambda m: statistics.mean(m[f"topr-pt{x}"]["acc"] - m[f"tis-pt{x}"]["acc"]
                                              for x in (1, 5, 10))),
                   ("TOPR - TIS, mean over all six p~",
                    lambda m: statistics.mean(m[f"topr-pt{x}"]["acc"] - m[f"tis-pt{x}"]["acc"]
                                              for x in (1, 5, 10, 20, 50, 100)))],
        primary=("TOPR - TIS, mean over p~ 1, 5, 10%", lambda m: statistics.mean(
            m[f"topr-pt{x}"]["acc"] - m[f"tis-pt{x}"]["acc"] for x in (1, 5, 10)), 1.0, "more"),
        plot="ptilde",
        shared={f"topr-pt{round(100 * pt)}": f"topr-fig5/p10-pt{round(100 * pt)}"
                for pt in PTILDE}),
    "agro-fig2": dict(
        paper="[AGRO] Figs. 2-3, §8.1",
        says="on-policy AGRO is at least as fast as the on-policy baseline at the same beta "
             "(\"faster progress on the reward given same number of epochs\")",
        setting="regularised PG, off-policy AGRO on on-policy samples and on-policy AGRO, "
                "identical hyper-parameters and samples, one beta, 2 seeds; reward and accuracy "
                "along training (beta, batch and lr are lost from our copy of the paper)",
        ours="beta 0.05, 32 prompts x 8, 125 steps, lr 6e-5 constant after 10 warm-up steps, "
             "both sizes, reward 1 / 0.1 / 0 (the task's; the paper's is 1 / 0); the mean over "
             "the 5 evaluations after the start (area between curves)",
        arms={"rloo": ("rloo.py", A + ["--beta", "0.05", "--lr-schedule", "constant"],
                       "paper: KL in the reward"),
              "agro-l0": ("agro.py", A + ["--mode", "onpolicy", "--beta", "0.05",
                                          "--lambda-lr", "0"], "paper: off-policy AGRO"),
              "agro-l1": ("agro.py", A + ["--mode", "onpolicy", "--beta", "0.05",
                                          "--lambda-lr", "1"], "paper: g_LR weight 1"),
              "agro-lb2": ("agro.py", A + ["--mode", "onpolicy", "--beta", "0.05",
                                           "--lambda-lr", "0.025"], "ours: lambda_LR = beta / 2"),
              "rloo-b0.5": ("rloo.py", A + ["--beta", "0.5", "--lr-schedule", "constant"],
                            "probe: beta 0.5, above the collapse threshold"),
              "agro-l1-b0.5": ("agro.py", A + ["--mode", "onpolicy", "--beta", "0.5",
                                               "--lambda-lr", "1"],
                               "probe: beta 0.5, above the collapse threshold")},
        contrasts=[("on-policy AGRO (weight 1) - RLOO, mean along training",
                    lambda m: m["agro-l1"]["area"] - m["rloo"]["area"]),
                   ("on-policy AGRO (beta/2) - RLOO, mean along training",
                    lambda m: m["agro-lb2"]["area"] - m["rloo"]["area"]),
                   ("probe: off-policy AGRO - RLOO (the same estimator, §8.1)",
                    lambda m: m["agro-l0"]["area"] - m["rloo"]["area"], "probe"),
                   ("probe: at beta 0.5, on-policy AGRO (weight 1) - RLOO",
                    lambda m: m["agro-l1-b0.5"]["area"] - m["rloo-b0.5"]["area"], "probe")],
        primary=("on-policy AGRO (weight 1) - RLOO, mean along training",
                 lambda m: m["agro-l1"]["area"] - m["rloo"]["area"], 1.0, "more"),
        plot="curve"),
    "agro-fig5": dict(
        paper="[AGRO] Fig. 5, §8.2",
        says="offline, over epochs on one dataset, AGRO peaks higher than KL-regularised PG "
             "and is better at equal epochs; unregularised PG (beta = 0) crashes",
        setting="samples of the reference policy, fixed throughout training; KL-PG with the "
                "per-token KL at AGRO's beta; accuracy against epochs",
        ours="512 prompts x 8 of the start model, 16 steps an epoch, 10 epochs, beta 0.3 "
             "(agro.py's off-policy default; the paper's is lost)",
        arms={"agro": ("agro.py", O + ["--loss", "agro", "--beta", "0.3"], "paper"),
              "klpg": ("agro.py", O + ["--loss", "klpg", "--beta", "0.3"], "paper"),
              "pg0": ("agro.py", O + ["--loss", "klpg", "--beta", "0"], "paper"),
              "agro-b0.15": ("agro.py", O + ["--loss", "agro", "--beta", "0.15"],
                             "probe: AGRO at half the beta, about KL-PG's KL")},
        contrasts=[("AGRO peak - KL-PG peak", lambda m: m["agro"]["peak"] - m["klpg"]["peak"]),
                   ("AGRO - KL-PG, mean over epochs",
                    lambda m: m["agro"]["area"] - m["klpg"]["area"]),
                   ("PG at beta 0 crashes: its peak - its end",
                    lambda m: m["pg0"]["peak"] - m["pg0"]["acc"]),
                   ("probe: AGRO at beta 0.15 - KL-PG at 0.3, mean over epochs",
                    lambda m: m["agro-b0.15"]["area"] - m["klpg"]["area"], "probe")],
        primary=("AGRO peak - KL-PG peak", lambda m: m["agro"]["peak"] - m["klpg"]["peak"],
                 1.0, "more"),
        plot="curve"),
    "agro-fig6": dict(
        paper="[AGRO] Fig. 6, §8.3",
        says="a larger beta learns more slowly at the same number of steps and spends less KL",
        setting="beta varied for regularised PG and off-policy AGRO on on-policy samples; "
                "performance against steps and against KL",
        ours="agro.py on-policy, lambda_LR 0 (both of the paper's arms at once on fresh "
             "samples), beta 0, 0.02, 0.05, 0.5 (0.2 left out to keep the claim under 45 "
             "minutes); agro-fig2's setting",
        arms={f"b{b}": ("agro.py", A + ["--mode", "onpolicy", "--beta", b, "--lambda-lr", "0"],
                        "paper") for b in ("0", "0.02", "0.05", "0.5")},
        contrasts=[("slower: beta 0.02 - beta 0.5, mean gain along training",
                    lambda m: m["b0.02"]["area"] - m["b0.5"]["area"]),
                   ("less KL: KL at the end, beta 0.02 - beta 0.5",
                    lambda m: m["b0.02"]["kl"] - m["b0.5"]["kl"])],
        primary=("more KL-efficient: gain per nat of KL at beta 0.5 over beta 0.02, - 1",
                 lambda m: kl_efficiency(m["b0.5"]) / kl_efficiency(m["b0.02"]) - 1, 0.25, "more"),
        plot="kl", shared={"b0.05": "agro-fig2/agro-l0"}),
    "spo-fig1": dict(
        paper="[SPO] Fig. 1, §5",
        says="SPO improves pass@10 and keeps it above PPO's (same beta), whose pass@10 declines; "
             "PPO is better at pass@1 (8.4 against 6.3 / 6.0); half-online SPO (offline correct "
             "solutions mixed in) above pure online",
        setting="beta = 1/ln 1e5, CE loss, online samples at T ~ U(0.1, 0.8), top-p 0.95, "
                "pi_s updated every 10 steps; PPO with the KL in the reward at the same beta; "
                "half-online: 50% correct offline solutions from five sources; pass@k from 20 "
                "samples at T = 0.4, top-p 0.95",
        ours="125 steps of 256 sequences; PPO stand-in: rloo.py with the KL in the reward at "
             "SPO's beta, 32 prompts x 8 (ours); offline set: correct samples of three of the "
             "five sources (the start model, the online SPO run, the stand-in; no Llama-70B or "
             "human solutions); pass@1 and pass@10 from 20 samples on 200 problems a size "
             "(the curves: pass@20 at T = 1 on 50 a size, every 25 steps, to save time)",
        arms={"spo": ("spo.py", S, "paper"),
              "ppo": ("rloo.py", PPO, "ours: PPO stand-in, RLOO with the KL in R"),
              "spo-half": ("spo.py", S + ["--online-fraction", "0.5", "--offline-data",
                                          "{offline}", "--q0-cache", "{q0}"], "paper"),
              "spo-sq": ("spo.py", ["--loss", "sq"] + S[2:], "probe: the squared loss "
                         "(the best in [SPO]'s ablation), the rest as spo"),
              "spo-defaults": ("spo.py", S[S.index("--steps"):], "probe: spo.py's defaults, "
                               "the squared loss on T = 1 samples of the current policy"),
              "spo-lr1e-5": ("spo.py", S + ["--lr", "1e-5"], "probe: the paper's setting at "
                             "a sixth of the lr"),
              "ppo-lr1e-5": ("rloo.py", PPO + ["--lr", "1e-5"], "probe: the PPO stand-in at "
                             "a sixth of the lr"),
              "spo-lr6e-8": ("spo.py", S + ["--lr", "6e-8", "--warmup", "200"],
                             "the paper's lr, 6e-8 after 200 warm-up steps ([SPO] §5)")},
        contrasts=[("pass@10: SPO - start", lambda m: m["spo"]["p10"] - m["spo"]["p10_0"]),
                   ("pass@10: SPO - PPO", lambda m: m["spo"]["p10"] - m["ppo"]["p10"]),
                   ("pass@1: PPO - SPO", lambda m: m["ppo"]["p1"] - m["spo"]["p1"]),
                   ("PPO's pass@10 declines: start - PPO",
                    lambda m: m["ppo"]["p10_0"] - m["ppo"]["p10"]),
                   ("pass@10: half-online - online",
                    lambda m: m["spo-half"]["p10"] - m["spo"]["p10"]),
                   *[c for arm, label in [("spo-sq", "squared loss"),
                                          ("spo-defaults", "spo.py's defaults"),
                                          ("spo-lr1e-5", "lr 1e-5")]
                     for c in [(f"probe: {label}, pass@10 - start", lambda m, a=arm:
                                m[a]["p10"] - m[a]["p10_0"], "probe"),
                               (f"probe: {label} - PPO, pass@10", lambda m, a=arm:
                                m[a]["p10"] - m["ppo"]["p10"], "probe")]],
                   ("probe: both at lr 1e-5, SPO - PPO, pass@10",
                    lambda m: m["spo-lr1e-5"]["p10"] - m["ppo-lr1e-5"]["p10"], "probe"),
                   ("probe: both at lr 1e-5, PPO - SPO, pass@1",
                    lambda m: m["ppo-lr1e-5"]["p1"] - m["spo-lr1e-5"]["p1"], "probe"),
                   ("at the paper's lr 6e-8, pass@10: SPO - start (does the tiny model move?)",
                    lambda m: m["spo-lr6e-8"]["p10"] - m["spo-lr6e-8"]["p10_0"],
                    "the paper's lr")],
        primary=("pass@10: SPO - start", lambda m: m["spo"]["p10"] - m["spo"]["p10_0"], 1.0,
                 "more"),
        plot="curve", evaluate="spo"),
    "cr-table1": dict(
        paper="[CR] Table 1",
        says="TOPR with reward A (0.4060) and A then B (0.4849) above SFT (0.3385); RLOO "
             "(0.2140) and TOPR with the original reward (0.2270) below it",
        setting="mean reward (1 correct, 0.1 formatted, 0) at T = 0.15, top-p 0.9, top-k 30 on "
                "200 test problems; TOPR on 1,000 completions of the SFT model at T = 0.15, lr "
                "1e-4; RLOO k = 16, beta 0, the same lr",
        ours="topr.py --report-variant (the report's setting); RLOO: 4 prompts x 16, lr 1e-4, "
             "250 steps (1,000 prompts: [CR] gives no RLOO budget), original reward; 8 samples "
             "a problem at the report's decoding",
        arms={v: ("topr.py", ["--report-variant", v], "paper") for v in ("original", "A", "A+B")}
        | {"rloo": ("rloo.py", ["--beta", "0", "--group-size", "16", "--prompts", "4", "--lr",
                                "1e-4", "--train-size", "500", "--steps", "250", "--reward",
                                "original"], "paper")},
        contrasts=[("A - SFT", lambda m: m["A"]["score"] - m["A"]["score0"]),
                   ("A then B - SFT", lambda m: m["A+B"]["score"] - m["A+B"]["score0"]),
                   ("SFT - RLOO", lambda m: m["rloo"]["score0"] - m["rloo"]["score"]),
                   ("SFT - original", lambda m: m["original"]["score0"]
                    - m["original"]["score"])],
        primary=("A then B - SFT", lambda m: m["A+B"]["score"] - m["A+B"]["score0"], 0.01,
                 "more"),
        plot=None, digits=3, evaluate="cr"),  # [CR]'s mean reward, in [0, 1]
    # ---- Registered with the primary-contrast rule (the headline claims missing before) ----
    "topr-fig3": dict(
        paper="[TOPR] Fig. 3, §4.3",
        says="TOPR is the only one of four methods to significantly reduce invalid generations; "
             "naive REINFORCE's become \"overwhelmingly degenerate\"",
        setting="the share of correct, incorrect and invalid (\"The answer is\" absent) test "
                "generations along training; Fig. 1's runs",
        ours="topr-fig1's runs; invalid = no answer in <answer> tags (100 - format rate), T = 1",
        arms={"topr": ("topr.py", one_pass("{pool}", "0", "topr", "50"), "paper"),
              "naive": ("topr.py", one_pass("{pool}", "0", "naive", "50"), "paper")},
        contrasts=[("invalid: naive end - TOPR end",
                    lambda m: m["topr"]["format"] - m["naive"]["format"])],
        primary=("TOPR reduces invalid answers: start - TOPR end, in %",
                 lambda m: m["topr"]["format"] - m["topr"]["curve"][0]["format"], 1.0, "more"),
        plot=None, shared={"topr": "topr-fig1/topr", "naive": "topr-fig1/naive"}),
    "topr-s43": dict(
        paper="[TOPR] §4.3 (Fig. 5)",
        says="at the same effective share p~, positives from sampling beat positives from the "
             "baseline: \"slightly, but consistently higher\" with p = 50% than with p = 10%",
        setting="Fig. 5's two datasets, p = 10% and 50%, c set for each p~",
        ours="topr-fig5's runs",
        arms={f"p{p}-pt{round(100 * pt)}": (
            "topr.py", one_pass("{d%d}" % p, f"{c_for(p / 100, pt):.4f}", "topr"), "paper")
            for p in (10, 50) for pt in PTILDE},
        contrasts=[(f"p = 50% - p = 10% at p~ {x}%", lambda m, x=x:
                    m[f"p50-pt{x}"]["acc"] - m[f"p10-pt{x}"]["acc"]) for x in (10, 20, 50)],
        primary=("p = 50% - p = 10%, mean over the six p~", lambda m: statistics.mean(
            m[f"p50-pt{x}"]["acc"] - m[f"p10-pt{x}"]["acc"] for x in (1, 5, 10, 20, 50, 100)),
                 1.0, "more"),
        plot=None, shared={f"p{p}-pt{round(100 * pt)}": f"topr-fig5/p{p}-pt{round(100 * pt)}"
                           for p in (10, 50) for pt in PTILDE}),
    "topr-fig7": dict(
        paper="[TOPR] Fig. 7, §4.3",
        says="untruncated importance sampling is as performant as TOPR at clip 1, but TOPR is "
             "more robust to a higher gradient clip (100)",
        setting="standard IS (a+ = a- = 0, b+ = b- = inf) against TOPR from the base model, "
                "clip 1.0 and 100.0",
        ours="topr-fig1's setting (one pass over POOL), --loss is against topr, clip 1 and 100",
        arms={"topr": ("topr.py", one_pass("{pool}", "0", "topr", "50"), "paper"),
              "is": ("topr.py", one_pass("{pool}", "0", "is", "50"), "paper"),
              "topr-clip100": ("topr.py", one_pass("{pool}", "0", "topr", "50")
                               + ["--clip", "100"], "paper"),
              "is-clip100": ("topr.py", one_pass("{pool}", "0", "is", "50") + ["--clip", "100"],
                             "paper")},
        contrasts=[("at clip 1, TOPR - IS (the paper: no difference)",
                    lambda m: m["topr"]["acc"] - m["is"]["acc"])],
        primary=("at clip 100, TOPR end - IS end",
                 lambda m: m["topr-clip100"]["acc"] - m["is-clip100"]["acc"], 1.0, "more"),
        plot="curve", shared={"topr": "topr-fig1/topr"}),
    "topr-fig8": dict(
        paper="[TOPR] Fig. 8, §4.3",
        says="over several iterations, Anna Karenina sampling beats uniform sampling (GSM8K "
             "pass@1 79.6% against 75.4%)",
        setting="iterations of N = 50,000 samples from mu_i = pi_{i-1}; Anna Karenina: 64 "
                "candidates a problem, its first positive kept, negatives fill the batch",
        ours="topr.py's defaults: 6 iterations of 500 prompts x 8, 1,000 samples kept a round, "
             "reward +1/-1, c = -0.8; anna-karenina against uniform",
        arms={"ak": ("topr.py", ["--reward", "pm1", "--sampling", "anna-karenina",
                                 "--eval-every", "16"], "paper"),
              "uniform": ("topr.py", ["--reward", "pm1", "--sampling", "uniform",
                                      "--eval-every", "16"], "paper")},
        contrasts=[("Anna Karenina improves on the start", lambda m: m["ak"]["acc"]
                    - m["ak"]["start"])],
        primary=("Anna Karenina - uniform, acc at the end",
                 lambda m: m["ak"]["acc"] - m["uniform"]["acc"], 1.0, "more"),
        plot="curve"),
    "agro-s81": dict(
        paper="[AGRO] §8.1 (Fig. 2)",
        says="on perfectly on-policy samples off-policy AGRO behaves identically to regularised "
             "PG (\"indeed the case within statistical errors\")",
        setting="Fig. 2's runs: off-policy AGRO and regularised PG on fresh samples",
        ours="agro-fig2's runs: agro.py --lambda-lr 0 against rloo.py with the KL in R",
        arms={"rloo": ("rloo.py", A + ["--beta", "0.05", "--lr-schedule", "constant"],
                       "paper: KL in the reward"),
              "agro-l0": ("agro.py", A + ["--mode", "onpolicy", "--beta", "0.05",
                                          "--lambda-lr", "0"], "paper: off-policy AGRO")},
        contrasts=[],
        primary=("off-policy AGRO - RLOO, mean along training",
                 lambda m: m["agro-l0"]["area"] - m["rloo"]["area"], 1.0, "equal"),
        plot=None, shared={"rloo": "agro-fig2/rloo", "agro-l0": "agro-fig2/agro-l0"}),
    "agro-fig4": dict(
        paper="[AGRO] Fig. 4, §8.2",
        says="off-policy learning is as KL-efficient as on-policy, though on-policy drives the "
             "KL up more in the same number of steps",
        setting="AGRO on off-policy (pi_ref's) and on-policy samples; performance against KL",
        ours="agro-fig2's on-policy AGRO (weight 1) against agro.py --mode offpolicy on 512 "
             "prompts x 8 of the start model, the same beta 0.05, steps and lr",
        arms={"on": ("agro.py", A + ["--mode", "onpolicy", "--beta", "0.05", "--lambda-lr", "1"],
                     "paper"),
              "off": ("agro.py", A + ["--mode", "offpolicy", "--offline-prompts", "512",
                                      "--beta", "0.05"], "paper")},
        contrasts=[("on-policy moves further: KL at the end, on - off",
                    lambda m: m["on"]["kl"] - m["off"]["kl"])],
        primary=("KL efficiency (gain per nat), off-policy over on-policy, - 1",
                 lambda m: kl_efficiency(m["off"]) / kl_efficiency(m["on"]) - 1, 0.25, "equal"),
        plot="kl", shared={"on": "agro-fig2/agro-l1"}),
    "spo-both": dict(
        paper="[SPO] §5, abstract",
        says="SPO improves both pass@1 and pass@10 over the start model",
        setting="Fig. 1's SPO run; pass@k from 20 samples at T = 0.4, top-p 0.95",
        ours="spo-fig1's SPO run and its final evaluation",
        arms={"spo": ("spo.py", S, "paper")},
        contrasts=[("pass@1: SPO - start", lambda m: m["spo"]["p1"] - m["spo"]["p1_0"])],
        primary=("the lower of pass@1 - start and pass@10 - start", lambda m: min(
            m["spo"]["p1"] - m["spo"]["p1_0"], m["spo"]["p10"] - m["spo"]["p10_0"]), 1.0, "more"),
        plot=None, shared={"spo": "spo-fig1/spo"}, evaluate="spo"),
    "cr-s51": dict(
        paper="[CR] §5.1",
        says="reward B alone is \"too unstable and ineffective to improve SFT, quickly "
             "collapsing to 0.1 evaluation reward\"",
        setting="Table 1's TOPR setting with reward B",
        ours="topr.py at --report-variant's setting (REPORT_SETTING) with --reward B",
        arms={"B": ("topr.py", ["--reward", "B", "--iterations", "1"] + [
            x for k, v in topr.REPORT_SETTING.items() for x in (f"--{k.replace('_', '-')}",
                                                                str(v))], "paper")},
        contrasts=[],
        primary=("SFT - B, mean reward", lambda m: m["B"]["score0"] - m["B"]["score"], 0.01,
                 "more"),
        plot=None, digits=3, evaluate="cr"),
    "cr-table2": dict(
        paper="[CR] Table 2",
        says="on the harder test set TOPR with reward A (0.2656) beats RLOO (0.129) and A then B "
             "(0.1458)",
        setting="1,000 harder puzzles (larger numbers), Table 1's models and decoding",
        ours="cr-table1's runs; the harder set: 4-number puzzles (our generator has no "
             "larger-number split)",
        arms={v: ("topr.py", ["--report-variant", v], "paper") for v in ("A", "A+B")}
        | {"rloo": ("rloo.py", ["--beta", "0", "--group-size", "16", "--prompts", "4", "--lr",
                                "1e-4", "--train-size", "500", "--steps", "250", "--reward",
                                "original"], "paper")},
        contrasts=[("A - A then B, 4 numbers", lambda m: m["A"]["score4"] - m["A+B"]["score4"])],
        primary=("A - RLOO, mean reward on 4 numbers",
                 lambda m: m["A"]["score4"] - m["rloo"]["score4"], 0.01, "more"),
        plot=None, digits=3, evaluate="cr",
        shared={"A": "cr-table1/A", "A+B": "cr-table1/A+B", "rloo": "cr-table1/rloo"}),
    # Registered as not run here, each with why.
    "agro-fig1": dict(
        paper="[AGRO] Fig. 1, §5.1", runs=False,
        says="off-policy AGRO converges to pi*, KL-regularised PG does not",
        why="a tabular bandit, exact, not a Countdown run: tests/test_agro.py::"
            "test_fig1_offpolicy_agro_reaches_pi_star_klpg_does_not"),
    "spo-speed": dict(
        paper="[SPO] §3.2, §5", runs=False,
        says="asynchronous off-policy training is faster in wall clock and lighter in memory "
             "than synchronous on-policy training",
        why="needs the paper's asynchronous trainers and generation workers on several GPUs; "
            "spo.py is one synchronous process"),
    "cr-s61": dict(
        paper="[CR] §6.1", runs=False,
        says="TOPR was significantly easier to train than RLOO: less variance, faster "
             "convergence, less memory",
        why="ease of tuning is a judgement, and variance and memory are not per-seed contrasts; "
            "cr-table1 shows both methods' seeds and minutes"),
}
# What differs, the paper's setting -> ours, knob by knob (shown before any figure); a claim
# run on another's runs reads that claim's rows (DEPARTURES_AS) and adds its own.
DEPARTURES = {
    "topr-fig1": [
        ('model', 'Llama 3 8B Instruct (§4.1)', 'tiny: 1M-param char model after sft.py'),
        ('lr', '5e-7 constant, Adafactor (§4.2)', '5e-5 constant, AdamW'),
        ('batch', '1 a GPU on one H100 node; total not given (§4.2)', '64 samples a step'),
        ('steps', 'one epoch; step count not given (§4.2)', 'one pass: 500 steps of 64'),
        ('data', 'GSM8K train, 7,473 x 16 base-model samples (§4.1)',
         'POOL: Countdown 3-4 numbers, 4,000 x 8 = 32,000'),
        ('positive share', '~67% (negatives ~33%, §4.3 Fig. 7 text)', '~19% (POOL, 3 seeds)'),
        ('sampler', 'T 1, top-p 1, top-k 500, 512 tokens (§4.2)',
         'T 1, top-p 1, no top-k, 64 tokens'),
        ('baselines', 'PPO (eps 0.2) and DPO also in Fig. 1 (§4.3)',
         'not run: naive and TOPR only'),
        ('metric', 'pass@1, GSM8K test 1,319, 64 samples (§4.1-4.2)',
         'acc at T 1, 8 samples, 200 problems a size'),
        ('eval sampler', 'not given (§4.2)', 'T 1, top-p 1'),
    ],
    "topr-fig4": [
        ('model', 'Llama 3 8B Instruct (§4.1)', 'tiny: 1M-param char model after sft.py'),
        ('lr', '5e-7 constant, Adafactor (§4.2)', '5e-5 constant, AdamW'),
        ('batch', '1 a GPU on one H100 node; total not given (§4.2)', '64 samples a step'),
        ('steps', 'one epoch each; step count not given (§4.2-4.3)',
         'one pass: all 500 steps, positives ~96'),
        ('data', "Fig. 1's samples, negatives removed; + MATH (§4.3)",
         "POOL's correct (~6,100) vs all 32,000"),
        ('positive share', 'all: ~67% (negatives ~33%, §4.3)', 'all: ~19% (POOL)'),
        ('sampler', 'T 1, top-p 1, top-k 500, 512 tokens (§4.2)',
         'T 1, top-p 1, no top-k, 64 tokens'),
        ('metric', 'GSM8K test pass@1; histogram of correct gens (Fig. 4)',
         'acc at T 1 (8 a problem); none correct: 1 - pass@8'),
        ('histogram samples', 'not given', '8 a problem'),
        ('eval sampler', 'not given (§4.2)', 'T 1, top-p 1'),
    ],
    "topr-fig5": [
        ('model', 'Llama 3 8B Instruct (§4.1)', 'tiny: 1M-param char model after sft.py'),
        ('lr', '5e-7 constant, Adafactor (§4.2)', '5e-5 constant, AdamW'),
        ('batch', '1 a GPU on one H100 node; total not given (§4.2)', '64 samples a step'),
        ('steps', 'one epoch of 50,000; step count not given (§4.2-4.3)',
         'one pass: 100 steps of 64'),
        ('data', '50,000 GSM8K samples at p = 10% / 50% (§4.3)',
         '6,400 from POOL at p = 10% / 50%'),
        ('baseline c', 'set for p~ 1% to 100%; points not given (§4.3)',
         'Eq. 12 for p~ 1, 5, 10, 20, 50, 100%'),
        ('sampler', 'T 1, top-p 1, top-k 500, 512 tokens (§4.2)',
         'T 1, top-p 1, no top-k, 64 tokens'),
        ('metric', 'test acc, GSM8K test 1,319 (Fig. 5, §4.1)',
         'acc at T 1, 8 samples, 200 problems a size'),
        ('eval sampler', 'not given (§4.2)', 'T 1, top-p 1'),
    ],
    "topr-fig6": [
        ('model', 'Llama 3 8B Instruct (§4.1)', 'tiny: 1M-param char model after sft.py'),
        ('lr', '5e-7 constant, Adafactor (§4.2)', '5e-5 constant, AdamW'),
        ('batch', '1 a GPU on one H100 node; total not given (§4.2)', '64 samples a step'),
        ('steps', 'one epoch; step count not given (§4.2)', 'one pass: 100 steps of 64'),
        ('data', 'p = 10% sets, GSM8K and MATH (Fig. 6)',
         "topr-fig5's p = 10% set: 6,400 from POOL"),
        ('baseline c', 'set for p~ 1% to 100%; points not given (Fig. 6)',
         'Eq. 12 for p~ 1, 5, 10, 20, 50, 100%'),
        ('sampler', 'T 1, top-p 1, top-k 500, 512 tokens (§4.2)',
         'T 1, top-p 1, no top-k, 64 tokens'),
        ('metric', 'test acc, GSM8K 1,319 and MATH-500 (Fig. 6, §4.1)',
         'acc at T 1, 8 samples, 200 problems a size'),
        ('eval sampler', 'not given (§4.2)', 'T 1, top-p 1'),
    ],
    "agro-fig2": [
        ('model', 'Llama 3 8B after SFT on MATH train (§8, App. A)',
         'tiny: 1M-param char model after sft.py'),
        ('lr', 'same for all arms; value not given (§8, App. A)',
         '6e-5 AdamW, constant after 10 warm-up'),
        ('batch', 'B prompts x n samples: lost from our copy (App. A)', '32 prompts x 8'),
        ('steps', 'epochs on MATH train; count not given (Fig. 2)',
         '125 steps (4,000 prompts, < 1 epoch)'),
        ('data', 'MATH train / test; sizes lost from our copy (App. A)',
         'Countdown 3-4 numbers; 200 held out a size'),
        ('positive share', 'not given', 'start model ~19% correct at T 1'),
        ('reward', 'match / no match: values lost from our copy (§8)',
         "1 / 0.1 / 0 (task's 'original')"),
        ('beta', 'one beta: value lost from our copy (§8.1)', '0.05, per sequence'),
        ('on-policy AGRO', 'g_LR at weight 1 (Eqs. 5-6, lost from our copy)',
         'lambda_LR 1, and beta/2 (ours)'),
        ('g_LR baseline', 'variance baseline; which one ran not given (§4.2)',
         'var: unbiased, centred (agro.py default)'),
        ('sampler', 'train and eval temperature lost from our copy (App. A)',
         'T 1, no top-p, 64 tokens; eval 8 a problem'),
        ('metric', 'train reward (Fig. 2); test performance (Fig. 3)',
         'held-out acc at T 1, mean of 5 evals'),
        ('seeds', '2 (§8.1)', '3'),
    ],
    "agro-fig5": [
        ('model', 'Llama 3 8B after SFT on MATH train (§8, App. A)',
         'tiny: 1M-param char model after sft.py'),
        ('lr', 'value not given (§8, App. A)', '6e-5 AdamW after 10 warm-up (agro.py default)'),
        ('batch', 'B prompts x n samples: lost from our copy (App. A)', '32 prompts x 8'),
        ('epochs', 'count not given (Fig. 5, §8.2)', '10 epochs of 16 steps (160 steps)'),
        ('data', 'pi_ref samples on MATH train, fixed; count lost (§8.2)',
         '512 prompts x 8 of the start model at T 1'),
        ('positive share', 'not given', "~19% (start model's acc at T 1)"),
        ('reward', 'match / no match: values lost from our copy (§8)',
         "1 / 0.1 / 0 (task's 'original')"),
        ('beta', 'one beta for AGRO and KL-PG: value lost (§8.2)',
         '0.3 (agro.py off-policy default); PG: 0'),
        ('sampler', 'train and eval temperature lost from our copy (App. A)',
         'T 1, no top-p, 64 tokens; eval 8 a problem'),
        ('metric', 'test performance against epochs (Fig. 5)',
         'held-out acc at T 1: peak, mean over epochs'),
        ('seeds', 'not given', '3'),
    ],
    "agro-fig6": [
        ('model', 'Llama 3 8B after SFT on MATH train (§8, App. A)',
         'tiny: 1M-param char model after sft.py'),
        ('lr', 'value not given (§8, App. A)', '6e-5 AdamW, constant after 10 warm-up'),
        ('batch', 'B prompts x n samples: lost from our copy (App. A)', '32 prompts x 8'),
        ('steps', 'not given (Fig. 6)', '125 steps'),
        ('data', 'MATH train / test; sizes lost from our copy (App. A)',
         'Countdown 3-4 numbers; 200 held out a size'),
        ('positive share', 'not given', 'start model ~19% correct at T 1'),
        ('reward', 'match / no match: values lost from our copy (§8)',
         "1 / 0.1 / 0 (task's 'original')"),
        ('beta', 'several, 0 included: values lost from our copy (§8.3)', '0, 0.02, 0.05, 0.5'),
        ('arms', 'RLOO and off-policy AGRO, each per beta (§8.3)',
         'agro.py lambda_LR 0: one estimator for both'),
        ('sampler', 'train and eval temperature lost from our copy (App. A)',
         'T 1, no top-p, 64 tokens; eval 8 a problem'),
        ('metric', 'performance against steps and against KL (Fig. 6)',
         'acc gain per nat of KL at end; mean acc along run'),
        ('seeds', 'not given', '3'),
    ],
    "spo-fig1": [
        ('model', 'Llama-3.1-8B-Instruct (§5)', 'tiny: 1M-param char model after sft.py'),
        ('lr', '6e-8 AdamW, constant after 200 warm-up (§5)',
         '6e-5 AdamW, constant after 10 warm-up (both arms)'),
        ('steps', '100,000 (§5)', '125'),
        ('batch', '128 (§5); samples a prompt not given', '256 = 32 prompts x 8 (both arms)'),
        ('data', 'CodeContests train, deduped vs TACO test (§5)',
         'Countdown 3-4 numbers, 256 problems a size'),
        ('positive share', 'not given', 'start pass@1 30.7% at T 0.4'),
        ('Q0 estimate', '800 samples of pi_0 a prompt (§3.1.3, §5)',
         '64 a prompt at T 1 (spo.py default)'),
        ('offline set', 'correct, deduped; 5 sources incl. Llama-70B, human (§5)',
         'correct, deduped; start model, SPO run, stand-in'),
        ('offline sampler', 'pi_0 at random temperature, top-p 0.95 (§5)',
         'T ~ U(0.1, 1.0), top-p 0.95, 8 a problem'),
        ('PPO', 'PPO: GAE value model, clipped loss, IS (§3.1.4)',
         'stand-in: rloo.py, KL in the reward (ours)'),
        ('PPO reward', "r in {0, -1} (§2.1); PPO's scale not stated",
         "1 / 0.1 / 0 (rloo.py default: 'original')"),
        ('PPO sampler', 'behaviour policy every batch; T not given (§5)',
         'T 1, no top-p, current weights each step'),
        ('metric', 'pass@10, pass@1: CodeContests + TACO tests (§5)',
         'pass@10, pass@1: 200 Countdown problems a size'),
        ('curves', 'pass@10 against step (Fig. 1)', 'pass@20 at T 1, 50 a size, every 25 steps'),
    ],
    "cr-table1": [
        ('model', 'Qwen2.5-0.5B after SFT (§1, §3.4)', 'tiny: 1M-param char model after sft.py'),
        ('SFT data', 'cog_behav_all_strategies, ~half correct (§4.1)',
         'solver demonstrations (sft.py defaults)'),
        ('data', 'Countdown: ~1,000 of ~47,000 examples (§4.1)',
         'seeded Countdown 3-4 numbers, 1,000 prompts'),
        ('test set', '200 examples (Table 1); numbers a puzzle not given',
         '200 problems a size, 3 and 4 numbers'),
        ('TOPR data', '1,000 at T 0.15, top-p 0.85 (§4.1; §3.2: n 2, 0.9)',
         '1,000 x 1 at T 0.15, top-p 0.85'),
        ('positive share', 'not given', 'not reported'),
        ('TOPR epochs', 'not given', '2 (64 steps; A+B: 2 rounds, 128)'),
        ('TOPR batch', '32 best (§5.3); 64 in the lr sweep (§5.2)', '32'),
        ('RLOO lr', "not given ('matched hyperparameters', §3.5)", '1e-4'),
        ('RLOO batch', 'k = 16, batch of 1 on one GPU (§6.1)', '4 prompts x 16'),
        ('RLOO steps', 'not given; ~1,000 prompts (§4.1)', '250 steps (1,000 prompts)'),
        ('RLOO reward', "not stated ('matched ... reward signals', §3.5)",
         'original: 1 / 0.1 / 0'),
        ('metric', 'Average Score, 200 examples; samples not given',
         "mean 'original' reward, 8 samples a problem"),
        ("metric's reward", 'not stated which reward scores Table 1 (§4.3)',
         "'original' for every row"),
        ('max tokens', 'not given', '64'),
    ],
    "topr-fig7": [("clip", "1.0 and 100.0 (Fig. 7)", "1 and 100")],
    "topr-fig8": [
        ("model", "DeepSeek-R1 8B, Llama 3 8B (Fig. 8)", "tiny: 1M-param char model after sft.py"),
        ("lr", "5e-7 constant, Adafactor (§4.2)", "5e-5 constant, AdamW"),
        ("data", "GSM8K and MATH, N = 50,000 a round (§4.3)",
         "Countdown, 500 prompts x 8 a round"),
        ("candidates", "64 a problem, first positive kept (§4.3)",
         "8 a prompt, first positive kept"),
        ("kept a round", "50,000 (§4.3)", "1,000 of 4,000 (--keep)"),
        ("rounds", "several; count not given (Fig. 8)", "6"),
        ("reward, c", "+1 / -1, no baseline (§4.2)", "+1 / -1, c = -0.8 (topr.py's default)"),
        ("metric", "pass@1 and maj@16 (Fig. 8)", "acc at T 1, 8 samples, 200 problems a size"),
    ],
    "agro-fig4": [("off-policy data", "pi_ref's samples; count lost from our copy (§8.2)",
                   "512 prompts x 8 of the start model, beta 0.05")],
    "cr-s51": [("reward", "B alone (§5.1)", "B alone, Table 1's TOPR setting")],
    "cr-table2": [("test set", "1,000 harder puzzles, larger numbers (Table 2)",
                   "4-number puzzles, 200 (our stand-in)")],
}
DEPARTURES_AS = {"topr-fig3": "topr-fig1", "topr-s43": "topr-fig5", "topr-fig7": "topr-fig1",
                 "agro-s81": "agro-fig2", "agro-fig4": "agro-fig2", "spo-both": "spo-fig1",
                 "cr-s51": "cr-table1", "cr-table2": "cr-table1"}


def departures(cid: str) -> list[tuple[str, str, str]]:
    """The knobs where a claim's miniature differs from the paper (DEPARTURES)."""
    return DEPARTURES.get(DEPARTURES_AS.get(cid), []) + DEPARTURES.get(cid, [])


# --paper-settings: the paper's values of the knobs that a GPU and a real model can take, by claim
# and script (later flags win). What our copy of a paper lost ([AGRO]'s beta, batch and lr) or the
# paper never gave ([CR]'s RLOO lr, lengths) stays ours.
TOPR_PAPER = {"topr.py": ["--lr", "5e-7", "--max-new-tokens", "512"]}  # [TOPR] §4.2
SPO_PAPER = {"spo.py": ["--lr", "6e-8", "--warmup", "200", "--q0-samples", "800"]}  # [SPO] §5
PAPER_SETTINGS = {**{cid: TOPR_PAPER for cid in CLAIMS if cid.startswith("topr")},
                  "pool": TOPR_PAPER, "spo-fig1": SPO_PAPER, "spo-both": SPO_PAPER}
# The shorter budgets of --quick, by script (later flags win): a smoke run of every claim.
QUICK = {"topr.py": ["--prompts", "64", "--eval-size", "20", "--eval-k", "4", "--eval-every", "4"],
         "rloo.py": ["--steps", "6", "--eval-every", "3", "--eval-size", "20", "--eval-k", "4"],
         "agro.py": ["--steps", "6", "--eval-every", "3", "--eval-size", "20", "--eval-k", "4",
                     "--offline-prompts", "16"],
         "spo.py": ["--steps", "6", "--eval-every", "3", "--eval-size", "20", "--eval-k", "4",
                    "--train-size", "16", "--q0-samples", "8", "--batch-size", "32"]}


# ---- Running the arms ----------------------------------------------------------------------------
def run(script: str, flags: list[str], out: str, seed: int, args, cid: str = "") -> str:
    """One script from the start model with this seed, to its end (or the finished run in out)."""
    cmd = command(script, flags, seed, args, cid) + ["--threads", str(args.threads), "--out", out]
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    name = os.path.relpath(out, args.out).replace(os.sep, "-")
    compare.run_script(name, cmd, out, os.path.join(args.out, "logs"))
    return out


def command(script: str, flags: list[str], seed: int, args, cid: str = "") -> list[str]:
    """An arm's command from the start model with this seed (its --quick or --paper-settings
    flags last: they win)."""
    extra = QUICK.get(script, []) if args.quick else []
    if getattr(args, "paper_settings", False):
        extra += PAPER_SETTINGS.get(cid, {}).get(script, [])
    return [sys.executable, script, "--model", args.sft, "--seed", str(seed), *flags, *extra]


def dry_run(ids: list[str], args) -> list[str]:
    """Every arm's command of these claims for every seed, run from the repository, nothing run;
    {pool} and the like name the files a run composes first (pool_files, spo_offline)."""
    lines = []
    if any(x.startswith(("{pool", "{pos", "{d")) for cid in ids
           for _, flags, _ in CLAIMS[cid]["arms"].values() for x in flags):
        lines += ["# POOL, first: the start model's samples, one file a seed (pool_files)"]
        lines += [" ".join(["python", *command("topr.py", POOL, s, args, "pool")[1:]])
                  for s in args.seeds]
    for cid in ids:
        for arm, (script, flags, role) in CLAIMS[cid]["arms"].items():
            shared = CLAIMS[cid].get("shared", {}).get(arm)
            lines += [f"# {cid} / {arm} ({role})" + (f": the runs of {shared}" if shared else "")]
            lines += [" ".join(["python", *command(script, flags, s, args, cid)[1:]])
                      for s in args.seeds]
    return lines


def run_dir(cid: str, arm: str, seed: int, args) -> str:
    """An arm's run folder; an arm identical to another claim's shares that claim's runs."""
    return os.path.join(args.out, CLAIMS[cid].get("shared", {}).get(arm, f"{cid}/{arm}")
                        + f"-s{seed}")


def side_by_side(fn, jobs: list, n: int) -> list:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda job: fn(*job), jobs))


def pool_files(seed: int, args) -> dict:
    """POOL (the start model's samples, one topr.py run) and the data composed from it: POS (its
    correct samples), d10 / d50 (N_MIX samples at 10% / 50% positives, drawn within each class
    with this seed), and for probes d67 (every positive, negatives to 33%: [TOPR] §4.3's base
    share) and d10n3 (d10 from 3-number puzzles alone)."""
    out = os.path.join(args.out, f"pool-s{seed}")
    quick = ["--prompts", "64", "--eval-size", "1"] if args.quick else []
    run("topr.py", POOL + quick, out, seed, args, "pool")
    files = {"pool": os.path.join(out, "data-0.jsonl")}
    with open(files["pool"]) as f:
        rows = f.readlines()
    task = get_task("countdown")
    ok = [task.is_correct((row := json.loads(r))["problem"], row["completion"]) for r in rows]
    good = [r for r, c in zip(rows, ok) if c]
    bad = [r for r, c in zip(rows, ok) if not c]
    n = min(N_MIX, len(rows) // 8) if args.quick else N_MIX
    rng = random.Random(seed)
    parts = {"pos": good}
    for p in (10, 50):
        k = round(n * p / 100)
        parts[f"d{p}"] = rng.sample(good, k) + rng.sample(bad, n - k)
    probe = random.Random(1000 + seed)  # a probe's draw leaves the others' as they were
    parts["d67"] = good + probe.sample(bad, round(len(good) * 33 / 67))  # [TOPR] §4.3's share
    three = [len(json.loads(r)["problem"]["nums"]) == 3 for r in rows]
    k = round(n / 10)  # d10n3: 10% positives, 3-number puzzles only
    parts["d10n3"] = probe.sample([r for r, c, t in zip(rows, ok, three) if c and t], k) + \
        probe.sample([r for r, c, t in zip(rows, ok, three) if not c and t], n - k)
    for name, chosen in parts.items():
        files[name] = os.path.join(out, f"{name}.jsonl")
        (probe if name in ("d67", "d10n3") else rng).shuffle(chosen)  # the same draws always
        if not os.path.exists(files[name]):
            with open(files[name] + ".tmp", "w") as f:
                f.writelines(chosen)
            os.replace(files[name] + ".tmp", files[name])
    files["p"] = len(good) / len(rows)
    return files


def spo_offline(seed: int, claim_dir: str, args) -> dict:
    """[SPO] §5's offline set in miniature: correct samples (T ~ U(0.1, 1), top-p 0.95) of the
    start model, the online SPO run and the PPO stand-in, one file, duplicates dropped."""
    path = os.path.join(claim_dir, f"offline-s{seed}.jsonl")
    if not os.path.exists(path):
        seen, rows = set(), []
        for name, model in [("start", args.sft), ("spo", f"{claim_dir}/spo-s{seed}/final"),
                            ("ppo", f"{claim_dir}/ppo-s{seed}/final")]:
            part = os.path.join(claim_dir, f"offline-{name}-s{seed}.jsonl")
            if not os.path.exists(part):
                quick = ["--train-size", "16"] if args.quick else []
                subprocess.run(
                    [sys.executable, "scripts/spo_offline_data.py", "--model", model, "--out",
                     part, "--correct-only", "--seed", str(seed), "--threads",
                     str(args.threads * args.jobs), *quick], cwd=ROOT, check=True)
            for line in open(part):
                r = json.loads(line)
                key = (json.dumps(r["nums"]), r["target"], r["completion"])
                if key not in seen:
                    seen.add(key)
                    rows.append(line)
        with open(path + ".tmp", "w") as f:
            f.writelines(rows)
        os.replace(path + ".tmp", path)
    return {"offline": path, "q0": os.path.join(claim_dir, f"spo-s{seed}", "q0.jsonl")}


def final_eval(model: str, seed: int, k: int, decoding: dict, size: int, threads: int) -> dict:
    """Correct answers out of k a held-out problem (the runs' problems of this seed) and the mean
    reward of every variant, under one decoding; in a fresh process (torch state)."""
    started = time.time()
    common.setup(seed, threads)
    task = get_task("countdown")
    m, tok = common.load_model(model)
    engine = common.make_engine("auto", m, tok, model, seed=seed)
    out = {"correct": [], "rewards": {}}
    for n in SIZES:
        problems = task.get_problems("test", size, size=n, seed=seed)
        prompts = common.encode_prompts(task, problems, tok, common.prompt_style(m, tok))
        groups = engine.generate(prompts, common.SamplingConfig(k, 64, seed=seed, **decoding))
        out["correct"] += [sum(task.is_correct(p, s.text) for s in g)
                           for p, g in zip(problems, groups)]
        scores = scoring.score(task, problems, groups, "sampled", all_rewards=True)
        for v in task.REWARD_VARIANTS:
            out["rewards"].setdefault(v, []).append(scores[f"sampled/reward_{v}"])
    out["seconds"] = time.time() - started
    return out


def final_evals(todo: list[tuple[str, str, int]], k: int, decoding: dict, args) -> list[dict]:
    """final_eval of (model, cache file, seed) each, kept in its cache file."""
    size = 20 if args.quick else 200
    missing = [(m, c, s) for m, c, s in todo if not os.path.exists(c)]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool:
        for (_, cache, _), r in zip(missing, pool.map(
                final_eval, *zip(*[(m, s, k, decoding, size, args.threads)
                                   for m, _, s in missing]))):
            compare.write_json(cache, r)
    return [compare.read_json(c) for _, c, _ in todo]


# ---- What each run is worth ----------------------------------------------------------------------
def acc(row: dict) -> float:
    """Held-out accuracy at T = 1 over both sizes (the runs' own evaluation), in %."""
    return 100 * statistics.mean(row[f"eval{n}/sampled/accuracy"] for n in SIZES)


def figures(out: str) -> dict:
    """A run's curve (step, acc, format rate, pass@k) and its summary figures."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    evals = [r for r in rows if f"eval{SIZES[0]}/sampled/accuracy" in r]
    train = [r for r in rows if "loss" in r]
    pk = next(key for key in evals[-1] if key.startswith(f"eval{SIZES[0]}/pass@"))[6:]
    curve = [{"step": e["step"], "acc": acc(e),
              **{f"acc{n}": 100 * e[f"eval{n}/sampled/accuracy"] for n in SIZES},
              "format": 100 * statistics.mean(e[f"eval{n}/sampled/format_rate"] for n in SIZES),
              "pass": 100 * statistics.mean(e[f"eval{n}/{pk}"] for n in SIZES)} for e in evals]
    kls = [(r["step"], r["kl_to_ref"]) for r in train if "kl_to_ref" in r]
    kl = [k for _, k in kls[-10:]]
    for last, point in zip([-1] + [c["step"] for c in curve], curve):  # batches since the last
        since = [k for step, k in kls if last < step <= point["step"]]
        point["kl"] = statistics.mean(since) if since else 0.0  # step 0: the start model itself
    return {"curve": curve, "start": curve[0]["acc"], "acc": curve[-1]["acc"],
            **{f"acc{n}": curve[-1][f"acc{n}"] for n in SIZES},
            **{f"start{n}": curve[0][f"acc{n}"] for n in SIZES},
            "pass": curve[-1]["pass"], "format": curve[-1]["format"],
            "peak": max(c["acc"] for c in curve), "steps": rows[-1]["step"],
            "area": statistics.mean(c["acc"] for c in curve[1:]) if len(curve) > 1 else math.nan,
            "kl": statistics.mean(kl) if kl else math.nan,
            "reward": [(r["step"], r["reward"]) for r in train if "reward" in r]}


def pass_k(counts: list[int], n: int, k: int) -> float:
    return 100 * statistics.mean(scoring.pass_at_k(n, c, k) for c in counts)


def run_claim(cid: str, args) -> dict:
    """Every arm of one claim for every seed, then its figures, contrasts and verdict."""
    claim, claim_dir = dict(CLAIMS[cid]), os.path.join(args.out, cid)
    if args.skip_probes:  # the claim's own arms and contrasts alone
        claim["arms"] = {a: v for a, v in claim["arms"].items() if not v[2].startswith("probe")}
        claim["contrasts"] = [c for c in claim["contrasts"] if len(c) == 2 or c[2] != "probe"]
    os.makedirs(claim_dir, exist_ok=True)
    files = {s: {} for s in args.seeds}
    if any("{pool}" in " ".join(f) or "{d" in " ".join(f) or "{pos}" in " ".join(f)
           for _, f, _ in claim["arms"].values()):
        for s, fl in zip(args.seeds, side_by_side(pool_files, [(s, args) for s in args.seeds],
                                                  args.jobs)):
            files[s].update(fl)
    later = [a for a, (_, f, _) in claim["arms"].items() if "{offline}" in f]
    jobs = []
    for stage in ([a for a in claim["arms"] if a not in later], later):
        if stage is later and later:  # spo-fig1's half-online arm needs the others' models
            for s in args.seeds:
                files[s].update(spo_offline(s, claim_dir, args))
        jobs = [(claim["arms"][a][0], [x.format(**files[s]) for x in claim["arms"][a][1]],
                 run_dir(cid, a, s, args), s, args, cid)
                for a in stage for s in args.seeds]
        side_by_side(run, jobs, args.jobs)
    m = {s: {a: figures(run_dir(cid, a, s, args)) for a in claim["arms"]}
         for s in args.seeds}
    runs = [run_dir(cid, a, s, args) for a in claim["arms"] for s in args.seeds]
    runs += [os.path.dirname(f["pool"]) for f in files.values() if "pool" in f]
    kind = claim.get("evaluate")  # a final evaluation of every arm's model, in its run folder
    if kind:  # spo: pass@1 and pass@10 from 20 samples at T = 0.4, top-p 0.95; cr: the mean
        # reward_original of 8 samples at T = 0.15, top-p 0.9, top-k 30
        k, decoding = ((4 if args.quick else 20), SPO_EVAL) if kind == "spo" else \
            (8, compare.REPORT_DECODING)
        n = (2 if args.quick else 10)
        start = {s: os.path.join(claim_dir, f"start-eval-s{s}.json") for s in args.seeds}
        end = {(a, s): os.path.join(run_dir(cid, a, s, args), f"eval-{kind}.json")
               for a in claim["arms"] for s in args.seeds}
        todo = [(args.sft, start[s], s) for s in args.seeds] + [
            (os.path.join(os.path.dirname(c), "final"), c, s) for (_, s), c in end.items()]
        ev = dict(zip([c for _, c, _ in todo], final_evals(todo, k, decoding, args)))
        runs += [c for _, c, _ in todo]
        for (a, s), c in end.items():
            before, after = ev[start[s]], ev[c]
            if kind == "spo":
                m[s][a].update(p1=pass_k(after["correct"], k, 1),
                               p10=pass_k(after["correct"], k, n),
                               p1_0=pass_k(before["correct"], k, 1),
                               p10_0=pass_k(before["correct"], k, n))
            else:  # rewards["original"]: one mean a size, in SIZES' order
                m[s][a].update(score=statistics.mean(after["rewards"]["original"]),
                               score0=statistics.mean(before["rewards"]["original"]),
                               score4=after["rewards"]["original"][SIZES.index(4)],
                               score4_0=before["rewards"]["original"][SIZES.index(4)])
    contrasts = []
    for text, fn, *role in claim["contrasts"]:  # with a role: shown, not in the earlier verdict
        d = [fn(m[s]) for s in args.seeds]
        contrasts.append({"text": text, "d": d, "verdict": verdict_of(d, args.quick),
                          "probe": bool(role), "role": role[0] if role else ""})
    result = {"claim": cid, "seeds": args.seeds, "quick": args.quick,
              "runs": sorted(set(runs)), "jobs": args.jobs, "figures": m,
              "p": {s: files[s].get("p") for s in args.seeds}, "contrasts": contrasts,
              "commands": {a: [sc, *fl] for a, (sc, fl, _) in claim["arms"].items()}}
    result["primary"], result["commit"] = primary_of(cid, result), compare.commit()
    result["verdict"] = result["primary"]["verdict"]
    if cid in EARLIER_CLAIMS:  # and under the rule these contrasts were registered with
        result["earlier_verdict"] = claim_verdict(
            [c["verdict"] for c in contrasts if not c["probe"]])
    result["minutes"] = minutes([result])  # the claim alone, its shared runs included
    result["verdict_minutes"] = minutes([verdict_runs(cid, result, args)])
    compare.write_json(os.path.join(claim_dir, "result.json"), result)
    if not args.quick:  # kept in git: --render-only rebuilds the doc on a clean checkout
        compare.write_json(os.path.join(ARCHIVE, f"{cid}.json"), result)
    print(f"[claims] {cid}: {result['verdict']} ({result['minutes']:.0f} min)", flush=True)
    return result


def primary_of(cid: str, r: dict) -> dict:
    """The primary contrast of a claim's result, d from its figures seed by seed, and RULE's
    verdict and margin (a result.json made before the rule gets them here too)."""
    text, fn, delta, kind = CLAIMS[cid]["primary"]
    d = []
    for s in r["seeds"]:  # result.json keys seeds as text
        try:
            d.append(fn(r["figures"][str(s)] if str(s) in r["figures"] else r["figures"][s]))
        except ZeroDivisionError:
            d.append(math.nan)
    verdict, margin = ("smoke", math.nan) if r["quick"] else primary_verdict(d, delta, kind)
    return {"text": text, "d": d, "delta": delta, "kind": kind, "verdict": verdict,
            "margin": margin}


def minutes(results: list[dict]) -> float:
    """Wall clock of the runs and final evaluations behind these results, each counted once, run
    --jobs side by side."""
    seen, total = set(), 0.0
    for r in results:
        if not any(os.path.exists(path) for path in r["runs"]):  # an archived result alone
            total += 60 * r.get("minutes", 0.0) * r["jobs"]
            continue
        for path in set(r["runs"]) - seen:
            seen.add(path)
            total += compare.read_json(path).get("seconds", 0) if path.endswith(".json") else \
                compare.read_json(os.path.join(path, "usage.json"))["wall_s"]
    return total / 60 / max(r["jobs"] for r in results) if results else 0.0


def verdict_runs(cid: str, r: dict, args) -> dict:
    """A claim's result with only the runs and evaluations behind its verdict (no probe's)."""
    probes = {run_dir(cid, a, s, args) for a, (_, _, label) in CLAIMS[cid]["arms"].items()
              if label.startswith("probe") for s in r["seeds"]}
    return dict(r, runs=[x for x in r["runs"]
                         if x not in probes and os.path.dirname(x) not in probes],
                minutes=r.get("verdict_minutes", r.get("minutes", 0.0)))


def primary_verdict(d: list[float], delta: float, kind: str = "more") -> tuple[str, float]:
    """(verdict, margin) of a primary contrast, d seed by seed (RULE). kind: "more" (the paper
    claims d > 0) or "equal" (the paper claims no difference, |d| < delta)."""
    nans = sum(math.isnan(x) for x in d)  # e.g. a gain per nat where nothing was gained
    if nans and len(d) - nans < 3:
        return "undefined (d is not a number in too many seeds)", math.nan
    d = [x for x in d if not math.isnan(x)]
    if len(d) < 3:
        return "too few seeds", math.nan
    med = statistics.median(d)
    near = sum(abs(x) < delta for x in d) >= len(d) - 1 and abs(med) < delta  # no difference
    if kind == "equal":
        if near:
            return "equivalent", delta - abs(med)
        if abs(med) >= delta:
            return "not reproduced", abs(med) - delta
        return "inconclusive", -(delta - abs(med))
    if kind != "more":
        raise ValueError(f"unknown kind of claim {kind!r}")
    if med >= delta:
        return "reproduced", med - delta
    if med <= -delta:
        return "not reproduced", -delta - med
    if near:
        return "not reproduced", delta - abs(med)  # no difference where the paper claims one
    return "inconclusive", -min(delta - med, med + delta)


def verdict_of(d: list[float], quick: bool = False) -> str:
    """The rule of 1987642 (EARLIER_RULE) for one contrast, d seed by seed."""
    if quick or len(d) < 2:
        return "smoke" if quick else "one seed"
    m, sd = statistics.mean(d), statistics.stdev(d)
    return "reproduced" if m > sd else "not reproduced" if m < -sd else "inconclusive"


def claim_verdict(verdicts: list[str]) -> str:
    """The rule of 1987642 (EARLIER_RULE) for a claim from its contrasts' verdicts."""
    if set(verdicts) <= {"smoke", "one seed"}:
        return verdicts[0]
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if "reproduced" not in verdicts and "not reproduced" in verdicts:
        return "not reproduced"
    return "inconclusive" if all(v == "inconclusive" for v in verdicts) else "partly"


# ---- docs/CLAIMS.md and its plots ----------------------------------------------------------------
def ms(values: list[float], digits: int = 1) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    sd = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{digits}f}{sd}"


HEADLINE = {"spo-fig1": [("pass@10", "p10"), ("pass@1", "p1")],  # else: acc at T = 1, %
            "cr-table1": [("mean reward (original)", "score")],
            "agro-fig6": [("acc", "acc"), ("mean along training", "area"), ("KL to start", "kl")],
            "agro-fig2": [("acc", "acc"), ("mean along training", "area")],
            "agro-fig5": [("acc", "acc"), ("peak", "peak"), ("mean over epochs", "area")],
            "topr-fig4": [("acc", "acc"), ("no correct answer of k", "none")]}


def arm_table(cid: str, r: dict) -> list[str]:
    cols = HEADLINE.get(cid, [("acc", "acc")]) + [(f"acc {n}", f"acc{n}") for n in SIZES]
    digits = CLAIMS[cid].get("digits", 1)
    seeds = [str(s) for s in r["seeds"]]
    start = {"p10": "p10_0", "p1": "p1_0", "score": "score0", "acc": "start", "area": "start",
             "peak": "start", "none": "none0", **{f"acc{n}": f"start{n}" for n in SIZES}}
    lines = ["| arm | " + " | ".join(c for c, _ in cols) + " | steps | command (+ --model START "
             "--seed S) |", "|---" * (len(cols) + 3) + "|"]
    first = next(iter(r["commands"]))
    lines.append("| start model | " + " | ".join(
        ms([get(r["figures"][s][first], start.get(k, "")) for s in seeds],
           digits * (k == "score") or 1) for _, k in cols)
        + " | 0 | |")
    for arm, cmd in r["commands"].items():
        role = CLAIMS[cid]["arms"][arm][2]
        if role.startswith("probe"):
            role += "; post hoc, added in " + next(
                (c for start, c in PROBES_ADDED.items() if arm.startswith(start)), "?")
        lines.append(f"| {arm} ({role}) | " + " | ".join(
            ms([get(r["figures"][s][arm], k) for s in seeds], digits * (k == "score") or 1)
            for _, k in cols)
            + f" | {r['figures'][seeds[0]][arm]['steps']} | `{' '.join(cmd)}` |")
    return lines


def get(f: dict, key: str) -> float:
    if key == "none":  # no correct answer among the final evaluation's k samples, %
        return 100 - f["pass"]
    if key == "none0":
        return 100 - f["curve"][0]["pass"]
    return f.get(key, math.nan)


def plot(cid: str, r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kind, seeds, arms = CLAIMS[cid]["plot"], [str(s) for s in r["seeds"]], r["commands"]

    def style(arm, label=None):  # probes dashed
        probe = CLAIMS[cid]["arms"].get(arm, ("", "", ""))[2].startswith("probe")
        return {"linestyle": "--" if probe else "-", "label": (label or arm) + " (probe)" * probe}
    fig, axes = plt.subplots(1, 2 if kind == "kl" else 1, squeeze=False,
                             figsize=(11 if kind == "kl" else 6.4, 4))
    axes = list(axes[0])
    ax = axes[0]
    if kind == "ptilde":  # [TOPR] Figs. 5-6: final acc against p~ on a log axis
        groups = {}
        for arm in arms:
            name, pt = arm.rsplit("-pt", 1)
            groups.setdefault(name, []).append((float(pt), [r["figures"][s][arm]["acc"]
                                                            for s in seeds]))
        for name, pts in groups.items():
            xs, ys = zip(*pts)
            ax.errorbar(xs, [statistics.mean(y) for y in ys], capsize=3, marker="o",
                        yerr=[statistics.stdev(y) if len(y) > 1 else 0 for y in ys],
                        **style(f"{name}-pt10", name))
        ax.set_xscale("log")
        ax.set_xlabel("effective positive share p~ (%)")
    else:  # accuracy (pass@k for [SPO]) along training, or against KL; mean over seeds
        key = "pass" if cid == "spo-fig1" else "acc"
        for arm in arms:
            curves = [r["figures"][s][arm]["curve"] for s in seeds]
            n = min(len(c) for c in curves)
            ys = [statistics.mean(c[i][key] for c in curves) for i in range(n)]
            xs = [curves[0][i]["step"] for i in range(n)]
            ax.plot(xs, ys, marker="o", **style(arm))
            if kind == "kl":  # [AGRO] Fig. 6's right panel: the same evaluations against KL
                kls = [statistics.mean(c[i]["kl"] for c in curves) for i in range(n)]
                axes[1].plot(kls, ys, marker="o", **style(arm))
        ax.set_xlabel("step (16 an epoch)" if cid == "agro-fig5" else "step")
    for a in axes:
        a.set_ylabel("held-out pass@20 at T = 1 (%), 50 a size" if cid == "spo-fig1" else
                     "held-out accuracy at T = 1 (%), sizes 3 and 4")
        a.legend(fontsize=8)
    if kind == "kl":
        axes[1].set_xlabel("KL to the start model (nats, batches since the last evaluation)")
    ax.set_title(f"{CLAIMS[cid]['paper']}, mean of {len(seeds)} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_doc(args) -> str:
    """docs/CLAIMS.md from every OUT/<claim>/result.json, with docs/CLAIMS-notes.md appended."""
    results = {}
    for cid in CLAIMS:  # this --out's result, else the one kept in ARCHIVE
        for path in (os.path.join(args.out, cid, "result.json"),
                     os.path.join(ARCHIVE, f"{cid}.json")):
            if os.path.exists(path):
                results[cid] = compare.read_json(path)
                break
    for cid, r in results.items():  # the rule applied to every result, older ones included
        r["primary"] = primary_of(cid, r)
        if "earlier_verdict" not in r and cid in EARLIER_CLAIMS:  # made under the earlier rule
            r["earlier_verdict"] = r["verdict"]
    earlier_path = os.path.join(ARCHIVE, f"earlier-{EARLIER}.json")
    earlier = compare.read_json(earlier_path) if os.path.exists(earlier_path) else {"claims": {}}
    done = [r["primary"]["verdict"] for r in results.values()]
    runnable = [cid for cid, c in CLAIMS.items() if c.get("runs", True)]
    total = minutes(list(results.values()))
    own = minutes([verdict_runs(cid, r, args) for cid, r in results.items()])
    lines = [
        "# The papers' claims in miniature", "",
        "<!-- generated by scripts/claims.py: edit docs/CLAIMS-notes.md or the script -->", "",
        f"Command: `python scripts/claims.py all --sft {compare.repo_relative(args.sft)}"
        + (f" --seeds {','.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else "")
        + "` (each claim alone: its id instead of `all`; `--render-only` rebuilds this file from "
        "the runs' result.json). Commit " + compare.commit() + f", {compare.machine()}, "
        f"{time.strftime('%Y-%m-%d')}; start model `{compare.repo_relative(args.sft)}` "
        "(sft.py's defaults, seed 0); the claims below took "
        f"{own:.0f} minutes for their verdicts and {total:.0f} with the probes (each run "
        "counted once), two runs side by side on one "
        "thread each.", "",
        "Every figure is the mean ± sd over seeds of held-out accuracy (%) at T = 1 over 200 "
        "problems of 3 and of 4 numbers (the runs' own evaluation, 8 samples a problem), unless "
        "the claim names another metric. \"ours\" marks a stand-in for a baseline the project "
        "does not have. In the commands {pool} is a seed's POOL, the start model's samples "
        f"(`topr.py {' '.join(POOL)}` with --seed S: 4,000 prompts x 8 at T = 1); {{pos}}, "
        "{d10}, {d50}, {d67} and {d10n3} are composed from it (`claims.py:pool_files`); "
        "{offline} and {q0} are spo-fig1's offline set (`claims.py:spo_offline`) and its online "
        "run's Q0 estimate.", "", RULE, "", EARLIER_RULE, "",
        f"Primary contrasts: {summary(done, len(runnable))}; registered as not run here "
        f"{len(CLAIMS) - len(runnable)}.", "",
        "| claim | the paper says | what differs: the paper's -> ours | primary contrast: "
        "median d (per seed), margin | verdict | the rule of 1987642 |",
        "|---|---|---|---|---|---|"]
    for cid, claim in CLAIMS.items():
        r, digits = results.get(cid), claim.get("digits", 1)
        differs = "<br>".join(f"{knob}: {paper} -> {ours}"
                              for knob, paper, ours in departures(cid))
        if not claim.get("runs", True):
            lines.append(f"| {claim['paper']} | {claim['says']} | | | not run here: "
                         f"{claim['why']} | |")
            continue
        p = r["primary"] if r else None
        registered = f" (registered in {REGISTERED[cid]})" if cid in REGISTERED else ""
        cell = (f"{claim['primary'][0]}{registered}: "
                + (f"{median(p['d'], digits)} ({', '.join(f'{x:.{digits}f}' for x in p['d'])})"
                   f", margin {p['margin']:.{digits}f}" if p else "not run yet"))
        then = [f"{r['earlier_verdict']}"] if r and "earlier_verdict" in r else []
        if cid in earlier["claims"]:
            then.append(f"{earlier['claims'][cid]['verdict']} on the earlier runs")
        lines.append(f"| [{claim['paper']}](#{cid}) | {claim['says']} | {differs} | {cell} | "
                     f"**{p['verdict'] if p else 'not run yet'}** | {'; '.join(then)} |")
    for cid in [c for c in CLAIMS if c in results or c in earlier["claims"]]:
        claim, r = CLAIMS[cid], results.get(cid)
        if r is None:  # registered at 1987642, not yet run again
            lines += ["", f"## {cid}", "", f"**{claim['paper']}**: {claim['says']}.", "",
                      "Not yet run under the primary-contrast rule.", ""]
            lines += earlier_section(cid, earlier)
            continue
        mins = minutes([verdict_runs(cid, r, args)])
        took = (f"{mins:.0f} minutes for the verdict, {r['minutes']:.0f} with the probes"
                if round(mins) != round(r["minutes"]) else f"{mins:.0f} minutes")
        lines += ["", f"## {cid}", "", f"**{claim['paper']}**: {claim['says']}.", "",
                  f"The paper's setting: {claim['setting']}. Ours: {claim['ours']}; seeds "
                  f"{', '.join(map(str, r['seeds']))}; {took}.", ""]
        if any(r["p"].values()):
            lines += ["Positives in POOL: " + ", ".join(f"{100 * p:.1f}% (seed {s})" for s, p
                                                          in r["p"].items() if p) + ".", ""]
        digits, p = claim.get("digits", 1), r["primary"]
        lines += arm_table(cid, r) + [
            "", f"Primary contrast ({p['kind']}, delta {p['delta']:g}"
            + (f", registered in {REGISTERED[cid]}" if cid in REGISTERED else "")
            + f"): {p['text']}: median {median(p['d'], digits)}, per seed "
            f"{', '.join(f'{x:.{digits}f}' for x in p['d'])}; **{p['verdict']}**, margin "
            f"{p['margin']:.{digits}f}" + (f"; results at {r['commit']}" if "commit" in r else "")
            + "."] + (["", "| secondary contrast (paper's direction positive) | mean ± sd | "
                       "per seed | verdict (the rule of 1987642) |", "|---|---|---|---|"]
                      if r["contrasts"] else [])
        lines += [f"| {c['text']} | {ms(c['d'], digits)} | "
                  f"{', '.join(f'{x:.{digits}f}' for x in c['d'])} | "
                  + (f"({c['verdict']}: {c.get('role', 'probe')}, not in the verdict) |"
                     if c.get("probe") else f"{c['verdict']} |") for c in r["contrasts"]]
        lines += ["", f"Claim: **{p['verdict']}**"
                  + (f" (the rule of 1987642: {r['earlier_verdict']})" if "earlier_verdict" in r
                     else "") + "."]
        if claim["plot"]:
            png = os.path.join(os.path.dirname(args.doc), f"CLAIMS-{cid}.png")
            plot(cid, r, png)
            lines += ["", f"![{cid}]({os.path.basename(png)})"]
        if cid in earlier["claims"]:
            lines += [""] + earlier_section(cid, earlier)
    notes = os.path.join(os.path.dirname(args.doc), "CLAIMS-notes.md")
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    text = "\n".join(lines) + "\n"
    with open(args.doc + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.doc + ".tmp", args.doc)
    if args.readme:  # its one line between the markers: the count and the command
        old = open(args.readme).read()
        if README_START in old and README_END in old:
            line = (f"The papers' headline claims run like for like in miniature "
                    f"([docs/CLAIMS.md]({os.path.relpath(args.doc, os.path.dirname(args.readme))}"
                    f"), `python scripts/claims.py all --sft runs/sft-countdown/final`; "
                    f"{own / 60:.1f} h on 2 cores for the verdicts"
                    + f", {total / 60:.1f} h with the investigations); one primary contrast a "
                    f"claim: {summary(done, len(runnable))}, and "
                    f"{len(CLAIMS) - len(runnable)} registered as not run here.")
            new = old[:old.index(README_START) + len(README_START)] + "\n" + line + "\n" + \
                old[old.index(README_END):]
            with open(args.readme + ".tmp", "w") as f:
                f.write(new)
            os.replace(args.readme + ".tmp", args.readme)
    return text


def earlier_section(cid: str, earlier: dict) -> list[str]:
    """A claim as 1987642 registered it, on the runs of its results commit (kept in ARCHIVE since
    their result.json files are gone): the arms, every contrast and the verdict of EARLIER_RULE,
    then the primary contrast computed on them post hoc, where it is one of those contrasts."""
    e, commit = earlier["claims"][cid], earlier["results"]
    lines = [f"**The earlier runs** (docs/CLAIMS.md as of {earlier['registered']}, rendered at "
             f"{commit} from runs on 2 cores, AMD EPYC, 2026-11-27, with its own start model; "
             f"figures as that doc gave them). {e['setting']}", "",
             "| " + " | ".join(e["arm_header"]) + " |", "|---" * len(e["arm_header"]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in e["arms"]]
    lines += ["", "| contrast (paper's direction positive) | mean ± sd | per seed | verdict |",
              "|---|---|---|---|"]
    lines += [f"| {c['text']} | {c['mean_sd']} | {', '.join(map(str, c['d']))} | "
              f"{c['verdict']} |" for c in e["contrasts"]]
    lines += ["", f"Claim on the earlier runs, the rule of {earlier['registered']}: "
              f"**{e['verdict']}**."]
    (text, _, delta, kind), digits = CLAIMS[cid]["primary"], CLAIMS[cid].get("digits", 1)
    same = [c["d"] for c in e["contrasts"] if c["text"] == text]
    if same:  # registered after these runs were seen: post hoc, not a verdict of the claim
        verdict, margin = primary_verdict(same[0], delta, kind)
        lines += ["", f"The primary contrast on these runs, post hoc (registered after them, in "
                  f"{REGISTERED[cid]}): median {median(same[0], digits)}, per seed "
                  f"{', '.join(map(str, same[0]))}; {verdict}, margin {margin:.{digits}f}."]
    return lines


def summary(verdicts: list[str], runnable: int) -> str:
    """The primaries' verdicts in a few words: "2 of 18 reproduced, ..."."""
    short = [v.split(" (")[0] for v in verdicts]  # "undefined (why)" counts as undefined
    counts = [f"{short.count(v)} {v}" for v in ("not reproduced", "inconclusive", "equivalent",
                                                 "undefined") if short.count(v)]
    rest = [f"{runnable - len(verdicts)} not run yet"] if len(verdicts) < runnable else []
    return ", ".join([f"{verdicts.count('reproduced')} of {runnable} reproduced"] + counts + rest)


def median(values: list[float], digits: int = 1) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def seed_list(text: str) -> list[int]:
    """argparse type: comma-separated seeds (integers from 0)."""
    return [common.nonnegative_int(n) for n in text.split(",")]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("claims", nargs="+", help="claim ids, or all: " + ", ".join(CLAIMS))
    p.add_argument("--sft", required=True, help="the start model of every arm (an sft.py run)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="seeds of every arm")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny budgets, no verdicts")
    p.add_argument("--skip-probes", action="store_true",
                   help="run a claim's own arms only, not the investigations beside it")
    p.add_argument("--dry-run", action="store_true",
                   help="print every arm's command for every seed, run nothing")
    p.add_argument("--paper-settings", action="store_true", help="the papers' lr, lengths and "
                   "Q0 samples where known (PAPER_SETTINGS): for a GPU and a real --sft model")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: rebuild --doc from the result.json files under --out")
    p.add_argument("--jobs", type=common.positive_int, default=2, help="runs side by side")
    p.add_argument("--threads", type=common.positive_int, default=1, help="torch threads a run")
    p.add_argument("--out", default=None, help="folder of the runs and result.json files "
                   "(default: runs/claims, runs/claims-quick with --quick)")
    p.add_argument("--doc", default=None, help="the generated table, its plots beside it "
                   "(default: docs/CLAIMS.md, OUT/CLAIMS.md with --quick)")
    p.add_argument("--readme", default=None, help="README whose claims line is replaced ('' to "
                   "leave it alone; default: README.md, none with --quick)")
    args = p.parse_args(argv)
    if args.out is None:  # a smoke run writes nothing of the project's
        args.out = "runs/claims-quick" if args.quick else "runs/claims"
    if args.doc is None:
        args.doc = os.path.join(args.out, "CLAIMS.md") if args.quick else "docs/CLAIMS.md"
    if args.readme is None:
        args.readme = "" if args.quick else "README.md"
    ids = [c for c in CLAIMS if CLAIMS[c].get("runs", True)] if args.claims == ["all"] else \
        args.claims
    if unknown := [c for c in ids if c not in CLAIMS]:
        p.error(f"unknown claim {unknown[0]!r}; choose from: all, {', '.join(CLAIMS)}")
    if unrun := [c for c in ids if not CLAIMS[c].get("runs", True)]:
        p.error(f"{unrun[0]} is not run here: {CLAIMS[unrun[0]]['why']}")
    if args.dry_run:  # any start model the scripts take: `smollm2`, a hub id, a folder
        print("\n".join(dry_run(ids, args)))
        return
    if not os.path.isdir(args.sft):
        p.error(f"--sft {args.sft}: no such folder (make one with sft.py)")
    args.sft, args.out = os.path.abspath(args.sft), os.path.abspath(args.out)
    for cid in [] if args.render_only else ids:
        run_claim(cid, args)
    print(write_doc(args))


if __name__ == "__main__":
    main()
