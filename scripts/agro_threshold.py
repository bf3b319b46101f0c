"""Which prompts does on-policy AGRO push towards never being solved?

[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm",
2025, arXiv:2503.19612. At pi = pi_ref, on-policy AGRO (lambda_LR = 1) raises the probability of a
prompt's correct answers only if its success rate p exceeds 1/2 - beta/|r_correct - r_wrong|
(docs/DERIVATIONS.md). This script estimates p for training prompts of each size by sampling a
model k times at temperature 1, and prints, for each beta, the share of prompts below the
threshold: the prompts that the likelihood-ratio term pushes towards p = 0.

    python scripts/agro_threshold.py --model runs/sft-countdown-.../final --prompts 256 \
        --group-size 64
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
from tasks import get_task  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="sft",
                   help="`sft` (the newest sft.py run), a folder or a hub id")
    p.add_argument("--task", default="countdown")
    p.add_argument("--sizes", default=None,
                   help="difficulty levels, comma-separated (Countdown: numbers a puzzle); "
                        "default: the task's SIZES")
    p.add_argument("--prompts", type=common.positive_int, default=256,
                   help="training prompts per size")
    p.add_argument("--group-size", type=common.positive_int, default=64, help="samples per prompt")
    p.add_argument("--betas", default="0.1,0.2,0.3,0.4,0.5", help="comma-separated")
    p.add_argument("--reward", default="original", help="reward variant: sets r_correct - r_wrong")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None)
    args = p.parse_args(argv)
    try:
        task = get_task(args.task)
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from "
                             f"{', '.join(task.REWARD_VARIANTS)}")
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        if not hasattr(task, "REWARDS"):
            raise ValueError(f"task {args.task} has no REWARDS table: the threshold needs the "
                             "rewards of a correct and a wrong answer")
        sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes is not None
                 else list(task.SIZES))
        betas = [common.finite_float(b) for b in args.betas.split(",")]
        model, tokenizer = common.load_model(args.model, task=args.task)
    except ValueError as e:  # UsageError is one
        p.error(str(e))
    common.setup(args.seed, args.threads)
    gap = task.REWARDS[args.reward]["correct"] - task.REWARDS[args.reward]["wrong"]
    engine = common.HFEngine(model, tokenizer)
    sc = common.SamplingConfig(n=args.group_size, seed=args.seed)
    print(f"threshold p > 1/2 - beta/{gap:g} (reward {args.reward}); share of prompts below it, "
          "by beta:")
    print("| size | mean p | "
          + " | ".join(f"beta {b:g} (p < {0.5 - b / gap:.2f})" for b in betas) + " |")
    print("|---|---|" + "---|" * len(betas))
    for n in sizes:
        problems = task.get_problems("train", args.prompts, size=n, seed=args.seed)
        style = common.prompt_style(model, tokenizer)
        groups = engine.generate(common.encode_prompts(task, problems, tokenizer, style), sc)
        rate = np.array([np.mean([task.grade(q, s.text) == "correct" for s in g])
                         for q, g in zip(problems, groups)])
        shares = [float(np.mean(rate < 0.5 - b / gap)) for b in betas]
        cells = " | ".join(f"{100 * s:.0f}%" for s in shares)
        print(f"| {n} | {rate.mean():.3f} | {cells} |")


if __name__ == "__main__":
    main()
