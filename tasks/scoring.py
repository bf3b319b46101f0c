"""Held-out metrics of completions, the same for every script so that numbers compare.

score(task, problems, groups, mode, ...) turns each problem's group of completions (anything with
`.text` and `.ids`: common.Sample) into the metrics a script logs: {prefix}{mode}/accuracy (fully
correct), /reward (mean, one reward variant; all_rewards: /reward_V for each), /format_rate (an
<answer> tag is present), /length (mean tokens), /unfinished (the share cut at the token
budget); for sampled groups also {prefix}pass@k (unbiased)
and {prefix}maj@k (the most frequent answer of the k, whitespace removed, is correct).
"""
import re
from collections import Counter

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(task, problem: dict, group) -> bool:
    """Whether the group's most frequent answer (whitespace removed) is correct (maj@k)."""
    parsed = [task.parse_answer(s.text) for s in group]
    answers = Counter(re.sub(r"\s+", "", a) for a in parsed if a is not None)
    top = answers.most_common(1)
    return bool(top) and task.is_correct(problem, f"<answer>{top[0][0]}</answer>")


def score(task, problems: list[dict], groups: list[list], mode: str, reward_variant=None, *,
          all_rewards: bool = False, prefix: str = "") -> dict:
    """The metrics of one evaluation mode ("greedy" or "sampled"); groups[i] holds problem i's
    completions; reward_variant: the task's variant reported as /reward (None: its first)."""
    reward_variant = reward_variant or task.REWARD_VARIANTS[0]
    variants = [reward_variant] + [v for v in task.REWARD_VARIANTS
                                   if all_rewards and v != reward_variant]
    grades = [[task.grade(p, s.text) for s in g] for p, g in zip(problems, groups)]
    correct = [sum(x == "correct" for x in gr) for gr in grades]  # per problem
    total = sum(len(g) for g in groups)

    def mean(per_problem):  # summed per problem first, then over problems
        return sum(per_problem) / total
    m = {f"{prefix}{mode}/accuracy": mean(correct)}
    rewards = {v: [sum(task.reward(p, s.text, v) for s in g) for p, g in zip(problems, groups)]
               for v in variants}
    m[f"{prefix}{mode}/reward"] = mean(rewards[reward_variant])
    for v in variants if all_rewards else []:
        m[f"{prefix}{mode}/reward_{v}"] = mean(rewards[v])
    m[f"{prefix}{mode}/format_rate"] = mean([sum(x != "no_answer" for x in gr) for gr in grades])
    m[f"{prefix}{mode}/length"] = mean([sum(len(s.ids) for s in g) for g in groups])
    # cut at the token budget before EOS (a Sample's `finished`; anything without one finished)
    m[f"{prefix}{mode}/unfinished"] = mean([sum(not getattr(s, "finished", True) for s in g)
                                            for g in groups])
    if mode == "sampled":
        k = len(groups[0])
        m[f"{prefix}pass@{k}"] = float(np.mean([pass_at_k(len(g), c, k)
                                                for g, c in zip(groups, correct)]))
        m[f"{prefix}maj@{k}"] = float(np.mean([majority_correct(task, p, g)
                                               for p, g in zip(problems, groups)]))
    return m


def evaluate(engine, task, problems: list[dict], prompts: list[list[int]], configs: dict,
             reward_variant=None, *, all_rewards: bool = False, prefix: str = "") -> dict:
    """score() of each decoding in `configs` (mode -> common.SamplingConfig, e.g. {"greedy": ...,
    "sampled": ...}): the evaluation of scripts/, trl_trainers.py and the tests, the same loop as
    the algorithm scripts' own evaluate()."""
    metrics = {}
    for mode, sc in configs.items():
        groups = engine.generate(prompts, sc)
        metrics.update(score(task, problems, groups, mode, reward_variant,
                             all_rewards=all_rewards, prefix=prefix))
    return metrics
