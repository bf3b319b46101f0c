"""topr.py: Tapered Off-Policy REINFORCE, fully offline: sample a dataset from mu, then train on it.

Le Roux et al. 2025 (../shared/papers/003_*, §2-§4, Algorithm 1), course report (../shared/papers/000_*,
§3.6, Eq. 4), ../shared/ALGORITHMS.md §3. Each stored sample is (x, y, R, LP_mu), with LP_mu the sequence
log-prob of the distribution that actually sampled y. With lw = sg(LP(y)) - LP_mu(y):

    (a, b) = (a+, b+) if R - c >= 0 else (a-, b-)                  (Eq. 7; T+ / T- split by sign)
    alpha  = exp(clamp(lw, ln a, ln b))                            (truncated ratio [pi/mu]_a^b, log space)
    loss   = -mean_i sg(alpha_i) * (R_i - c) * LP(y_i) / T_i       (Algorithm 1, `--loss-norm seq/len`)

Canonical TOPR (Eq. 8): a+ = b+ = 1 (positives: a plain reward-weighted SFT step), a- = 0, b- = 1
(negatives: truncated importance sampling, so a negative's push fades once pi(y) < mu(y)). Its surrogate
objective (Eq. 11, `taper`) is bounded above (Prop. 3.2); naive REINFORCE (alpha = 1 everywhere, Eq. 4)
is not: it gains without limit by driving any negative sample's probability to 0. `--loss` picks the named
limits of Table 1.

Rewards and the split. With the paper's reward (`--reward pm1`, +1/-1) the split is by sign (`--split 0`)
and c defaults to -0.8. The task's rewards (`--reward original|A|B|A+B`) lie in [0, 1] but for penalties,
so R - c >= 0 for almost every sample and TOPR would be reward-weighted SFT; for them the defaults are
[CR] Eq. 4: c = 0 and `--split 1`, i.e. R = 1 gets the SFT term and every R < 1 the truncated ratio
[pi/mu]_0^1 times R. The share of samples in the truncated branch is printed and logged
(`negative_share`) every iteration. The report's three TOPR runs ([CR] Table 1: one dataset from the SFT
model, lr 1e-4, batch 32; A+B trains the first epoch with A, the second with B):

    python topr.py --reward original --iterations 1 --prompts 1000 --n 2 --epochs 2 --batch-size 32
    python topr.py --reward A        --iterations 1 --prompts 1000 --n 2 --epochs 2 --batch-size 32
    python topr.py --reward A+B      --iterations 1 --prompts 1000 --n 2 --epochs 2 --batch-size 32

Algorithm 1, as run here:
  1. generate: --prompts training prompts, --n completions each from mu (the SFT model, or pi_{i-1} in
     iteration i > 1, paper §4.3), rewarded and written to RUN/data-ITER.jsonl (`--data FILE` skips this).
  2. select: `uniform` keeps every sample; `anna-karenina` keeps the first positive of each prompt and
     fills with its negatives (paper §4.3).
  3. train --epochs passes over the selected samples, minibatches of --batch-size, constant lr, clip 1.0.

Defaults (measured on 2 CPU cores): 6 iterations of 500 three-number puzzles x 8 samples, reward +1/-1,
c = -0.8, lr 1e-4, one epoch each: held-out sampled accuracy 32.8% -> 43.9% in 5 minutes.

Run:  python sft.py --task countdown && python topr.py --task countdown     (CPU, minutes)
      python topr.py --model runs/sft-.../final --engine vllm --data my_samples.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task

# Table 1 of the paper: truncation limits (a+, b+, a-, b-) of each named method.
LIMITS = {
    "topr": (1.0, 1.0, 0.0, 1.0),             # Eq. 8: SFT on positives, truncated IS on negatives
    "naive": (1.0, 1.0, 1.0, 1.0),            # Eq. 3: REINFORCE with no ratio at all (the paper's foil)
    "tis": (0.0, 1.0, 0.0, 1.0),              # truncated importance sampling, both signs
    "is": (0.0, math.inf, 0.0, math.inf),     # Eq. 5: off-policy REINFORCE, untruncated
    "sft": (1.0, 1.0, 0.0, 0.0),              # negatives dropped (reward-weighted SFT)
}
# +1 for a fully correct answer, -1 otherwise: the paper's reward (§4), next to the task's own variants.
PM1 = "pm1"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown", help="task module in tasks/")
    p.add_argument("--model", default="sft", help="`sft` (the newest sft.py run of --task), a folder or a hub id")
    p.add_argument("--out", default=None, help="run folder (default runs/topr-TASK-TIME)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    # the data (Algorithm 1, first lines)
    p.add_argument("--data", default=None,
                   help="JSONL of samples to train on instead of generating the first iteration's data")
    p.add_argument("--iterations", type=common.positive_int, default=6,
                   help="generate-then-train rounds; iteration i samples from pi_{i-1} (paper §4.3)")
    p.add_argument("--prompts", type=common.positive_int, default=500, help="training prompts an iteration")
    p.add_argument("--n", type=common.positive_int, default=8, help="completions sampled per prompt")
    p.add_argument("--temperature", type=common.positive_float, default=1.0,
                   help="sampling temperature of mu (LP_mu is stored for the distribution actually sampled)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of mu")
    p.add_argument("--sampling", choices=["uniform", "anna-karenina"], default="uniform",
                   help="uniform: every sample; anna-karenina: first positive per prompt plus its negatives")
    p.add_argument("--keep", type=int, default=0,
                   help="samples an iteration after selection (0: all it selects); anna-karenina fills "
                        "with random negatives up to this number")
    # the loss
    p.add_argument("--loss", choices=list(LIMITS), default="topr", help="truncation limits of Table 1")
    p.add_argument("--reward", default="pm1",
                   help="pm1 (+1 correct, -1 otherwise), a task variant (original, A, B), or A+B "
                        "(A for the first half of all epochs, then B)")
    p.add_argument("--c", type=float, default=None,
                   help="baseline: train on R - c (Eqs. 9-10); default -0.8 with pm1 (p~ about 0.8 for the SFT "
                        "model), 0 with the task's rewards ([CR] Eq. 4 has no baseline)")
    p.add_argument("--split", type=float, choices=[0.0, 1.0], default=None,
                   help="0: TOPR (negatives: R - c < 0); 1: [CR] Eq. 4 (negatives: R - c < 1); default 0 "
                        "with pm1, 1 with the task's rewards (all >= 0 but for penalties)")
    p.add_argument("--loss-norm", choices=["seq/len", "seq", "token"], default="seq/len",
                   help="seq/len: each LP divided by its length ([TOPR]); seq: sums; token: over all tokens")
    p.add_argument("--time-limit", type=common.positive_float, default=None, metavar="MIN",
                   help="stop training MIN minutes after the start of this invocation, data generation included "
                        "(then evaluate and save as at the end)")
    p.add_argument("--epochs", type=common.positive_int, default=1, help="passes over each iteration's data")
    p.add_argument("--batch-size", type=common.positive_int, default=64, help="samples per optimizer step")
    p.add_argument("--lr", type=common.positive_float, default=1e-4,
                   help="AdamW lr, constant ([TOPR]); 2e-4 and 3e-4 lowered accuracy in the first iteration here")
    p.add_argument("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    p.add_argument("--micro-batch", type=common.positive_int, default=64,
                   help="samples per forward/backward pass: memory only, same gradient")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--num-numbers", default="3", help="puzzle sizes to train on, comma-separated (evaluation: --eval-numbers)")
    p.add_argument("--problems", default=None,
                   help="training puzzles from a JSONL file or the hub instead of the generator")
    p.add_argument("--train-size", type=common.positive_int, default=20000, help="training puzzles per size")
    # evaluation
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: per iteration)")
    p.add_argument("--eval-numbers", default="3,4", help="puzzle sizes of the held-out evaluation")
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="held-out puzzles per size")
    p.add_argument("--eval-k", type=common.positive_int, default=8, help="samples a puzzle at temperature 1")
    p.add_argument("--save-every", type=common.positive_int, default=100, help="checkpoint every N steps")
    # system
    p.add_argument("--engine", default="hf", choices=["auto", "vllm", "hf"],
                   help="generation engine: hf (instant start, as fast as vLLM for the tiny model on a CPU), vllm (GPU), auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    return p, p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------
# The loss: pure functions of tensors
# ---------------------------------------------------------------------------------------------------
def taper(u: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """The taper rho(u; a, b) of Eq. 11, for u = pi/mu > 0 and 0 <= a <= b <= inf.

    rho(u) = a (1 + ln(u/a)) if u < a;  b (1 + ln(u/b)) if u > b;  u otherwise.
    It is continuous with u rho'(u) = [u]_a^b, so the gradient of sum mu rho(pi/mu) R is Eq. 7.
    Limits: a = 0 has no lower branch, b = inf no upper one, and b = 0 gives rho = 0 (the b -> 0 limit).
    """
    lower = a * (1 + torch.log(u / a)) if a > 0 else u
    upper = b * (1 + torch.log(u / b)) if 0 < b < math.inf else (u if b == math.inf else torch.zeros_like(u))
    return torch.where(u < a, lower, torch.where(u > b, upper, u))


def truncated_ratio(lw: torch.Tensor, positive: torch.Tensor, a_pos: float, b_pos: float, a_neg: float,
                    b_neg: float) -> torch.Tensor:
    """alpha = [pi/mu]_a^b computed in log space: exp(clamp(lw, ln a, ln b)), ln 0 = -inf, ln inf = inf.

    lw: [N] sequence log-ratio LP - LP_mu;  positive: [N] bool, which limits (a+, b+) or (a-, b-) apply.
    Never forms exp(LP): for 1,000-token sequences that is 0/0 (ALGORITHMS.md §0).
    """
    def ln(x):
        return math.log(x) if x > 0 else -math.inf
    lo = torch.where(positive, ln(a_pos), ln(a_neg)).to(lw.dtype)
    hi = torch.where(positive, ln(b_pos), ln(b_neg)).to(lw.dtype)
    return torch.exp(torch.minimum(torch.maximum(lw, lo), hi))


def topr_loss(logprobs: torch.Tensor, mask: torch.Tensor, lp_mu: torch.Tensor, rewards: torch.Tensor,
              a_pos: float = 1.0, b_pos: float = 1.0, a_neg: float = 0.0, b_neg: float = 1.0, c: float = 0.0,
              norm: str = "seq/len", split: float = 0.0) -> torch.Tensor:
    """Minibatch TOPR loss (Algorithm 1, Eq. 7 with the limits of Table 1), to be minimised.

    logprobs: [N, T] per-token log pi(y_t | x, y_<t), with gradient; 0 on padding
    mask:     [N, T] 1 on completion tokens (EOS included)
    lp_mu:    [N]    behaviour sequence log-prob LP_mu(y)
    rewards:  [N]    R(x, y); the baseline c is subtracted here (R_eff = R - c, Eqs. 9-10)
    split:    0 = TOPR, positives are R_eff >= 0; 1 = course report Eq. 4, positives are R_eff >= 1.
    norm:     "seq/len" each sequence's LP divided by its length ([TOPR]); "seq" full sums; "token" the sum
              of alpha R_eff log pi over all tokens divided by their count.
    The ratio always uses the full-sequence LP, whatever `norm`; alpha is detached.
    """
    lp = (logprobs * mask).sum(-1)  # [N] LP(y)
    r_eff = rewards - c
    alpha = truncated_ratio(lp.detach() - lp_mu, r_eff >= split, a_pos, b_pos, a_neg, b_neg)  # [N]
    weight = alpha * r_eff  # [N], no gradient
    if norm == "token":
        return -(weight[:, None] * logprobs * mask).sum() / mask.sum()
    if norm == "seq/len":
        lp = lp / mask.sum(-1).clamp(min=1)
    elif norm != "seq":
        raise ValueError(f"unknown loss normalisation {norm!r}")
    return -(weight * lp).mean()


def effective_positive_share(rewards, c: float = 0.0) -> float:
    """p~ = sum_{R_i > c} (R_i - c) / sum_i |R_i - c| (ALGORITHMS.md §3.1, multi-level, derived).

    For R in {+1, -1} with a share p of positives this is Eq. 12, p~ = p(1-c) / (1 + (1-2p)c).
    """
    r = np.asarray(rewards, dtype=float) - c
    total = np.abs(r).sum()
    return float(r[r > 0].sum() / total) if total > 0 else float("nan")


def p_tilde_pm1(p: float, c: float) -> float:
    """Eq. 12: the effective positive proportion for rewards +1/-1, true positive share p, baseline c."""
    return p * (1 - c) / (1 + (1 - 2 * p) * c)


def c_for_p_tilde(p: float, p_tilde: float) -> float:
    """The inverse of Eq. 12 (derived): the baseline c that gives p~ from a true share p."""
    return (p - p_tilde) / (p + p_tilde - 2 * p * p_tilde)


# ---------------------------------------------------------------------------------------------------
# Data: rewards, generation, files, selection
# ---------------------------------------------------------------------------------------------------
def default_baseline(reward: str) -> tuple[float, float]:
    """(c, split) when not given: TOPR's sign split with c = -0.8 for pm1; [CR] Eq. 4 (c = 0, split 1)
    for the task's rewards in [0, 1], under which c = -0.8 and split 0 leave no negative at all."""
    return (-0.8, 0.0) if reward == PM1 else (0.0, 1.0)


def negative_share(rewards, c: float, split: float) -> float:
    """Share of samples in T- (R - c < split): those that get the truncated ratio [pi/mu]_a-^b-."""
    return float(np.mean(np.asarray(rewards, dtype=float) - c < split))


def reward_of(task, problem: dict, text: str, variant: str) -> float:
    if variant == PM1:
        return 1.0 if task.is_correct(problem, text) else -1.0
    return task.reward(problem, text, variant)


def variant_at(reward: str, epoch: int, total_epochs: int) -> str:
    """The reward variant of global epoch `epoch` (0-based, over all iterations). "A+B": the first half of
    all epochs with A, the rest with B ([CR] "train with A, then continue with B")."""
    if reward == "A+B":
        return "A" if epoch < max(1, total_epochs // 2) else "B"
    return reward


def generate_rows(engine, task, problems, prompts, tokenizer, args, iteration, variant) -> list[dict]:
    """n samples per prompt from the engine's current weights (mu), with their behaviour log-probs and
    their reward under `variant` (training recomputes rewards from the text, so a file serves any variant)."""
    sc = common.SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                               top_p=args.top_p)
    rows = []
    for start in range(0, len(problems), 256):
        groups = engine.generate(prompts[start:start + 256], sc)
        for j, (problem, group) in enumerate(zip(problems[start:start + 256], groups)):
            for s in group:
                rows.append({"problem": problem, "prompt_index": start + j, "prompt_ids": s.prompt_ids,
                             "completion_ids": s.ids, "completion": s.text,
                             "prompt": tokenizer.decode(s.prompt_ids), "grade": task.grade(problem, s.text),
                             "reward": reward_of(task, problem, s.text, variant), "finished": s.finished,
                             "lp_mu": float(sum(s.logprobs)), "mu": f"iteration {iteration} policy, "
                             f"T={args.temperature} top_p={args.top_p}"})
    return rows


def write_rows(path: str, rows: list[dict]) -> None:
    """Atomic: a crash mid-write never leaves a half file that --resume would trust."""
    with open(path + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)


def read_rows(path: str, task, tokenizer, style: str) -> list[dict]:
    """Samples from a JSONL file: `problem` and `completion` are required; `prompt_ids`/`completion_ids`
    are used when present (else the prompt is rebuilt and the text tokenized, EOS appended when
    `finished` is not false); `lp_mu` may be missing, then it is recomputed (see main). ValueError if bad."""
    rows = []
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise ValueError(f"--data {path}: {e.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"--data {path}:{i}: not valid JSON") from None
        if not (isinstance(r, dict) and isinstance(r.get("problem"), dict) and isinstance(r.get("completion"), str)):
            raise ValueError(f"--data {path}:{i}: needs a `problem` object and a `completion` string")
        if "lp_mu" in r and not (isinstance(r["lp_mu"], (int, float)) and math.isfinite(r["lp_mu"])):
            raise ValueError(f"--data {path}:{i}: lp_mu must be a finite number")
        try:  # the task's own prompt and checker must accept the problem
            task.prompt(r["problem"], "compact")
            r.setdefault("grade", task.grade(r["problem"], r["completion"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"--data {path}:{i}: `problem` is not a {task.NAME} problem") from None
        r.setdefault("prompt_index", json.dumps(r["problem"], sort_keys=True))
        if "prompt_ids" not in r:
            r["prompt_ids"] = common.encode_prompts(task, [r["problem"]], tokenizer, style)[0]
        if "completion_ids" not in r:
            eos = [tokenizer.eos_token_id] if r.get("finished", True) else []
            r["completion_ids"] = tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + eos
        rows.append(r)
    if not rows:
        raise ValueError(f"--data {path} holds no samples")
    return rows


def fill_lp_mu(rows: list[dict], model, pad_id: int, micro_batch: int) -> None:
    """Set LP_mu of rows that lack it to their sequence log-prob under `model` (mu, at T = 1)."""
    model.eval()
    with torch.no_grad():
        for s in range(0, len(rows), micro_batch):
            part = rows[s:s + micro_batch]
            lp, mask = common.completion_logprobs(model, [r["prompt_ids"] for r in part],
                                                  [r["completion_ids"] for r in part], pad_id)
            for r, v in zip(part, (lp * mask).sum(-1).tolist()):
                r.setdefault("lp_mu", v)


def select(rows: list[dict], sampling: str, keep: int, rng: np.random.Generator) -> list[dict]:
    """uniform: every sample (or `keep` of them at random). anna-karenina (paper §4.3): the first correct
    sample of each prompt and every incorrect one; with `keep`, the positives plus random negatives up to
    `keep` samples."""
    if sampling == "uniform":
        if keep and keep < len(rows):
            return [rows[i] for i in sorted(rng.choice(len(rows), keep, replace=False))]
        return list(rows)
    positives, negatives, seen = [], [], set()
    for r in rows:
        if r["grade"] == "correct":
            if r["prompt_index"] not in seen:
                seen.add(r["prompt_index"])
                positives.append(r)
        else:
            negatives.append(r)
    if keep:
        fill = max(0, keep - len(positives))
        negatives = [negatives[i] for i in sorted(rng.choice(len(negatives), min(fill, len(negatives)),
                                                             replace=False))]
        positives = positives[:keep]
    return positives + negatives


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def main(argv=None):
    started = time.time()
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or common.default_out_dir("topr", args.task)
    limits = LIMITS[args.loss]
    base_c, base_split = default_baseline(args.reward)
    args.c = base_c if args.c is None else args.c
    args.split = base_split if args.split is None else args.split

    try:  # every bad input surfaces here, before any training: one line, exit status 2
        task = get_task(args.task)
        variants = (PM1, "A+B") + tuple(task.REWARD_VARIANTS)
        if args.reward not in variants:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from {', '.join(variants)}")
        if args.reward == "A+B" and not {"A", "B"} <= set(task.REWARD_VARIANTS):
            raise ValueError("--reward A+B needs the task's variants A and B")
        if not 0 < args.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
        if args.keep < 0 or args.eval_every < 0:
            raise ValueError("--keep and --eval-every must be >= 0")
        try:
            sizes = [int(s) for s in str(args.num_numbers).split(",")]
            eval_sizes = [int(s) for s in str(args.eval_numbers).split(",")]
        except ValueError:
            raise ValueError(f"--num-numbers/--eval-numbers: expected comma-separated integers, got "
                             f"{args.num_numbers!r}/{args.eval_numbers!r}") from None
        if args.data and not os.path.isfile(args.data):
            raise ValueError(f"--data {args.data}: no such file")
        ckpt = common.checkpoint_path(os.path.join(out, "checkpoint")) if args.resume else None
        if args.resume and ckpt is None:
            raise ValueError(f"--resume {args.resume}: no checkpoint to resume from")
        ref_path = common.resolve_model_path(args.model, task=args.task)
        if args.problems:
            pool = task.get_problems("train", args.train_size, source=args.problems, seed=args.seed)
        else:
            pool = [p for n in sizes for p in task.get_problems("train", args.train_size, size=n, seed=args.seed)]
        eval_problems = {n: task.get_problems("test", args.eval_size, size=n, seed=args.seed) for n in eval_sizes}
        model, tokenizer = common.load_model(ckpt or ref_path, device=device)
        style = common.prompt_style(model, tokenizer)
        given = read_rows(args.data, task, tokenizer, style) if args.data else None
        if given is not None and any("lp_mu" not in r for r in given):
            # mu of a file from elsewhere: the starting model at T = 1, never a resumed checkpoint
            mu_model = common.load_model(ref_path, device=device)[0] if ckpt else model
            fill_lp_mu(given, mu_model, tokenizer.pad_token_id, args.micro_batch)
        run = common.Run(out, {**vars(args), "model_path": ref_path}, resume=bool(args.resume))
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))
    prompts_of = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style)) for n, ps in eval_problems.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    it, epoch, batch_index, step = 0, 0, 0, 0  # where training stands: iteration, epoch, batch in epoch
    if ckpt:
        state = common.load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        common.set_rng_state(state["rng"])
        it, epoch, batch_index, step = state["iteration"], state["epoch"], state["batch"], state["step"]
        run.truncate(step)
        print(f"resumed from {ckpt} at iteration {it}, epoch {epoch}, step {step}")
    engine = common.make_engine(args.engine, model, tokenizer, ckpt or ref_path, seed=args.seed)
    engine.sync(model)
    print(f"topr: {common.count_parameters(model) / 1e6:.2f}M parameters from {ref_path}, engine {engine.name}, "
          f"loss {args.loss} (a+,b+,a-,b-)={limits}, c={args.c}, split={args.split:g}, run folder {run.dir}")

    def evaluate():
        model.eval()
        metrics = {}
        for n, (problems, prompts) in eval_sets.items():
            metrics.update(common.evaluate(engine, task, problems, prompts, k=args.eval_k, prefix=f"eval{n}/",
                                           max_new_tokens=args.max_new_tokens,
                                           reward_variant="original" if args.reward in (PM1, "A+B") else args.reward))
        tqdm.write(f"step {step}: " + "  ".join(f"{k}={v:.3f}" for k, v in metrics.items()
                                                if k.endswith(("sampled/accuracy", "greedy/format_rate"))))
        return metrics

    if step == 0:
        run.log(0, evaluate())
    total_epochs = args.iterations * args.epochs
    deadline = started + 60 * args.time_limit if args.time_limit else float("inf")
    out_of_time = False
    while it < args.iterations and not out_of_time:
        # 1. the data of this iteration: the given file, the file written earlier (resume), or fresh samples
        path = run.path(f"data-{it}.jsonl")
        if it == 0 and given is not None:
            rows = given
        elif os.path.exists(path):
            rows = read_rows(path, task, tokenizer, style)
        else:
            t0 = time.perf_counter()
            model.eval()
            engine.sync(model)  # mu_i = pi_{i-1}
            torch.manual_seed(args.seed * 1009 + it)  # the data depend on (seed, iteration) only
            idx = np.random.default_rng([args.seed, it]).choice(len(pool), min(args.prompts, len(pool)), replace=False)
            rows = generate_rows(engine, task, [pool[i] for i in idx], [prompts_of[i] for i in idx], tokenizer,
                                 args, it, variant_at(args.reward, it * args.epochs, total_epochs))
            write_rows(path, rows)
            tqdm.write(f"iteration {it}: {len(rows)} samples from {len(idx)} prompts in "
                       f"{time.perf_counter() - t0:.1f}s -> {path}")
        data = select(rows, args.sampling, args.keep, np.random.default_rng([args.seed, it, 1]))

        # 2. train --epochs passes over it
        while epoch < args.epochs and not out_of_time:
            variant = variant_at(args.reward, it * args.epochs + epoch, total_epochs)
            rewards_all = [reward_of(task, r["problem"], r["completion"], variant) for r in data]
            neg_share = negative_share(rewards_all, args.c, args.split)
            if batch_index == 0:
                p = float(np.mean([r["grade"] == "correct" for r in data]))
                tqdm.write(f"iteration {it} epoch {epoch}: {len(data)} samples ({args.sampling}), reward {variant}, "
                           f"correct p={p:.3f}, effective positive share p~={effective_positive_share(rewards_all, args.c):.3f}"
                           + (f" (Eq. 12: {p_tilde_pm1(p, args.c):.3f})" if variant == PM1 else "")
                           + f", negative share {neg_share:.3f}")
                if neg_share == 0 and p < 1:
                    tqdm.write(f"note: no sample has R - c < {args.split:g} (c = {args.c:g}): "
                               "this is reward-weighted SFT, not TOPR")
            order = np.random.default_rng([args.seed, it, epoch, 2]).permutation(len(data))
            batches = [order[s:s + args.batch_size] for s in range(0, len(order), args.batch_size)]
            bar = tqdm(total=len(batches), initial=batch_index, desc=f"topr it {it} ep {epoch}", dynamic_ncols=True)
            while batch_index < len(batches):
                t0 = time.perf_counter()
                batch = [data[i] for i in batches[batch_index]]
                rewards = [rewards_all[i] for i in batches[batch_index]]
                model.train()
                optimizer.zero_grad(set_to_none=True)
                n_tokens = sum(len(r["completion_ids"]) for r in batch)
                loss_sum, lws, alphas, pos_all = 0.0, [], [], []
                for s in range(0, len(batch), args.micro_batch):
                    mb, r = batch[s:s + args.micro_batch], torch.tensor(rewards[s:s + args.micro_batch], device=device)
                    logprobs, mask = common.completion_logprobs(model, [x["prompt_ids"] for x in mb],
                                                                [x["completion_ids"] for x in mb], tokenizer.pad_token_id)
                    lp_mu = torch.tensor([x["lp_mu"] for x in mb], device=device)
                    loss = topr_loss(logprobs, mask, lp_mu, r, *limits, c=args.c, norm=args.loss_norm,
                                     split=args.split)
                    # weight each micro-batch by its share, so the sum is the loss of the whole batch
                    share = mask.sum().item() / n_tokens if args.loss_norm == "token" else len(mb) / len(batch)
                    (loss * share).backward()
                    loss_sum += loss.item() * share
                    lw = (logprobs.detach() * mask).sum(-1) - lp_mu
                    positive = (r - args.c) >= args.split
                    lws.append(lw)
                    pos_all.append(positive)
                    alphas.append(truncated_ratio(lw, positive, *limits))
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
                optimizer.step()
                step += 1
                batch_index += 1
                lw, alpha, positive = torch.cat(lws), torch.cat(alphas), torch.cat(pos_all)
                grades = [x["grade"] for x in batch]
                row = {"iteration": it, "epoch": epoch, "loss": loss_sum, "reward": float(np.mean(rewards)),
                       "accuracy": float(np.mean([g == "correct" for g in grades])),
                       "log_ratio": lw.mean().item(), "log_ratio_max_abs": lw.abs().max().item(),
                       "log_ratio_pos": lw[positive].mean().item() if positive.any() else None,
                       "log_ratio_neg": lw[~positive].mean().item() if (~positive).any() else None,
                       "alpha_neg": alpha[~positive].mean().item() if (~positive).any() else None,
                       "negatives": int((~positive).sum()), "negative_share": neg_share, "grad_norm": grad_norm, "samples": len(batch),
                       "time_step": time.perf_counter() - t0}
                out_of_time = time.time() >= deadline
                last = (batch_index == len(batches) and epoch == args.epochs - 1) or out_of_time
                if (args.eval_every and step % args.eval_every == 0) or last:
                    row.update(evaluate())
                run.log(step, row)
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.3f}", lw=f"{row['log_ratio']:.2f}", gn=f"{grad_norm:.2f}")
                if step % args.save_every == 0 or batch_index == len(batches) or out_of_time:
                    done = batch_index == len(batches)
                    e, b = (epoch + 1, 0) if done else (epoch, batch_index)
                    i, e = (it + 1, 0) if e == args.epochs else (it, e)
                    common.save_checkpoint(run.path("checkpoint"), model, tokenizer,
                                           {"iteration": i, "epoch": e, "batch": b, "step": step,
                                            "optimizer": optimizer.state_dict(), "rng": common.rng_state()})
                if out_of_time:
                    break
            bar.close()
            if out_of_time:
                break
            epoch, batch_index = epoch + 1, 0
        it, epoch = it + 1, 0
    common.save_checkpoint(run.path("final"), model, tokenizer)
    engine.close()
    print(f"done: final model in {run.path('final')}  ({run.path('metrics.jsonl')})")
    return run.dir


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
