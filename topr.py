"""topr.py: Tapered Off-Policy REINFORCE, offline: sample a dataset from mu, then train on it.

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement
       learning for LLMs", 2025, arXiv:2503.14286
[CR]   the course report "Off-Policy Finetuning for LLM Math Reasoning"
Eq. 8 (TOPR), Eq. 7 + Table 1 (others): T+, alpha  topr_loss, LIMITS, in_t_plus, truncated_ratio
Eqs. 9-10 baseline c, Eq. 12 p~; [CR] Eq. 4        --c, --split, parse_args, p_tilde_pm1
Algorithm 1: sample from mu, select (§4.3), train  main(): sample_from_mu, select, topr_step
Names: R = R(x, y) the reward, the loss weighs R - c; c, pi, mu, alpha, T+ and T- (the sets) as
       in [TOPR]; p the share of correct samples (Eq. 12); LP = log pi(y), LP_mu = log mu(y);
       [N, L]: N sequences of L tokens; `it`: iteration; temperatures are spelled out
Departures: c = -0.8 for +1/-1 rewards (PM1_BASELINE); the task's rewards: [CR] Eq. 4's c, split
            a --data file without LP_mu: the start model's, at temperature 1 (ratios start at 1)
            AdamW, not Adafactor; 8 samples per prompt, not 64; no top-k (why: docs/PAPERS.md)
Run: python topr.py --task countdown    More: docs/PAPERS.md, section [TOPR].
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task, problem_sets
from tasks.files import read_jsonl, write_jsonl
from tasks.scoring import score

# [TOPR] Table 1: truncation limits (a+, b+, a-, b-) of each named method.
LIMITS = {
    "topr": (1.0, 1.0, 0.0, 1.0),             # Eq. 8: SFT on positives, truncated IS on negatives
    "naive": (1.0, 1.0, 1.0, 1.0),            # Eq. 3: REINFORCE with no ratio (the paper's foil)
    "tis": (0.0, 1.0, 0.0, 1.0),              # truncated importance sampling, both signs
    "is": (0.0, math.inf, 0.0, math.inf),     # Eq. 5: off-policy REINFORCE, untruncated
    "sft": (1.0, 1.0, 0.0, 0.0),              # negatives dropped (reward-weighted SFT)
}
# +1 for a fully correct answer, -1 otherwise: [TOPR]'s reward (§4), beside the task's variants.
PM1 = "pm1"
# pm1's baseline c: p~ above p (Eq. 12: 68% at the start model's p = 19%); scripts/sweep.py found
# c = -0.5 lower and -0.9 no better (docs/RESULTS-topr-report.md).
PM1_BASELINE = -0.8
# Each setting's default, in one place: a flag left at None takes its row's value for the tiny
# model, for a pretrained model, or with --report-variant V (None: the model's; a dict: V's value).
# The report: [CR]'s TOPR setting (§4.1: all 1,000 completions of the SFT model, temperature 0.15,
# top-p 0.85; §5.2 lr 1e-4; §5.3 batch 32; Eq. 4: whole-sequence log pi; c = 0, split 1 by its
# reward); the epochs are ours ([CR] gives none); A+B trains with A, then B, a round each.
# lr: 5e-5 the best on tiny (docs/RESULTS-topr-report.md); 1e-5 the middle of [CR] §5.2's 1e-4,
# 1e-5, 1e-6 (docs/REAL-MODEL.md measures it on SmolLM2; an earlier lr sweep there ran on a kv
# engine that sampled another policy, and is withdrawn). max_new_tokens: 512 as in [TOPR] §4.
# keep: 1000, a quarter of the 500 x 8 samples, gained more per minute than keeping them all.
DEFAULTS = {  # flag:  tiny,            pretrained,      --report-variant
    "iterations":     (6,               6,               {"original": 1, "A": 1, "A+B": 2}),
    "prompts":        (500,             500,             1000),
    "group_size":     (8,               8,               1),
    "epochs":         (1,               1,               2),
    "batch_size":     (64,              64,              32),
    "temperature":    (1.0,             1.0,             0.15),
    "top_p":          (1.0,             1.0,             0.85),
    "loss_norm":      ("seq/len",       "seq/len",       "seq"),
    "lr":             (5e-5,            1e-5,            1e-4),
    "sampling":       ("anna-karenina", "anna-karenina", "uniform"),
    "keep":           (1000,            1000,            0),
    "reward":         (PM1,             PM1,             {v: v for v in ("original", "A", "A+B")}),
    "max_new_tokens": (64,              512,             None),
}
# The report's flags that are the same for every variant, as scripts/sweep.py passes them
REPORT_SETTING = {flag: row[2] for flag, row in DEFAULTS.items()
                  if row[2] is not None and not isinstance(row[2], dict)}
# Prompts per engine call: bounds the samples held at once, not the samples drawn.
PROMPTS_PER_CALL = 256
# Random streams: mu's draws seeded seed * SEED_STRIDE + iteration (a prime larger than any run's
# iterations keeps runs' seeds apart); selection and shuffling tagged apart from the prompts'.
SEED_STRIDE, SELECT_STREAM, SHUFFLE_STREAM = 1009, 1, 2


# ---- Flags: TOPR's settings (those every script shares: common.add_common_flags) ---------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument  # a flag of DEFAULTS parses as None, then takes its value there
    # the data (Algorithm 1, first lines)
    add("--data", default=None, help="JSONL of samples: the first iteration's, instead of sampling")
    add("--iterations", type=common.positive_int, default=None, help="generate-then-train rounds")
    add("--prompts", type=common.positive_int, default=None, help="prompts per iteration")
    add("--group-size", type=common.positive_int, default=None,
        help="completions per prompt, sampled from mu")
    add("--temperature", type=common.positive_float, default=None, help="mu's temperature")
    add("--top-p", type=common.fraction, default=None, help="top-p of mu, in (0, 1]")
    add("--sampling", choices=["uniform", "anna-karenina"], default=None, help="which of mu's "
        "samples are kept for training (select), not how mu samples: uniform, all of them (or "
        "--keep at random); anna-karenina ([TOPR] §4.3), each prompt's first correct sample and "
        "every incorrect one, gains more per minute")
    add("--keep", type=common.nonnegative_int, default=None,
        help="samples kept per round, 0: all those selected")
    # the loss
    add("--loss", choices=list(LIMITS), default="topr", help="Eq. 8, or a Table 1 method (Eq. 7)")
    add("--reward", default=None, help="pm1 (+1 correct, -1 otherwise) or the --task's "
        "REWARD_VARIANTS (countdown: original, A, B; A+B: A for the first half of all epochs, "
        "then B)")
    add("--c", type=common.finite_float, default=None, help="the baseline c of [TOPR] Eqs. 9-10: "
        "trains on R - c; None: PM1_BASELINE (-0.8) with pm1, 0 with the task's ([CR] Eq. 4)")
    add("--split", type=float, choices=[0.0, 1.0], default=None, help="not a train/test split: "
        "[CR]'s generalisation of [TOPR]'s T+, T+ = {R - c >= split}; 0: by the sign of R - c, "
        "[TOPR]'s T+; 1: [CR] Eq. 4 (only R = 1 gets the SFT term); None: 0 with pm1, else 1")
    add("--loss-norm", choices=["seq/len", "seq", "token"], default=None, help="LP's normalisation")
    add("--epochs", type=common.positive_int, default=None, help="passes over an iteration's data")
    add("--batch-size", type=common.positive_int, default=None, help="samples per optimizer step")
    add("--lr", type=common.positive_float, default=None,
        help="AdamW lr, constant ([TOPR]); why each: DEFAULTS' comment")
    add("--report-variant", choices=list(DEFAULTS["iterations"][2]), default=None,
        help="[CR]'s TOPR run with this reward: DEFAULTS' last column for the flags not given")
    add("--micro-batch", type=common.positive_int, default=64,
        help="sequences per forward and backward pass (memory)")
    common.add_common_flags(parser, __file__, DEFAULTS, "start model, the first mu", save_every=100,
                            eval_every=dict(default=0, type=common.nonnegative_int, help="also "
                                            "evaluate every N steps (0: at the start and the end "
                                            "only, the quickest)"))
    args = parser.parse_args(argv)
    common.fill_defaults(args, DEFAULTS, variant=args.report_variant)  # the rest once loaded
    # c, split: PM1_BASELINE and the sign ([TOPR]) for pm1; [CR] Eq. 4's 0, 1 for the task's rewards
    c, split = (PM1_BASELINE, 0.0) if args.reward == PM1 else (0.0, 1.0)
    args.c = c if args.c is None else args.c
    args.split = split if args.split is None else args.split
    return parser, args


# ---- The loss: pure functions of tensors ---------------------------------------------------------
def in_t_plus(rewards, c: float, split: float):
    """T+ = {R - c >= split}, [CR]'s generalisation of [TOPR] Eq. 7's T+ (split 0: by the sign of
    R - c, [TOPR]'s own; 1: [CR] Eq. 4's, R = 1 alone with c = 0); rewards R: [N] tensor/array."""
    return rewards - c >= split


def truncated_ratio(log_ratio: torch.Tensor, positive: torch.Tensor, a_pos: float, b_pos: float,
                    a_neg: float, b_neg: float) -> torch.Tensor:
    """alpha = [pi/mu]_a^b of Eq. 7 in log space: exp(clamp(log_ratio, ln a, ln b)), ln 0 = -inf.
    log_ratio: [N] LP - LP_mu;  positive: [N] bool: (a+, b+) where True (T+), else (a-, b-).
    Never forms exp(LP): for 1,000-token sequences pi and mu both underflow and pi/mu is 0/0."""
    def ln(x):
        return math.log(x) if x > 0 else -math.inf
    lo = torch.where(positive, ln(a_pos), ln(a_neg)).to(log_ratio.dtype)
    hi = torch.where(positive, ln(b_pos), ln(b_neg)).to(log_ratio.dtype)
    return torch.exp(torch.minimum(torch.maximum(log_ratio, lo), hi))


def topr_loss(logprobs: torch.Tensor, mask: torch.Tensor, lp_mu: torch.Tensor,
              rewards: torch.Tensor, c: float = 0.0, norm: str = "seq/len", split: float = 0.0,
              limits: tuple = LIMITS["topr"]) -> torch.Tensor:
    """[TOPR] Eq. 7 on a minibatch, to be minimised; with LIMITS["topr"] (the default) Eq. 8:

        J = 1/N [ sum_{T+} (R_i - c) log pi(y_i) + sum_{T-} sg([pi(y_i)/mu(y_i)]_0^1) (R_i - c)
                  log pi(y_i) ]

    R_i = R(x_i, y_i), c the baseline (Eqs. 9-10); alpha = [pi/mu]_a^b of the full-sequence LP:
    with TOPR's limits exactly 1 on T+ (reward-weighted SFT), [pi/mu]_0^1 on T- (a negative's push
    fades once pi(y) < mu(y)). limits: (a+, b+, a-, b-); lp_mu, rewards R: [N]; logprobs, mask
    [N, L] and norm ("seq/len": each LP over its length, [TOPR]'s): common.weighted_logprob_loss,
    the reduction rloo.py's Eq. 3 shares.
    """
    lp = (logprobs.detach() * mask).sum(-1)  # [N] LP(y), no gradient
    alpha = truncated_ratio(lp - lp_mu, in_t_plus(rewards, c, split), *limits)  # [N]
    return common.weighted_logprob_loss(alpha * (rewards - c), logprobs, mask, norm)


def effective_positive_share(rewards, c: float = 0.0) -> float:
    """p~ = sum_{R_i > c} (R_i - c) / sum_i |R_i - c|: the share of the gradient's total weight that
    pushes samples up (docs/DERIVATIONS.md); on rewards +1/-1, [TOPR] Eq. 12 (p_tilde_pm1)."""
    r_minus_c = np.asarray(rewards, dtype=float) - c
    total = np.abs(r_minus_c).sum()
    return float(r_minus_c[r_minus_c > 0].sum() / total) if total > 0 else float("nan")


def p_tilde_pm1(p: float, c: float) -> float:
    """[TOPR] Eq. 12: p~ for rewards +1/-1, a share p of positives (correct) and baseline c."""
    return p * (1 - c) / (1 + (1 - 2 * p) * c)


# ---- Data: rewards, generation, files, selection -------------------------------------------------
def reward_of(task, problem: dict, text: str, variant: str) -> float:
    if variant == PM1:
        return 1.0 if task.is_correct(problem, text) else -1.0
    return task.reward(problem, text, variant)


def variant_at(reward: str, epoch: int, total_epochs: int) -> str:
    """The reward variant of global epoch `epoch` (0-based, over all iterations). "A+B": A for the
    first half of all epochs, B after ([CR] §5.1: "Reward B TOPR after using Reward A")."""
    if reward == "A+B":
        return "A" if epoch < max(1, total_epochs // 2) else "B"
    return reward


def generate_rows(engine, task, problems, prompts, tokenizer, args, it, variant) -> list[dict]:
    """--group-size samples per prompt from the engine's weights (mu), with LP_mu and their reward
    under `variant` (training recomputes rewards from the text: a file serves any variant)."""
    sc = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                               temperature=args.temperature, top_p=args.top_p)
    mu_name = f"iteration {it} policy, T={args.temperature} top_p={args.top_p}"
    rows = []
    for start in range(0, len(problems), PROMPTS_PER_CALL):
        groups = engine.generate(prompts[start:start + PROMPTS_PER_CALL], sc)
        for j, (problem, group) in enumerate(zip(problems[start:start + PROMPTS_PER_CALL], groups)):
            rows += [{"problem": problem, "prompt_index": start + j, "prompt_ids": s.prompt_ids,
                      "completion_ids": s.ids, "completion": s.text,
                      "prompt": tokenizer.decode(s.prompt_ids),
                      "grade": task.grade(problem, s.text),
                      "reward": reward_of(task, problem, s.text, variant), "finished": s.finished,
                      "lp_mu": float(sum(s.logprobs)), "mu": mu_name} for s in group]
    return rows


def sample_from_mu(engine, model, task, pool, prompts, tokenizer, args, it) -> list[dict]:
    """Algorithm 1's sampling: from mu = pi_{it-1} (the current weights) to RUN/data-IT.jsonl."""
    t0 = time.perf_counter()
    model.eval()
    engine.sync(model)  # mu: the current weights, copied into the engine (vLLM)
    torch.manual_seed(args.seed * SEED_STRIDE + it)
    idx = np.random.default_rng([args.seed, it]).choice(
        len(pool), min(args.prompts, len(pool)), replace=False)
    variant = variant_at(args.reward, it * args.epochs, args.iterations * args.epochs)
    rows = generate_rows(engine, task, [pool[i] for i in idx], [prompts[i] for i in idx],
                         tokenizer, args, it, variant)
    if engine.name == "vllm" or args.bf16:  # the sampler's numerics are not the trainer's
        lp_mu_as_trainer(rows, model, tokenizer.pad_token_id, args, it)
    write_jsonl(os.path.join(args.out, f"data-{it}.jsonl"), rows)
    tqdm.write(f"iteration {it}: {len(rows)} samples from {len(idx)} prompts in "
               f"{time.perf_counter() - t0:.1f}s")
    return rows


def read_rows(path: str, task, tokenizer=None, style: str | None = None) -> list[dict]:
    """Samples from a JSONL file, checked (ValueError: file and line); with a tokenizer, the missing
    `prompt_ids` and `completion_ids` are built (EOS appended unless `finished` is false)."""
    rows = []
    for i, r in enumerate(read_jsonl(path, "file"), 1):
        if not (isinstance(r.get("problem"), dict) and isinstance(r.get("completion"), str)):
            raise ValueError(f"{path}:{i}: needs a `problem` object and a `completion` string")
        try:
            r["problem"] = task.problem_from_row(r["problem"])
        except ValueError as e:
            raise ValueError(f"{path}:{i}: `problem` is not a {task.NAME} problem ({e})") from None
        lp_mu = r.get("lp_mu", 0.0)
        if not (isinstance(lp_mu, (int, float)) and math.isfinite(lp_mu)):
            raise ValueError(f"{path}:{i}: lp_mu must be a finite number")
        for key in ("prompt_ids", "completion_ids"):
            if key in r and not (isinstance(r[key], list) and all(type(t) is int for t in r[key])):
                raise ValueError(f"{path}:{i}: {key} must be a list of token ids")
        r["grade"] = task.grade(r["problem"], r["completion"])
        r.setdefault("prompt_index", task.problem_key(r["problem"]))
        rows.append(r)
        if tokenizer is not None and "prompt_ids" not in r:
            r["prompt_ids"] = common.encode_prompts(task, [r["problem"]], tokenizer, style)[0]
        if tokenizer is not None and "completion_ids" not in r:
            eos = [tokenizer.eos_token_id] if r.get("finished", True) else []
            ids = tokenizer(r["completion"], add_special_tokens=False)["input_ids"]
            r["completion_ids"] = ids + eos
    if not rows:
        raise ValueError(f"--data {path} holds no samples")
    return rows


def fill_lp_mu(rows: list[dict], model, pad_id: int, args, temperature: float = 1.0) -> None:
    """Missing LP_mu: `model`'s LP at `temperature`, as topr_step computes it: ratios start at 1."""
    model.eval()
    with torch.no_grad():
        for s in range(0, len(rows), args.micro_batch):
            part = rows[s:s + args.micro_batch]
            lp, mask = common.completion_logprobs(model, [r["prompt_ids"] for r in part],
                                                  [r["completion_ids"] for r in part], pad_id,
                                                  temperature=temperature, bf16=args.bf16)
            for r, v in zip(part, (lp * mask).sum(-1).tolist()):
                r.setdefault("lp_mu", v)


def lp_mu_as_trainer(rows: list[dict], model, pad_id: int, args, it: int) -> None:
    """LP_mu recomputed by fill_lp_mu at mu's temperature (the sampler's kept as lp_mu_sampler):
    vLLM's kernels, or the sampler's bf16 rounding under --bf16 (its KV cache, its kernels), put
    ratios off 1 at the start."""
    if args.top_p < 1:  # mu is a nucleus the trainer does not form: the sampler's LP_mu stays
        tqdm.write(f"iteration {it}: LP_mu is the sampler's (top-p < 1); ratios start off 1 by "
                   "its numerical gap to the trainer")
        return
    for r in rows:
        r["lp_mu_sampler"] = r.pop("lp_mu")
    fill_lp_mu(rows, model, pad_id, args, args.temperature)
    gap = np.mean([abs(r["lp_mu"] - r["lp_mu_sampler"]) / max(1, len(r["completion_ids"]))
                   for r in rows])
    tqdm.write(f"iteration {it}: LP_mu recomputed as the trainer computes log pi (the sampler's "
               f"was {gap:.2e} away per token on average)")


def samples_on_hand(args, task, model, tokenizer, style, resumed_at: int | None) -> dict:
    """Samples not to draw, by iteration: --data's (0), and the file of the iteration resumed."""
    data = {0: read_rows(args.data, task, tokenizer, style)} if args.data else {}
    if any("lp_mu" not in r for r in data.get(0, [])):
        fill_lp_mu(data[0], model, tokenizer.pad_token_id, args)
    own = os.path.join(args.out, f"data-{resumed_at}.jsonl")
    if resumed_at is not None and resumed_at not in data and os.path.exists(own):
        data[resumed_at] = read_rows(own, task, tokenizer, style)
    return data


def select(rows: list[dict], sampling: str, keep: int, rng: np.random.Generator) -> list[dict]:
    """uniform: every sample, or `keep` at random. anna-karenina ([TOPR] §4.3): each prompt's first
    correct sample and every incorrect one; with `keep`, random negatives fill up to `keep`."""
    if sampling == "uniform":
        if keep and keep < len(rows):
            return [rows[i] for i in sorted(rng.choice(len(rows), keep, replace=False))]
        return list(rows)
    positives, negatives, seen = [], [], set()
    for r in rows:
        if r["grade"] != "correct":
            negatives.append(r)
        elif r["prompt_index"] not in seen:
            seen.add(r["prompt_index"])
            positives.append(r)
    if keep:
        fill = max(0, keep - len(positives))
        chosen = rng.choice(len(negatives), min(fill, len(negatives)), replace=False)
        negatives = [negatives[i] for i in sorted(chosen)]
        positives = positives[:keep]
    return positives + negatives


def epoch_rewards(data: list[dict], it: int, epoch: int, task, args) -> tuple:
    """R of each sample under this epoch's variant, and the share in T-; p and p~ printed."""
    variant = variant_at(args.reward, it * args.epochs + epoch, args.iterations * args.epochs)
    rewards = [reward_of(task, x["problem"], x["completion"], variant) for x in data]
    neg_share = float(np.mean(~in_t_plus(np.asarray(rewards, dtype=float), args.c, args.split)))
    p = float(np.mean([x["grade"] == "correct" for x in data]))
    eq12 = f" (Eq. 12: {p_tilde_pm1(p, args.c):.3f})" if variant == PM1 else ""
    tqdm.write(f"iteration {it} epoch {epoch}: {len(data)} samples ({args.sampling}), reward "
               f"{variant}, correct p={p:.3f}, effective positive share "
               f"p~={effective_positive_share(rewards, args.c):.3f}{eq12}, negative share "
               f"{neg_share:.3f}")
    if neg_share == 0 and p < 1:
        tqdm.write(f"note: no sample has R - c < {args.split:g} (c = {args.c:g}): this is "
                   "reward-weighted SFT, not TOPR")
    return rewards, neg_share


# ---- Training ------------------------------------------------------------------------------------
def topr_step(model, optimizer, batch: list[dict], rewards: list[float], args, pad_id: int,
              step: int) -> dict:
    """One optimizer step of Algorithm 1 on a minibatch (`step` steps taken), in micro-batches of
    --micro-batch; its metrics. A non-finite loss or gradient exits 1 before optimizer.step()."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(len(x["completion_ids"]) for x in batch)
    loss_sum, log_ratio_parts = 0.0, []
    for s in range(0, len(batch), args.micro_batch):
        micro = batch[s:s + args.micro_batch]
        R = torch.tensor(rewards[s:s + args.micro_batch], device=device)  # [M] R(x, y), no c
        logprobs, mask = common.completion_logprobs(model, [x["prompt_ids"] for x in micro],
                                                    [x["completion_ids"] for x in micro], pad_id,
                                                    bf16=args.bf16)
        lp_mu = torch.tensor([x["lp_mu"] for x in micro], device=device)  # [M] LP_mu(y)
        loss = topr_loss(logprobs, mask, lp_mu, R, c=args.c, norm=args.loss_norm,
                         split=args.split, limits=LIMITS[args.loss])  # Eq. 8, or Eq. 7
        share = (mask.sum().item() / n_tokens if args.loss_norm == "token"
                 else len(micro) / len(batch))
        (loss * share).backward()  # weighted by share, micro-batches sum to the batch's loss
        loss_sum += loss.item() * share
        log_ratio_parts.append((logprobs.detach() * mask).sum(-1) - lp_mu)  # [M] LP - LP_mu
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):  # before the weights change
        tqdm.write(f"error: step {step + 1}: non-finite loss={loss_sum} or grad_norm={grad_norm}; "
                   "weights not updated, the last checkpoint is the last good state. Likely cause: "
                   "--lr too high, or --c or lp_mu far from the data's scale", file=sys.stderr)
        raise SystemExit(1)
    optimizer.step()
    return step_metrics(batch, rewards, torch.cat(log_ratio_parts), loss_sum, grad_norm, args)


def step_metrics(batch, rewards, log_ratio, loss: float, grad_norm: float, args) -> dict:
    """A step's metrics; log_ratio: [N] LP - LP_mu; a mean over an empty T+ or T- is None."""
    positive = in_t_plus(torch.tensor(rewards, device=log_ratio.device), args.c, args.split)
    alpha = truncated_ratio(log_ratio, positive, *LIMITS[args.loss])

    def mean_or_none(x):
        return x.mean().item() if len(x) else None
    return {"loss": loss, "reward": float(np.mean(rewards)),
            "accuracy": float(np.mean([x["grade"] == "correct" for x in batch])),
            "log_ratio": log_ratio.mean().item(), "log_ratio_max_abs": log_ratio.abs().max().item(),
            "log_ratio_pos": mean_or_none(log_ratio[positive]),
            "log_ratio_neg": mean_or_none(log_ratio[~positive]),
            "alpha_neg": mean_or_none(alpha[~positive]), "negatives": int((~positive).sum()),
            "grad_norm": grad_norm, "samples": len(batch)}


# ---- Evaluation ----------------------------------------------------------------------------------
def evaluate(engine, model, task, eval_sets, args) -> dict:
    """Held-out metrics per size (tasks/scoring.py): a greedy completion and --eval-k at
    temperature 1 per problem, seed 0 at every checkpoint; the reward trained on (pm1 or A+B: the
    task's first)."""
    model.eval()
    engine.sync(model)  # the weights trained so far (the engine samples mu = pi_{it-1} otherwise)
    variant = None if args.reward in (PM1, "A+B") else args.reward
    metrics = {}
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    sampled = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens, seed=0)
    for n, (problems, prompts) in eval_sets.items():
        for mode, sc in [("greedy", greedy), ("sampled", sampled)]:
            groups = engine.generate(prompts, sc)
            metrics.update(score(task, problems, groups, mode, variant, prefix=f"eval{n}/"))
    return metrics


def check_flags(args, task) -> None:
    """The flags that need the task: --reward among its variants, --report-variant's reward,
    --top-p above 0, a readable --data file; ValueError (one line, exit 2) otherwise."""
    choices = [PM1, *task.REWARD_VARIANTS] + ["A+B"] * ({"A", "B"} <= set(task.REWARD_VARIANTS))
    if args.reward not in choices:  # A+B: where the task has A and B
        raise ValueError(f"unknown --reward {args.reward!r}; choose from {', '.join(choices)}")
    if args.report_variant and args.reward != args.report_variant:
        raise ValueError(f"--report-variant {args.report_variant} trains with that reward, "
                         f"not --reward {args.reward}")
    if args.top_p == 0:
        raise ValueError("--top-p must be in (0, 1], got 0")
    if args.data:
        read_rows(args.data, task)


# ---- main(): every input checked first (bad: one line, exit 2), then Algorithm 1's loops ---------
def main(argv=None):
    parser, args = parse_args(argv)
    run = common.Run(parser, args, __file__, keys={"model", "optimizer", "next"})  # --resume
    common.setup(args.seed, args.threads)
    try:
        task = get_task(args.task)
        check_flags(args, task)  # before a model is loaded, or sft.py run to make one
        pool, held_out = problem_sets(task, sizes=args.sizes, train_size=args.train_size,
                                      eval_sizes=args.eval_sizes, eval_size=args.eval_size,
                                      seed=args.seed, source=args.problems)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # --model None: the newest sft.py run of --task, trained first if there is none
        model, tokenizer = common.load_model(args.model, device=device, task=args.task,
                                             run_dir=args.out, grad_checkpoint=args.grad_checkpoint)
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_defaults(args, DEFAULTS, model, args.report_variant)  # by model
        style = common.prompt_style(model, tokenizer)
        # a resumed run's iteration: its samples are on file (the checkpoint's `next`)
        resumed_at = run.state["next"][0] if run.state else None
        data = samples_on_hand(args, task, model, tokenizer, style, resumed_at)
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    prompts = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style))
                 for n, ps in held_out.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step = run.begin(model=model, optimizer=optimizer)  # steps taken: 0, or the checkpoint's
    engine = common.make_engine(args.engine, model, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    print(f"topr: {common.count_parameters(model) / 1e6:.2f}M parameters from "
          f"{args.model_path}, engine {engine.name}, loss {args.loss} {LIMITS[args.loss]}, "
          f"c={args.c:g}, split={args.split:g}, run {args.out}")
    if step == 0:
        run.log(0, evaluate(engine, model, task, eval_sets, args))
    for it in range(args.iterations):  # Algorithm 1
        if run.done_before(it):  # resumed: trained before the checkpoint (and so below)
            continue
        samples = data.pop(it, None)  # 1. samples from mu = pi_{it-1}: on hand, or drawn now
        if samples is None:
            samples = sample_from_mu(engine, model, task, pool, prompts, tokenizer, args, it)
        selected = select(samples, args.sampling, args.keep,  # 2. the selection
                          np.random.default_rng([args.seed, it, SELECT_STREAM]))
        for epoch in range(args.epochs):
            if run.done_before(it, epoch):
                continue
            rewards, neg_share = epoch_rewards(selected, it, epoch, task, args)
            order = np.random.default_rng([args.seed, it, epoch, SHUFFLE_STREAM]).permutation(
                len(selected))
            batches = [order[s:s + args.batch_size] for s in range(0, len(order), args.batch_size)]
            # 3. the updates, a minibatch at a time
            for b, idx in enumerate(tqdm(batches, f"iteration {it} epoch {epoch}", leave=False)):
                if run.done_before(it, epoch, b):
                    continue
                t0 = time.perf_counter()
                metrics = topr_step(model, optimizer, [selected[i] for i in idx],
                                    [rewards[i] for i in idx], args, tokenizer.pad_token_id, step)
                step += 1
                metrics.update(iteration=it, epoch=epoch, negative_share=neg_share,
                               time_step=time.perf_counter() - t0)
                epoch_done = b + 1 == len(batches)
                finished = epoch_done and epoch + 1 == args.epochs and it + 1 == args.iterations
                # the metrics row; an evaluation and a checkpoint (at each epoch's end too) where
                # due, with where the next step stands; the end, or --time-limit
                if run.end_step(step, metrics, last=finished, save=epoch_done,
                                next=(it, epoch, b + 1),
                                evaluate=lambda: evaluate(engine, model, task, eval_sets, args)):
                    engine.close()
                    return run.finish(model, tokenizer)
    engine.close()
    return run.finish(model, tokenizer)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
