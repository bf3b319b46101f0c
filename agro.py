"""agro.py: Any-Generation Reward Optimization, off-policy and on-policy, from any mix of data.

Tang et al. 2025, arXiv 2503.19612 (../shared/papers/002_*). Our copy of the paper lost its equations:
../shared/ALGORITHMS.md §4 rebuilds them (marked "derived" there) and §6 lists the checks they pass.

Maximise J(pi) = E_x[ E_{y~pi} r(x,y) - beta KL(pi(.|x) || pi_ref(.|x)) ]                   (Eq. 1)
whose optimum is pi*(y|x) = pi_ref(y|x) exp(r(x,y)/beta) / Z(x)                              (Eq. 2)
With the regularised reward r_pi(x,y) = r(x,y) - beta log(pi(y|x)/pi_ref(y|x)), Theorem 1 says r_pi* is
the same number for EVERY generation y of a prompt (generation consistency), so pi* is the unique
minimiser of the consistency loss  l(pi; x, nu) = 1/2 Var_{y~nu}[r_pi(x, y)]  for ANY data distribution
nu with pi_ref's support (Eq. 3, Theorem 2): that is why the same loss learns from any generations.

For each prompt take n >= 2 completions y_1..y_n, and with h_i = sg(log pi(y_i) - log pi_ref(y_i)):

    r_pi,i = r_i - beta h_i             b_i = 1/(n-1) sum_{j != i} r_pi,j       (leave-one-out)

  off-policy AGRO (Eq. 4), data from anything that does not depend on theta (pi_ref, a file, old policy):
    loss = -1/(B n) sum (r_pi,i - b_i) log pi(y_i)          = (1/beta) x grad of 1/2 s^2(r_pi), ddof 1
  on-policy AGRO (Eqs. 5-6), data from the CURRENT policy at temperature 1: the pathwise term above plus
  the likelihood-ratio term, which exists because the sampling distribution itself depends on theta:
    w_i  = beta (r_pi,i - b_i) - lambda_LR 1/2 [(r_pi,i - b_i)^2 - v_i]              (lambda_LR = 1: paper)
    loss = -1/(B n) sum sg(w_i / beta) log pi(y_i)          (/beta: same scale as off-policy, ALGORITHMS §4.4)
  KL-regularised policy gradient, the paper's comparison (`--loss klpg`), as the paper runs it:
    offline groups (§8.2): loss = -1/(B n) sum (r_i - b^r_i) log pi(y_i) + beta/(B n) sum_i sum_t KL_t(y_i)
      with the exact per-token KL over the vocabulary along each sampled y_i, differentiated. It converges
      to the wrong policy (Fig. 1).
    on-policy groups (§8.1, RLOO with the KL in the reward): loss = -1/(B n) sum (r_pi,i - b_i) log pi(y_i),
      the same computation as off-policy AGRO's weights on fresh samples (= --lambda-lr 0), and the unbiased
      gradient of Eq. 1. The per-token form is NOT used there: along a fixed sampled path it drops the
      score term sum_s grad log pi(y_s|.) sum_{t>s} KL_t, so for responses of two or more tokens its
      expectation is not the gradient of Eq. 1 (tests/test_agro.py, depth-2 tree).

Data (`--online-fraction f`, default 1 with `--mode onpolicy`, 0 with `--mode offpolicy`): each batch holds
round(f B) groups sampled now from the current policy (on-policy AGRO weights, the engine synced with the
trainer after every step and `logprob_gap` logged) and B - round(f B) groups from a fixed offline set:
`--offline-data FILE` (JSONL: the task's fields plus "completions", a list of >= n strings, and optionally
"finished", a list of booleans: false = cut at the length limit, no EOS), or else `--offline-prompts` prompts
with n samples each drawn ONCE from the frozen reference pi_ref at temperature 1 before training and saved
as RUN/reference_samples.jsonl. Drawing them once is the paper's offline setting (mu = pi_ref, fixed, read
for several epochs, §8.2); it pays the generation cost once, so off-policy steps are training only, and the
file can be handed to another run (`--offline-data`) so that AGRO and KL-PG see exactly the same data.
Off-policy AGRO needs no behaviour log-probs, so file completions are simply re-tokenised.

On-policy warning (ALGORITHMS.md §4.6, derived): with rewards {0, 1} and success rate p at pi = pi_ref, the
expected on-policy AGRO update raises a correct answer's probability only if p > 1/2 - beta (for rewards
{a, b}: p > 1/2 - beta/|a - b|); below, the lambda_LR term pushes rarely-solved prompts towards never being
solved (a zero-variance policy). On Countdown from the SFT model (rewards 1 / 0.1, so p > 1/2 - beta/0.9;
README), the share of 3-number training prompts below that threshold is 59%, 45%, 33%, 14% and 0% at
beta 0.1 to 0.5 (scripts/agro_threshold.py), and on-policy AGRO collapsed at beta 0.1 and 0.2 (held-out
sampled accuracy 32.8% -> 23-24%), rose then fell back at 0.3 (39.1% at step 175, 35.1% at 208), and rose
steadily at 0.5 (39.1% at step 200). Off-policy data has no such threshold, and there beta 0.3 learned most
(41.4% after 262 steps; 0.5: 38.2%; 1: 34.9%). Hence the defaults: beta 0.5 with on-policy groups, 0.3
without, on 3-number puzzles (4-number ones: 77% of prompts below the threshold at beta 0.3). beta is per
sequence: the paper's beta ~ 1/T (§8.3) would be ~0.04 here, deep in the collapse.

Run:  python agro.py --mode offpolicy --model runs/sft-countdown-.../final         (CPU, minutes)
      python agro.py --mode onpolicy  --model runs/sft-countdown-.../final --engine vllm   (GPU)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown", help="task module in tasks/")
    p.add_argument("--model", default="sft", help="`sft` (the newest sft.py run of --task), a folder or a hub id")
    p.add_argument("--out", default=None, help="run folder (default runs/agro-TASK-TIME)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    # the algorithm
    p.add_argument("--mode", choices=["offpolicy", "onpolicy"], default="offpolicy",
                   help="default data source: offline groups (Eq. 4) or fresh groups from the policy (Eqs. 5-6)")
    p.add_argument("--loss", choices=["agro", "klpg"], default="agro",
                   help="agro, or the KL-regularised policy gradient it is compared with: per-token KL on offline "
                        "groups (§8.2), sequence KL in a detached reward (RLOO) on on-policy groups (§8.1)")
    p.add_argument("--beta", type=float, default=None,
                   help="KL coefficient, per SEQUENCE (h sums ~25 tokens here; paper: beta ~ 1/T, §8.3). Default: "
                        "0.5 when a batch holds on-policy groups, which need beta > (1/2 - p)(r_correct - r_wrong) "
                        "for prompts of success rate p (module docstring); 0.3 for off-policy data only")
    p.add_argument("--lambda-lr", type=float, default=1.0,
                   help="on-policy groups: weight of the likelihood-ratio term g_LR (1 = the paper, 0 = RLOO "
                        "with the KL in the reward)")
    p.add_argument("--lr-baseline", choices=["var", "none", "paper"], default="var",
                   help="v_i in g_LR: var = n/(n-1) x ddof-1 variance of the other n-1 r_pi (unbiased and centred, "
                        "n >= 3); none = 0 (unbiased, not centred); paper = mean of the others' squared LOO "
                        "residuals (centred, y_i-dependent, slightly biased)")
    p.add_argument("--online-fraction", type=float, default=None,
                   help="share of each batch's groups sampled from the current policy (default: 1 with "
                        "--mode onpolicy, 0 with --mode offpolicy)")
    p.add_argument("--offline-data", default=None, metavar="FILE",
                   help="JSONL of offline groups (task fields + 'completions'); default: sample the reference")
    p.add_argument("--offline-prompts", type=common.positive_int, default=2048,
                   help="without --offline-data: prompts sampled n times from pi_ref before training")
    p.add_argument("--steps", type=common.positive_int, default=150, help="optimizer steps (one per batch)")
    p.add_argument("--time-limit", type=common.positive_float, default=None, metavar="MIN",
                   help="stop training MIN minutes after the start of this invocation, drawing the reference "
                        "samples included (then evaluate and save as at --steps)")
    p.add_argument("--prompts", type=common.positive_int, default=32, help="prompts per batch (B)")
    p.add_argument("--n", type=int, default=8, help="completions per prompt (n >= 2)")
    p.add_argument("--loss-norm", choices=["seq", "seq/len", "token"], default="seq",
                   help="seq: sum over tokens, mean over sequences (the derivation is at sequence level)")
    p.add_argument("--reward", default="original", help="reward variant: original, A or B")
    p.add_argument("--lr", type=common.positive_float, default=6e-5, help="AdamW lr (rloo.py's)")
    p.add_argument("--warmup", type=int, default=10,
                   help="steps of linear lr warm-up (Adam's first updates are ~lr*sign(g) for every weight)")
    p.add_argument("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    p.add_argument("--micro-batch", type=common.positive_int, default=8,
                   help="prompts (groups of n) per forward/backward pass: memory only, same gradient")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--num-numbers", default="3",
                   help="puzzle sizes to train on, comma-separated (default 3: 4-number prompts are solved ~9%% of "
                        "the time, far below the on-policy threshold)")
    p.add_argument("--eval-numbers", default="3,4", help="held-out puzzle sizes to evaluate, comma-separated")
    p.add_argument("--problems", default=None,
                   help="training puzzles from a JSONL file or the hub instead of the generator")
    p.add_argument("--train-size", type=common.positive_int, default=20000, help="training puzzles per size")
    # evaluation
    p.add_argument("--eval-every", type=common.positive_int, default=25)
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="held-out puzzles per size")
    p.add_argument("--eval-k", type=common.positive_int, default=8, help="samples a puzzle at temperature 1")
    p.add_argument("--save-every", type=common.positive_int, default=50)
    # system
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"], help="generation engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    return p, p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------
# The estimators: pure functions of tensors. Shapes: B prompts, n completions each, N = B n, T tokens.
# ---------------------------------------------------------------------------------------------------
def regularised_rewards(rewards: torch.Tensor, h: torch.Tensor, beta: float) -> torch.Tensor:
    """r_pi = r - beta sg(h), h = log pi(y|x) - log pi_ref(y|x) per sequence (§3.1).  [B, n] -> [B, n]"""
    return rewards - beta * h.detach()


def loo_baseline(values: torch.Tensor) -> torch.Tensor:
    """b_i = 1/(n-1) sum_{j != i} values_j within each group (Eq. 4's baseline).  [B, n] -> [B, n]"""
    n = values.shape[-1]
    if n < 2:
        raise ValueError("a leave-one-out baseline needs n >= 2 completions per prompt")
    return (values.sum(-1, keepdim=True) - values) / (n - 1)


def agro_offpolicy_weights(rpi: torch.Tensor) -> torch.Tensor:
    """Off-policy AGRO weights r_pi,i - b_i on grad log pi(y_i) (Eq. 4).  rpi: [B, n] -> [B, n]

    Their mean over a group, times grad log pi, equals -(1/beta) grad 1/2 s^2(r_pi) (ddof 1, gradient
    through h): an unbiased estimate of -(1/beta) grad of the consistency loss (Lemma 3). They are all 0
    at pi* (Theorem 1), whatever the samples.
    """
    return rpi - loo_baseline(rpi)


def agro_onpolicy_weights(rpi: torch.Tensor, beta: float, lambda_lr: float = 1.0,
                          lr_baseline: str = "var") -> torch.Tensor:
    """On-policy AGRO weights w_i / beta (Eqs. 5-6, ALGORITHMS.md §4.3-4.4).  rpi: [B, n] -> [B, n]

    w_i = beta (r_pi,i - b_i) - lambda_lr 1/2 [(r_pi,i - b_i)^2 - v_i]; divided by beta so that the
    pathwise part has the off-policy scale. E[(r_pi,i - b_i)^2 | y_i] = (r_pi,i - m)^2 + Var/(n-1): any v_i
    that does not depend on y_i multiplies a zero-mean score, so v_i = 0 is unbiased (Proposition 4), but
    then every weight carries -(lambda/2beta) n/(n-1) Var on average, a push on all sampled sequences that
    cancels only in expectation and, on Countdown, is larger than the signal (the model drifts). The
    baselines below remove it, as the average of (r_pi,i - b_i)^2 over the group is n/(n-1) Var:
      "var"   n/(n-1) x the ddof-1 variance of the other n-1 rewards: independent of y_i, so unbiased, and
              centred (ALGORITHMS.md §4.3 proposes the variance alone, which leaves Var/(n-1) uncentred);
      "paper" our reading of the paper's variance-reduced estimate, the mean of the others' squared
              residuals: centred too, but it depends on y_i through b_j, so slightly biased.
    """
    adv = agro_offpolicy_weights(rpi)  # [B, n]
    n = rpi.shape[-1]
    if lr_baseline == "none":
        v = torch.zeros_like(rpi)
    elif lr_baseline == "var":
        if n < 3:
            raise ValueError("--lr-baseline var needs n >= 3 (the variance of the other n-1 rewards)")
        others_mean = loo_baseline(rpi)  # [B, n]
        sq_others = (rpi ** 2).sum(-1, keepdim=True) - rpi ** 2  # sum_{j != i} r_pi,j^2
        v = n / (n - 1) * (sq_others - (n - 1) * others_mean ** 2) / (n - 2)
    elif lr_baseline == "paper":
        v = loo_baseline(adv ** 2)
    else:
        raise ValueError(f"unknown lr_baseline {lr_baseline!r}")
    return adv - lambda_lr * 0.5 * (adv ** 2 - v) / beta


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, norm: str = "seq") -> torch.Tensor:
    """Per-token values [N, T] -> scalar. seq: sum over tokens, mean over sequences; seq/len: each sum
    divided by its own length; token: sum over all tokens divided by their count (ALGORITHMS.md §0)."""
    if norm == "token":
        return (values * mask).sum() / mask.sum()
    per_seq = (values * mask).sum(-1)  # [N]
    if norm == "seq/len":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif norm != "seq":
        raise ValueError(f"unknown loss normalisation {norm!r}")
    return per_seq.mean()


def agro_loss(logprobs: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, norm: str = "seq"):
    """-mean_i sg(weight_i) log pi(y_i): Eq. 4 with off-policy weights, Eqs. 5-6 with on-policy ones.

    logprobs: [N, T] per-token log pi(y_t|x, y_<t) with gradient, 0 on padding;  mask: [N, T] (EOS counted);
    weights: [N] (detached here).
    """
    return -reduce_tokens(weights.detach()[:, None] * logprobs, mask, norm)


def token_kl(logp_all: torch.Tensor, ref_logp_all: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi(.|x,y_<t) || pi_ref(.|x,y_<t)) at every position of the sampled sequences, summed over the
    vocabulary.  logp_all, ref_logp_all: [N, T, V] log-softmax;  mask: [N, T]  ->  [N, T], 0 on padding."""
    return (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1) * mask


def klpg_loss(logprobs: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, kl: torch.Tensor,
              beta: float, norm: str = "seq", h: torch.Tensor | None = None,
              online: torch.Tensor | None = None) -> torch.Tensor:
    """The KL-regularised policy gradient that the paper compares AGRO with, group by group:

      offline groups (§8.2, per-token KL):  -mean_i (r_i - b^r_i) log pi(y_i) + beta mean_i sum_t KL_t(y_i)
          with b^r the leave-one-out mean of the raw rewards and KL_t the exact KL over the vocabulary at
          each prefix of the sampled y_i, differentiated along that fixed path (Fig. 1's comparison);
      on-policy groups (§8.1, RLOO with the KL in the reward):  -mean_i (r_pi,i - b_i) log pi(y_i),
          r_pi = r - beta sg(h), h the SEQUENCE log-ratio: the unbiased gradient of Eq. 1.
    On-policy the per-token form is not: differentiating sum_t KL_t along a sampled path drops the score
    term sum_s grad log pi(y_s|.) sum_{t>s} KL_t (later prefixes are reached with a probability that
    depends on theta); it agrees with the gradient of Eq. 1 only for one-token responses.

    logprobs, mask, kl: [N, T] (kl from token_kl, with gradient);  rewards, h: [B, n] (h needed only
    when a group is on-policy);  online: [B] bool (default: every group offline).
    """
    if online is None:
        online = torch.zeros(rewards.shape[0], dtype=torch.bool, device=rewards.device)
    adv = agro_offpolicy_weights(rewards)  # r_i - b^r_i: the off-policy weights with beta = 0
    if online.any():
        if h is None:
            raise ValueError("klpg_loss: on-policy groups need h (the sequence log-ratio)")
        adv = torch.where(online[:, None], agro_offpolicy_weights(regularised_rewards(rewards, h, beta)), adv)
    offline_rows = (~online).repeat_interleave(rewards.shape[1]).to(kl.dtype)[:, None]  # [N, 1]
    return agro_loss(logprobs, mask, adv.reshape(-1), norm) + beta * reduce_tokens(kl * offline_rows, mask, norm)


def consistency_loss(rewards: torch.Tensor, h: torch.Tensor, beta: float) -> torch.Tensor:
    """Sample form of the consistency loss 1/2 Var[r_pi] (Eq. 3): mean over prompts of 1/2 s^2(r - beta h),
    ddof 1, with the gradient flowing through h. rewards, h: [B, n]. (ALGORITHMS.md §4.3's identity: its
    gradient is -beta x the off-policy AGRO estimate.)"""
    return 0.5 * (rewards - beta * h).var(-1, unbiased=True).mean()


# ---------------------------------------------------------------------------------------------------
# Log-probs with the whole next-token distribution (for KL-PG's exact per-token KL)
# ---------------------------------------------------------------------------------------------------
def logprobs_with_distribution(model, prompts, completions, pad_id):
    """common.completion_logprobs plus log pi(.|x, y_<t) over the vocabulary: ([N, T], [N, T], [N, T, V])."""
    device = next(model.parameters()).device
    ids, attn, pos, mask, P = [t.to(device) if torch.is_tensor(t) else t
                               for t in common.pad_batch(prompts, completions, pad_id)]
    C = mask.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=C + 1).logits
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [N, T, V]
    logp = logp_all.gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)  # [N, T]
    return logp * mask, mask, logp_all


# ---------------------------------------------------------------------------------------------------
# Offline data
# ---------------------------------------------------------------------------------------------------
def write_offline(path, problems, groups):
    """Offline groups as JSONL (task fields + completions + finished), written atomically."""
    with open(path + ".tmp", "w") as f:
        for problem, group in zip(problems, groups):
            f.write(json.dumps({**problem, "completions": [s.text for s in group],
                                "finished": [s.finished for s in group]}) + "\n")
    os.replace(path + ".tmp", path)


def read_offline(path, task, n, tokenizer, prompt_ids_of):
    """[(problem, prompt ids, [n completion ids], [n completion texts])] from an offline JSONL file.

    The task validates the problem fields (task.load_jsonl); each line must hold >= n completions (the
    first n are used). Completions are re-tokenised, EOS appended unless "finished" says it was cut.
    """
    problems = task.load_jsonl(path)  # raises a one-line ValueError on a bad problem
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                rows.append((lineno, json.loads(line)))
    groups = []
    for problem, (lineno, row) in zip(problems, rows):
        texts, finished = row.get("completions"), row.get("finished", [True] * n)
        if not (isinstance(texts, list) and len(texts) >= n and all(isinstance(t, str) for t in texts)):
            raise ValueError(f"{path}:{lineno}: 'completions' must be a list of at least --n {n} strings")
        if not (isinstance(finished, list) and len(finished) >= n):
            raise ValueError(f"{path}:{lineno}: 'finished' must be a list of {n} or more booleans")
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if fin else [])
               for t, fin in zip(texts[:n], finished[:n])]
        groups.append((problem, prompt_ids_of(problem), ids, texts[:n]))
    return groups


def offline_batch(groups, count, step, seed):
    """`count` offline groups for `step`: epochs of seeded permutations, a pure function of step (so that
    --resume continues exactly)."""
    out, pos = [], step * count
    while len(out) < count:
        epoch, offset = divmod(pos, len(groups))
        order = np.random.default_rng([seed, 1234, epoch]).permutation(len(groups))
        take = min(count - len(out), len(groups) - offset)
        out.extend(groups[i] for i in order[offset:offset + take])
        pos += take
    return out


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def main(argv=None):
    started = time.time()
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or common.default_out_dir("agro", args.task)
    f_online = args.online_fraction if args.online_fraction is not None else float(args.mode == "onpolicy")
    n_online = round(f_online * args.prompts)
    if args.beta is None:  # on-policy groups need beta above the threshold (module docstring); offline ones do not
        args.beta = 0.5 if n_online > 0 else 0.3

    try:  # every bad input surfaces here, before any training: one line, exit status 2
        task = get_task(args.task)
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from {', '.join(task.REWARD_VARIANTS)}")
        if args.n < 2:
            raise ValueError(f"--n must be at least 2 for a leave-one-out baseline, got {args.n}")
        if not 0.0 <= f_online <= 1.0:
            raise ValueError(f"--online-fraction must lie in [0, 1], got {f_online}")
        if args.beta < 0:
            raise ValueError(f"--beta must be >= 0, got {args.beta}")
        if args.beta == 0 and args.loss == "agro" and n_online > 0 and args.lambda_lr != 0:
            raise ValueError("on-policy AGRO divides by beta: give --beta > 0 or --lambda-lr 0")
        if args.lr_baseline == "var" and n_online > 0 and args.n < 3:
            raise ValueError("--lr-baseline var needs --n >= 3; use --lr-baseline none with n = 2")
        try:
            sizes = [int(s) for s in str(args.num_numbers).split(",")]
            eval_sizes = [int(s) for s in str(args.eval_numbers).split(",")]
        except ValueError:
            raise ValueError(f"--num-numbers/--eval-numbers: expected comma-separated integers, got "
                             f"{args.num_numbers!r}/{args.eval_numbers!r}") from None
        if args.offline_data and n_online == args.prompts:
            raise ValueError("--offline-data is unused when every group is on-policy: give --online-fraction < 1")
        if args.offline_data and not os.path.exists(args.offline_data):
            raise ValueError(f"--offline-data: no such file {args.offline_data}")
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
        ref_model, _ = common.load_model(ref_path, device=device)  # frozen pi_ref
        style = common.prompt_style(model, tokenizer)
        prompt_ids_of = lambda problem: common.encode_prompts(task, [problem], tokenizer, style)[0]  # noqa: E731
        offline = None
        if n_online < args.prompts and args.offline_data:
            offline = read_offline(args.offline_data, task, args.n, tokenizer, prompt_ids_of)
        run = common.Run(out, {**vars(args), "model_path": ref_path}, resume=bool(args.resume))
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))
    ref_model.requires_grad_(False)
    prompts_of = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style)) for n, ps in eval_problems.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step = 0
    if ckpt:
        state = common.load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        common.set_rng_state(state["rng"])
        step = state["step"]
        run.truncate(step)
        print(f"resumed from {ckpt} at step {step}")
    engine = common.make_engine(args.engine, model, tokenizer, ckpt or ref_path, seed=args.seed)
    sc = common.SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0)  # T=1, no top-p
    if n_online < args.prompts and offline is None:  # mu = pi_ref: n samples a prompt, drawn once, kept in the run
        path = run.path("reference_samples.jsonl")
        if not os.path.exists(path):
            t = time.perf_counter()
            idx = np.random.default_rng([args.seed, 99]).choice(len(pool), min(args.offline_prompts, len(pool)),
                                                                replace=False)
            engine.sync(ref_model)
            write_offline(path, [pool[i] for i in idx], engine.generate([prompts_of[i] for i in idx], sc))
            print(f"sampled {len(idx)} prompts x {args.n} from the reference in {time.perf_counter() - t:.0f}s: {path}")
        offline = read_offline(path, task, args.n, tokenizer, prompt_ids_of)
    engine.sync(model)
    print(f"agro: {common.count_parameters(model) / 1e6:.2f}M parameters from {ref_path}, engine {engine.name}, "
          f"loss {args.loss}, B={args.prompts} ({n_online} on-policy) n={args.n} beta={args.beta} "
          f"lambda_LR={args.lambda_lr}, run folder {run.dir}")

    def evaluate():
        model.eval()
        metrics = {}
        for n, (problems, prompts) in eval_sets.items():
            metrics.update(common.evaluate(engine, task, problems, prompts, k=args.eval_k, prefix=f"eval{n}/",
                                           max_new_tokens=args.max_new_tokens, reward_variant=args.reward))
        # KL(pi || pi_ref) = E_{y~pi} h(y), Monte Carlo on 4 samples of 64 training prompts
        idx = np.random.default_rng([args.seed, 7]).choice(len(pool), min(64, len(pool)), replace=False)
        metrics["kl_to_ref"] = common.kl_to_ref(engine, model, ref_model, [prompts_of[i] for i in idx],
                                                tokenizer.pad_token_id, max_new_tokens=args.max_new_tokens)
        return metrics

    if step == 0:
        row = evaluate()
        run.log(0, row)
        tqdm.write("step 0: " + "  ".join(f"{k}={v:.3f}" for k, v in row.items() if k.endswith("sampled/accuracy")))
    bar = tqdm(total=args.steps, initial=step, desc=f"agro {args.loss}", dynamic_ncols=True)
    deadline = started + 60 * args.time_limit if args.time_limit else float("inf")
    while step < args.steps:
        t0 = time.perf_counter()
        model.eval()
        # a batch: (problem, prompt ids, [n completion ids], [n texts], engine log-probs or None, on-policy?)
        batch = []
        if n_online:
            idx = np.random.default_rng([args.seed, step]).choice(len(pool), n_online, replace=False)
            for i, g in zip(idx, engine.generate([prompts_of[i] for i in idx], sc)):
                batch.append((pool[i], prompts_of[i], [s.ids for s in g], [s.text for s in g],
                              [s.logprobs for s in g], True))
        if n_online < args.prompts:
            batch += [(*grp, None, False) for grp in offline_batch(offline, args.prompts - n_online, step, args.seed)]
        rewards_all = [[task.reward(b[0], t, args.reward) for t in b[3]] for b in batch]
        t_gen = time.perf_counter() - t0

        model.train()
        optimizer.zero_grad(set_to_none=True)
        n_samples = len(batch) * args.n
        n_tokens = sum(len(c) for b in batch for c in b[2])
        loss_sum, logprob_gap, h_on, h_off, kl_on = 0.0, 0.0, [], [], []
        order = sorted(range(len(batch)), key=lambda i: max(len(c) for c in batch[i][2]))  # similar lengths together
        for start in range(0, len(order), args.micro_batch):
            mb = [batch[i] for i in order[start:start + args.micro_batch]]
            prompts = [b[1] for b in mb for _ in range(args.n)]
            completions = [c for b in mb for c in b[2]]
            r = torch.tensor([rewards_all[i] for i in order[start:start + args.micro_batch]])  # [b, n]
            online = torch.tensor([b[5] for b in mb])  # [b]
            if args.loss == "klpg":
                logprobs, mask, logp_all = logprobs_with_distribution(model, prompts, completions, tokenizer.pad_token_id)
                with torch.no_grad():
                    ref_lp, _, ref_all = logprobs_with_distribution(ref_model, prompts, completions, tokenizer.pad_token_id)
                kl = token_kl(logp_all, ref_all, mask)  # [b n, T], with gradient
            else:
                logprobs, mask = common.completion_logprobs(model, prompts, completions, tokenizer.pad_token_id)
                with torch.no_grad():
                    ref_lp, _ = common.completion_logprobs(ref_model, prompts, completions, tokenizer.pad_token_id)
            h = ((logprobs.detach() - ref_lp) * mask).sum(-1).view_as(r)  # [b, n] log pi(y|x) - log pi_ref(y|x)
            share = mask.sum().item() / n_tokens if args.loss_norm == "token" else len(completions) / n_samples
            if args.loss == "klpg":
                loss = klpg_loss(logprobs, mask, r, kl, args.beta, args.loss_norm, h, online) * share
            else:
                rpi = regularised_rewards(r, h, args.beta)
                w = agro_offpolicy_weights(rpi)  # Eq. 4 for offline groups (and the on-policy PD term)
                if online.any() and args.lambda_lr != 0:
                    w = torch.where(online[:, None], agro_onpolicy_weights(rpi, args.beta, args.lambda_lr,
                                                                           args.lr_baseline), w)  # Eqs. 5-6
                loss = agro_loss(logprobs, mask, w.reshape(-1), args.loss_norm) * share
            loss.backward()
            loss_sum += loss.item()
            h_on.append(h[online].reshape(-1))
            h_off.append(h[~online].reshape(-1))
            if args.loss == "klpg":
                kl_on.append((kl.detach() * mask).sum(-1))
            with torch.no_grad():  # on-policy groups: does the engine sample from exactly these weights?
                for j, b in enumerate(mb):
                    for s_ids, s_lp, row in zip(b[2], b[4] or [], range(j * args.n, (j + 1) * args.n)):
                        gap = (logprobs[row, :len(s_ids)].detach() - torch.tensor(s_lp)).abs().max().item()
                        logprob_gap = max(logprob_gap, gap)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        for group in optimizer.param_groups:  # linear warm-up to --lr over --warmup steps, then constant
            group["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
        optimizer.step()
        model.eval()
        engine.sync(model)  # the next on-policy groups (and evaluations) are sampled from exactly these weights
        step += 1

        grades = [task.grade(b[0], t) for b in batch for t in b[3]]
        h_on, h_off = torch.cat(h_on), torch.cat(h_off)
        row = {"loss": loss_sum, "reward": float(np.mean(rewards_all)),
               "accuracy": float(np.mean([g == "correct" for g in grades])),
               "format_rate": float(np.mean([g != "no_answer" for g in grades])),
               "length": n_tokens / n_samples, "grad_norm": grad_norm, "samples": n_samples,
               "time_generate": t_gen, "time_step": time.perf_counter() - t0}
        if n_online:  # on fresh policy samples, mean h estimates KL(pi || pi_ref)
            row.update(kl=h_on.mean().item(), logprob_gap=logprob_gap,
                       online_accuracy=float(np.mean([g == "correct" for g in grades[:n_online * args.n]])))
        if len(h_off):  # on reference samples, mean h = -KL(pi_ref || pi) (when mu = pi_ref)
            row["h_offline"] = h_off.mean().item()
        if kl_on:
            row["token_kl"] = torch.cat(kl_on).mean().item()
        last = step == args.steps or time.time() >= deadline
        if step % args.eval_every == 0 or last:
            row.update(evaluate())
            tqdm.write(f"step {step}: " + "  ".join(
                f"{k}={row[k]:.3f}" for k in row if k.endswith("sampled/accuracy") or k == "kl_to_ref"))
        run.log(step, row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", acc=f"{row['accuracy']:.2f}",
                        **({"gap": f"{logprob_gap:.1e}"} if n_online else {}))
        if step % args.save_every == 0 or last:
            common.save_checkpoint(run.path("checkpoint"), model, tokenizer,
                                   {"step": step, "optimizer": optimizer.state_dict(), "rng": common.rng_state()})
        if last:
            break
    bar.close()
    common.save_checkpoint(run.path("final"), model, tokenizer)
    engine.close()
    print(f"done: final model in {run.path('final')}  ({run.path('metrics.jsonl')})")
    return run.dir


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
