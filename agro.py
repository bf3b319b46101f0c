"""agro.py: Any-Generation Reward Optimization, off-policy and on-policy, from any mix of data.

[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm",
2025, arXiv:2503.19612.
[RLOO] Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
from Human Feedback in LLMs", 2024, arXiv:2402.14740.
Equation numbers are [AGRO]'s; docs/DERIVATIONS.md rebuilds the ones our text of it lost.

Maximise J(pi) = E_x[ E_{y~pi} r(x,y) - beta KL(pi(.|x) || pi_ref(.|x)) ]              (Eq. 1)
whose optimum is pi*(y|x) = pi_ref(y|x) exp(r(x,y)/beta) / Z(x)                         (Eq. 2)
With the regularised reward r_pi(x,y) = r(x,y) - beta log(pi(y|x)/pi_ref(y|x)), Theorem 1 says
r_pi* is the same number for EVERY generation y of a prompt (generation consistency), so pi* is
the unique minimiser of the consistency loss  l(pi; x, nu) = 1/2 Var_{y~nu}[r_pi(x, y)]  for ANY
data distribution nu with pi_ref's support (Eq. 3, Theorem 2): one loss learns from any generations.

For each prompt take n >= 2 completions y_1..y_n, and with h_i = sg(log pi(y_i) - log pi_ref(y_i)):
    r_pi,i = r_i - beta h_i             b_i = 1/(n-1) sum_{j != i} r_pi,j       (leave-one-out)
  off-policy AGRO (Eq. 4), data from anything that does not depend on theta (pi_ref, a file):
    loss = -1/(B n) sum (r_pi,i - b_i) log pi(y_i)     = (1/beta) grad 1/2 s^2(r_pi), ddof 1
  on-policy AGRO (Eqs. 5-6), data from the CURRENT policy at temperature 1: the pathwise term
  above plus the likelihood-ratio term, there because the sampling distribution depends on theta:
    w_i  = beta (r_pi,i - b_i) - lambda_LR 1/2 [(r_pi,i - b_i)^2 - v_i]     (lambda_LR = 1: paper)
    loss = -1/(B n) sum sg(w_i / beta) log pi(y_i)     (/beta, ours: the off-policy loss's scale)
  KL-regularised policy gradient, the paper's comparison (`--loss klpg`), as the paper runs it:
    offline groups (§8.2), with the exact per-token KL over the vocabulary along each sampled
    y_i, differentiated (it converges to the wrong policy, Fig. 1):
      loss = -1/(B n) sum (r_i - b^r_i) log pi(y_i) + beta/(B n) sum_i sum_t KL_t(y_i)
    on-policy groups (§8.1, [RLOO] with the KL in the reward):
      loss = -1/(B n) sum (r_pi,i - b_i) log pi(y_i),
      the same computation as off-policy AGRO's weights on fresh samples (= --lambda-lr 0) and
      the unbiased gradient of Eq. 1. The per-token form is NOT used there: along a fixed sampled
      path it drops the score term sum_s grad log pi(y_s|.) sum_{t>s} KL_t, so for responses of
      two or more tokens its expectation is not the gradient of Eq. 1 (docs/DERIVATIONS.md).

Data: each batch holds round(f B) groups sampled now from the current policy (`--online-fraction f`:
1 with `--mode onpolicy`, else 0), the rest from a fixed offline set: `--offline-data`, or n samples
of `--offline-prompts` prompts drawn once from pi_ref at T = 1 (the paper's mu = pi_ref, §8.2).

On-policy threshold (docs/DERIVATIONS.md): with rewards {a, b} and success rate p at pi = pi_ref,
the expected on-policy AGRO update raises a correct answer's probability only if p > 1/2 -
beta/(lambda_LR |a - b|); below it, g_LR pushes rarely-solved prompts towards never being solved.
At the paper's lambda_LR = 1 and a small beta most Countdown prompts are below it
(scripts/agro_threshold.py counts them) and the tiny model collapses; agro.py's default lambda_LR =
beta/2 puts the threshold at 1/2 - 2/|a - b| < 0 for 0/1 rewards, whatever beta, and keeps g_LR at
a quarter of the pathwise term's scale.

Run:  python agro.py --model runs/sft-countdown-.../final  [--mode offpolicy] [--engine vllm]
"""
import argparse
import json
import math
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task, problem_sets, problems_source
from tasks.files import read_jsonl, write_jsonl
from tasks.scoring import score

REFERENCE_SAMPLES = "reference_samples.jsonl"  # in the run folder: mu = pi_ref, drawn once


# Flags left at None: (the tiny model's value, a pretrained model's), sources in their --help.
MODEL_DEFAULTS = {"lr": (6e-5, 1e-5), "max_new_tokens": (64, 512)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--mode", choices=["offpolicy", "onpolicy"], default="onpolicy",
        help="groups from pi (Eqs. 5-6: gains in 5 min on 2 cores) or offline groups (Eq. 4)")
    add("--loss", choices=["agro", "klpg"], default="agro", help="agro, or §8's KL-regularised PG")
    add("--beta", type=common.nonnegative_float, default=None, help="KL coefficient per "
        "sequence: 0.05 with on-policy groups, else 0.3 (docs/RESULTS-agro-spo.md)")
    add("--lambda-lr", type=common.nonnegative_float, default=None,
        help="weight of g_LR: beta/2, not the paper's 1 (module docstring); 0 = RLOO")
    add("--lr-baseline", choices=["var", "none", "paper"], default="var",
        help="v_i in g_LR (agro_onpolicy_weights): var, unbiased and centred (n >= 3)")
    add("--online-fraction", type=common.fraction, default=None,
        help="on-policy share of each batch's groups: 1 with --mode onpolicy, else 0")
    add("--offline-data", default=None, metavar="FILE",
        help="offline groups (read_offline); None: pi_ref's samples")
    add("--offline-prompts", type=common.positive_int, default=2048,
        help="without --offline-data: prompts pi_ref samples first")
    add("--steps", type=common.positive_int, default=125, help="optimizer steps: ~5 min on 2 cores")
    add("--prompts", type=common.positive_int, default=32, help="prompts per batch (B)")
    add("--group-size", type=common.positive_int, default=8, help="completions a prompt (n, >= 2)")
    add("--loss-norm", choices=["seq", "seq/len", "token"], default="seq",
        help="seq: sum over tokens, mean over sequences")
    add("--reward", default=None, help="reward variant; None: the task's first")
    add("--lr", type=common.positive_float, default=None,
        help="AdamW lr; None: rloo.py's, 6e-5 for tiny and 1e-5 for a pretrained model")
    add("--warmup", type=common.nonnegative_int, default=10, help="lr warm-up steps (rloo.py's)")
    add("--micro-batch", type=common.positive_int, default=8, help="groups a pass (memory)")
    add("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    add("--bf16", action="store_true", help="bf16 autocast (weights, AdamW, log-softmax fp32)")
    add("--grad-checkpoint", action="store_true", help="recompute activations in backward")
    add("--task", default="countdown", help="task module in tasks/")
    add("--model", default=None, help="start and reference model pi_ref: a folder, a hub id, "
        "`tiny` (built in, untrained), `smollm2` (SmolLM2-135M-Instruct, pretrained) or `sft` (the "
        "newest sft.py run of --task); None: that run, made first by sft.py if none")
    add("--problems", type=problems_source, default=None, help="problems: JSONL, `hub`, a hub id")
    add("--train-size", type=common.positive_int, default=20000, help="training problems a size")
    add("--sizes", type=common.int_list, default=None, help="sizes trained on; None: the task's")
    add("--max-new-tokens", type=common.positive_int, default=None, help="tokens a completion; "
        "None: 64 for tiny, 512 for a pretrained model ([TOPR] §4)")
    add("--engine", default="auto", choices=["auto", "kv", "hf", "vllm"],
        help="generation engine; auto: vLLM, else hf on a GPU, kv on a CPU")
    add("--eval-sizes", type=common.int_list, default=None, help="held-out sizes; None: the task's")
    add("--eval-size", type=common.positive_int, default=200, help="held-out problems a size")
    add("--eval-k", type=common.positive_int, default=8, help="held-out samples a problem, T = 1")
    add("--eval-every", type=common.positive_int, default=50, help="evaluate every N steps")
    add("--out", default=None, help="run folder; None: runs/agro-TASK-TIME")
    add("--save-every", type=common.positive_int, default=50, help="checkpoint every N steps")
    add("--resume", default=None, metavar="RUN", help="continue the run in this folder")
    add("--time-limit", type=common.positive_float, default=None, metavar="MIN",
        help="stop MIN minutes after the start (evaluate, save)")
    add("--seed", type=common.nonnegative_int, default=0, help="seeds problems, batches, samples")
    add("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.online_fraction is None:  # the defaults that depend on other flags (see each help)
        args.online_fraction = float(args.mode == "onpolicy")
    if args.beta is None:
        args.beta = 0.05 if online_groups(args) > 0 else 0.3
    if args.lambda_lr is None and args.beta > 0:  # the on-policy threshold below 0 (docstring)
        args.lambda_lr = args.beta / 2
    return p, args


# ---- The estimators, pure functions of tensors: B prompts, n completions each, N = B n, T tokens
def regularised_rewards(rewards: torch.Tensor, h: torch.Tensor, beta: float) -> torch.Tensor:
    """r_pi = r - beta sg(h), h = log pi(y|x) - log pi_ref(y|x) a sequence (§3.1).  [B, n] each"""
    return rewards - beta * h.detach()


def loo_baseline(values: torch.Tensor) -> torch.Tensor:
    """b_i = 1/(n-1) sum_{j != i} values_j per group (Eq. 4), n >= 2 (else ValueError). [B, n]"""
    n = values.shape[-1]
    if n < 2:
        raise ValueError("a leave-one-out baseline needs n >= 2 completions per prompt")
    return (values.sum(-1, keepdim=True) - values) / (n - 1)


def agro_offpolicy_weights(rpi: torch.Tensor) -> torch.Tensor:
    """Off-policy AGRO weights r_pi,i - b_i on grad log pi(y_i) (Eq. 4).  rpi: [B, n] -> [B, n]
    Their mean over a group, times grad log pi, equals -(1/beta) grad 1/2 s^2(r_pi) (ddof 1,
    gradient through h): an unbiased estimate of -(1/beta) grad of the consistency loss (Lemma 3).
    They are all 0 at pi* (Theorem 1), whatever the samples."""
    return rpi - loo_baseline(rpi)


def agro_onpolicy_weights(rpi, beta: float, lambda_lr: float, lr_baseline: str = "var"):
    """On-policy AGRO weights w_i / beta (Eqs. 5-6).  rpi: [B, n] -> [B, n]
    w_i = beta (r_pi,i - b_i) - lambda_lr 1/2 [(r_pi,i - b_i)^2 - v_i], divided by beta to give the
    pathwise part the off-policy scale. E[(r_pi,i - b_i)^2 | y_i] = (r_pi,i - m)^2 + Var/(n-1): any
    v_i independent of y_i multiplies a zero-mean score, so v_i = 0 is unbiased (Proposition 4),
    but then every weight carries -(lambda/2beta) n/(n-1) Var on average, a push on all sampled
    sequences that cancels only in expectation and, on Countdown, outweighs the signal (the model
    drifts). As the group's average of (r_pi,i - b_i)^2 is n/(n-1) Var, these baselines remove it:
      "var"   n/(n-1) x the ddof-1 variance of the other n-1 rewards (n >= 3, else ValueError):
              independent of y_i, so unbiased, and centred (the variance alone: Var/(n-1) off);
      "paper" our reading of the paper's variance-reduced estimate, the mean of the others' squared
              residuals: centred too, but it depends on y_i through b_j, so slightly biased."""
    adv = agro_offpolicy_weights(rpi)  # [B, n]
    n = rpi.shape[-1]
    if lr_baseline == "none":
        v = torch.zeros_like(rpi)
    elif lr_baseline == "var":
        if n < 3:
            raise ValueError("--lr-baseline var needs n >= 3 (the variance of the other n-1)")
        others_mean = loo_baseline(rpi)  # [B, n]
        sq_others = (rpi ** 2).sum(-1, keepdim=True) - rpi ** 2  # sum_{j != i} r_pi,j^2
        v = n / (n - 1) * (sq_others - (n - 1) * others_mean ** 2) / (n - 2)
    elif lr_baseline == "paper":
        v = loo_baseline(adv ** 2)
    else:
        raise ValueError(f"unknown lr_baseline {lr_baseline!r}")
    return adv - lambda_lr * 0.5 * (adv ** 2 - v) / beta


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, norm: str = "seq") -> torch.Tensor:
    """Per-token values [N, T] -> scalar. seq: sum over tokens, mean over sequences; seq/len: each
    sum divided by its own length; token: sum over all tokens divided by their count."""
    if norm == "token":
        return (values * mask).sum() / mask.sum()
    per_seq = (values * mask).sum(-1)  # [N]
    if norm == "seq/len":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif norm != "seq":
        raise ValueError(f"unknown loss normalisation {norm!r}")
    return per_seq.mean()


def agro_loss(logprobs: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, norm: str = "seq"):
    """-mean_i sg(w_i) log pi(y_i): Eq. 4 with off-policy weights, Eqs. 5-6 with on-policy ones.
    logprobs: [N, T] per-token log pi(y_t|x, y_<t) with gradient, 0 on padding;  mask: [N, T] (EOS
    counted);  weights: [N] (detached here)."""
    return -reduce_tokens(weights.detach()[:, None] * logprobs, mask, norm)


def token_kl(logp_all: torch.Tensor, ref_logp_all: torch.Tensor, mask: torch.Tensor):
    """Exact KL(pi(.|x,y_<t) || pi_ref(.|x,y_<t)), a sum over the vocabulary, at every position.
    logp_all, ref_logp_all: [N, T, V] log-softmax;  mask: [N, T]  ->  [N, T], 0 on padding."""
    return (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1) * mask


def klpg_loss(logprobs, mask, rewards, kl, beta: float, norm: str = "seq", h=None, online=None):
    """The KL-regularised policy gradient of the module docstring, group by group: per-token KL on
    offline groups (§8.2), the sequence KL in a detached reward on on-policy ones (§8.1).
    logprobs, mask, kl: [N, T] (kl: token_kl, with gradient; None if every group is on-policy);
    rewards, h: [B, n] (h: for on-policy groups);  online: [B] bool (default: all offline)."""
    if online is None:
        online = torch.zeros(rewards.shape[0], dtype=torch.bool, device=rewards.device)
    adv = agro_offpolicy_weights(rewards)  # r_i - b^r_i: the off-policy weights with beta = 0
    if online.any():
        rloo = agro_offpolicy_weights(regularised_rewards(rewards, h, beta))  # [B, n]
        adv = torch.where(online[:, None], rloo, adv)
    loss = agro_loss(logprobs, mask, adv.reshape(-1), norm)
    if online.all():  # no offline group: no per-token KL term (kl may be None)
        return loss
    offline_rows = (~online).repeat_interleave(rewards.shape[1]).to(kl.dtype)[:, None]  # [N, 1]
    return loss + beta * reduce_tokens(kl * offline_rows, mask, norm)  # + beta sum_t KL_t(y_i)


def consistency_loss(rewards: torch.Tensor, h: torch.Tensor, beta: float) -> torch.Tensor:
    """Sample form of the consistency loss 1/2 Var_nu[r_pi] (§3.1, the squared loss that enforces
    Eq. 3's consistency of r_pi* across generations): mean over prompts of 1/2 s^2(r - beta h),
    ddof 1, with the gradient flowing through h. rewards, h: [B, n]. Its
    gradient is -beta x the off-policy AGRO estimate (docs/DERIVATIONS.md)."""
    return 0.5 * (rewards - beta * h).var(-1, unbiased=True).mean()


def micro_batch_loss(logprobs, mask, rewards, h, online, kl, args) -> torch.Tensor:
    """The loss `--loss` names on one micro-batch: AGRO (Eq. 4 on offline groups, Eqs. 5-6 on
    on-policy ones) or KL-PG.  logprobs, mask, kl: [N, T];  rewards, h: [B, n];  online: [B]."""
    if args.loss == "klpg":
        return klpg_loss(logprobs, mask, rewards, kl, args.beta, args.loss_norm, h, online)
    rpi = regularised_rewards(rewards, h, args.beta)
    w = agro_offpolicy_weights(rpi)  # Eq. 4 for offline groups (and the on-policy pathwise term)
    if online.any() and args.lambda_lr != 0:
        on = agro_onpolicy_weights(rpi, args.beta, args.lambda_lr, args.lr_baseline)  # Eqs. 5-6
        w = torch.where(online[:, None], on, w)
    return agro_loss(logprobs, mask, w.reshape(-1), args.loss_norm)


# ---- Data: groups of n completions, sampled now from the policy or read from an offline file -----
class Group(NamedTuple):
    """One prompt's n completions and what the step needs to know about them."""
    prompt_ids: list[int]
    completion_ids: list[list[int]]  # n token-id lists (EOS included when emitted)
    rewards: list[float]
    grades: list[str]  # task.grade of each completion ("correct", "wrong", ...)
    sampler_logprobs: list[list[float]] | None  # per token, from the engine (on-policy groups)
    online: bool  # sampled now from the current policy


def make_group(task, reward, problem, prompt_ids, ids, texts, sampler_logprobs=None) -> Group:
    """A Group scored by the task; on-policy iff the sampler's log-probs are given."""
    rewards = [task.reward(problem, t, reward) for t in texts]
    grades = [task.grade(problem, t) for t in texts]
    return Group(prompt_ids, ids, rewards, grades, sampler_logprobs,
                 online=sampler_logprobs is not None)


def write_offline(path, problems, groups):
    """Offline groups as JSONL (task fields + completions + finished), written atomically."""
    write_jsonl(path, [{**problem, "completions": [s.text for s in group],
                        "finished": [s.finished for s in group]}
                       for problem, group in zip(problems, groups)])


def read_offline(path, task, n) -> list[tuple[dict, list[str], list[bool]]]:
    """(problem, n completions, n finished flags) from each row of an offline JSONL file: the
    task's fields, "completions" (>= n strings) and optionally "finished" (booleans; false = cut
    at the length limit, no EOS). Bad rows: ValueError naming the file and row."""
    rows = []
    for i, row in enumerate(read_jsonl(path, "file"), 1):
        try:
            problem = task.problem_from_row(row)
        except ValueError as e:
            raise ValueError(f"{path}: row {i}: {e}") from None
        texts, finished = row.get("completions"), row.get("finished", [True] * n)
        for key, value, kind, what in (("completions", texts, str, f"at least {n} strings"),
                                       ("finished", finished, bool, f"{n} or more booleans")):
            if not (isinstance(value, list) and len(value) >= n
                    and all(isinstance(v, kind) for v in value)):
                raise ValueError(f"{path}: row {i}: '{key}' must be a list of {what}")
        rows.append((problem, texts[:n], finished[:n]))
    if not rows:
        raise ValueError(f"{path}: no offline groups in it")
    return rows


def sample_reference(engine, ref_model, pool, prompts, args, path: str) -> None:
    """mu = pi_ref (§8.2): --group-size completions of --offline-prompts prompts, seeded."""
    idx = np.random.default_rng([args.seed, 99]).choice(
        len(pool), min(args.offline_prompts, len(pool)), replace=False)
    print(f"sampling {len(idx)} prompts x {args.group_size} from pi_ref into {path}", flush=True)
    engine.sync(ref_model)
    sc = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                               seed=args.seed)
    write_offline(path, [pool[i] for i in idx], engine.generate([prompts[i] for i in idx], sc))


def offline_groups(rows, task, reward, tokenizer, style) -> list[Group]:
    """Offline rows re-tokenised (EOS appended unless "finished" says the completion was cut)."""
    eos = [tokenizer.eos_token_id]
    prompts = common.encode_prompts(task, [problem for problem, _, _ in rows], tokenizer, style)
    return [make_group(task, reward, problem, prompt_ids,
                       [tokenizer(t, add_special_tokens=False)["input_ids"] + (eos if fin else [])
                        for t, fin in zip(texts, finished)], texts)
            for (problem, texts, finished), prompt_ids in zip(rows, prompts)]


def online_groups(args) -> int:
    """On-policy groups a batch: round(f B)."""
    return round(args.online_fraction * args.prompts)


def sample_batch(engine, task, pool, prompts, offline, step, args) -> list[Group]:
    """round(f B) groups sampled now from pi (temperature 1, no top-p), then offline ones: epochs
    of seeded permutations of the offline set, a pure function of step (so --resume is exact)."""
    batch, n_online = [], online_groups(args)
    if n_online:
        idx = np.random.default_rng([args.seed, step]).choice(len(pool), n_online, replace=False)
        sc = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                                   temperature=1.0)
        for i, g in zip(idx, engine.generate([prompts[i] for i in idx], sc)):
            batch.append(make_group(task, args.reward, pool[i], prompts[i], [s.ids for s in g],
                                    [s.text for s in g], [s.logprobs for s in g]))
    pos = step * (args.prompts - n_online)  # offline groups taken before this step
    while len(batch) < args.prompts:
        epoch, offset = divmod(pos, len(offline))
        order = np.random.default_rng([args.seed, 1234, epoch]).permutation(len(offline))
        take = min(args.prompts - len(batch), len(offline) - offset)
        batch.extend(offline[i] for i in order[offset:offset + take])
        pos += take
    return batch


# ---- One optimizer step --------------------------------------------------------------------------
def policy_and_reference(model, ref_model, prompts, completions, pad_id, with_kl: bool,
                         bf16: bool = False):
    """log pi per token (with gradient), log pi_ref per token, the mask, and (with_kl) the exact
    per-token KL(pi || pi_ref) along each completion, with gradient: [N, T] each (else kl None)."""
    out = common.completion_logprobs(model, prompts, completions, pad_id, full=with_kl, bf16=bf16)
    with torch.no_grad():
        ref = common.completion_logprobs(ref_model, prompts, completions, pad_id, full=with_kl,
                                         bf16=bf16)
    return out[0], ref[0], out[1], token_kl(out[2], ref[2], out[1]) if with_kl else None


def agro_step(model, ref_model, optimizer, batch: list[Group], args, step: int, pad_id: int):
    """One optimizer step of --loss on a batch (micro-batches, clip, warm-up); returns metrics."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n_samples = len(batch) * args.group_size
    n_tokens = sum(len(c) for g in batch for c in g.completion_ids)
    loss_sum, gap, h_on, h_off, kls = 0.0, 0.0, [], [], []
    order = sorted(batch, key=lambda g: max(len(c) for c in g.completion_ids))  # similar lengths
    for start in range(0, len(order), args.micro_batch):
        mb = order[start:start + args.micro_batch]
        prompts = [g.prompt_ids for g in mb for _ in range(args.group_size)]
        completions = [c for g in mb for c in g.completion_ids]
        r = torch.tensor([g.rewards for g in mb], device=device)  # [b, n]
        online = torch.tensor([g.online for g in mb], device=device)  # [b]
        with_kl = args.loss == "klpg" and not online.all()  # per-token KL on offline groups only
        logprobs, ref_lp, mask, kl = policy_and_reference(model, ref_model, prompts, completions,
                                                          pad_id, with_kl, args.bf16)
        h = ((logprobs.detach() - ref_lp) * mask).sum(-1).view_as(r)  # [b, n] log pi - log pi_ref
        share = (mask.sum().item() / n_tokens if args.loss_norm == "token"
                 else len(completions) / n_samples)
        loss = micro_batch_loss(logprobs, mask, r, h, online, kl, args) * share
        loss.backward()
        loss_sum += loss.item()
        h_on.append(h[online].reshape(-1))
        h_off.append(h[~online].reshape(-1))
        if kl is not None:
            kls.append(kl.detach().sum(-1))
        for j, g in enumerate(mb):  # on-policy groups: max |log pi - the engine's log-prob|
            for k, lp in enumerate(g.sampler_logprobs or []):
                diff = (logprobs[j * args.group_size + k, :len(lp)].detach()
                        - torch.tensor(lp, device=device))
                gap = max(gap, diff.abs().max().item())  # 0 if sampled from these very weights
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):  # before the weights change
        tqdm.write(f"error: step {step + 1}: non-finite loss={loss_sum} or grad_norm={grad_norm}; "
                   "weights not updated, the last checkpoint is the last good state. Likely cause: "
                   "--lr too large, or --beta / --lambda-lr against the rewards' scale",
                   file=sys.stderr)
        raise SystemExit(1)
    for group in optimizer.param_groups:  # linear warm-up to --lr over --warmup steps
        group["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
    optimizer.step()
    model.eval()
    grades = [gr for g in batch for gr in g.grades]
    h_on, h_off = torch.cat(h_on), torch.cat(h_off)
    row = {"loss": loss_sum, "reward": float(np.mean([g.rewards for g in batch])),
           "accuracy": float(np.mean([gr == "correct" for gr in grades])),
           "format_rate": float(np.mean([gr != "no_answer" for gr in grades])),
           "length": n_tokens / n_samples, "grad_norm": grad_norm, "samples": n_samples}
    if len(h_on):  # on fresh policy samples, mean h estimates KL(pi || pi_ref)
        on_grades = [gr for g in batch if g.online for gr in g.grades]
        row.update(kl=h_on.mean().item(), logprob_gap=gap,
                   online_accuracy=float(np.mean([gr == "correct" for gr in on_grades])))
    if len(h_off):  # mean h on the offline texts re-tokenised, not on mu's own tokens: near
        row["h_offline_retokenised"] = h_off.mean().item()  # -KL(pi_ref || pi) when mu = pi_ref
    if kls:
        row["token_kl"] = torch.cat(kls).mean().item()
    return row


# ---- Evaluation ----------------------------------------------------------------------------------
def evaluate(engine, model, ref_model, task, eval_sets, train_prompts, args) -> dict:
    """Held-out metrics per size (tasks/scoring.py): greedy and --eval-k samples at T = 1 drawn
    with seed 0 (every checkpoint meets the same draws); then KL(pi || pi_ref) = E_{y~pi} h(y) by
    Monte Carlo: the mean of h over 4 samples (T = 1, seed 0) of 64 training prompts."""
    model.eval()
    metrics = {}
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    sampled = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens, seed=0)
    for n, (problems, prompts) in eval_sets.items():
        for mode, sc in [("greedy", greedy), ("sampled", sampled)]:
            groups = engine.generate(prompts, sc)
            metrics.update(score(task, problems, groups, mode, args.reward, prefix=f"eval{n}/"))
    idx = np.random.default_rng([args.seed, 7]).choice(len(train_prompts),
                                                        min(64, len(train_prompts)), replace=False)
    groups = engine.generate([train_prompts[i] for i in idx],
                             common.SamplingConfig(n=4, max_new_tokens=args.max_new_tokens, seed=0))
    flat = [s for g in groups for s in g]
    batch = ([s.prompt_ids for s in flat], [s.ids for s in flat], engine.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, mask = common.completion_logprobs(model, *batch, bf16=args.bf16)
        ref_lp, _ = common.completion_logprobs(ref_model, *batch, bf16=args.bf16)
    metrics["kl_to_ref"] = ((lp - ref_lp) * mask).sum(-1).mean().item()
    return metrics


# ---- main(): every input checked, then the loop (saving and resuming: the run section) -----------
def main(argv=None):
    parser, args = parse_args(argv)
    run = Run(parser, args, keys={"model", "optimizer"})  # --resume, the run folder, checkpoint
    common.setup(args.seed, args.threads)
    n_online = online_groups(args)
    samples_path = os.path.join(args.out, REFERENCE_SAMPLES)
    # Every input is checked before anything long starts: bad input is one line and exit 2.
    try:
        task = get_task(args.task)
        args.reward = args.reward or task.REWARD_VARIANTS[0]
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from "
                             f"{', '.join(task.REWARD_VARIANTS)}")
        if args.group_size < 2:
            raise ValueError("--group-size must be at least 2 for a leave-one-out baseline")
        if args.beta == 0 and args.loss == "agro" and n_online > 0 and args.lambda_lr != 0:
            raise ValueError("on-policy AGRO divides by beta: give --beta > 0 or --lambda-lr 0")
        if args.lr_baseline == "var" and n_online > 0 and args.group_size < 3:
            raise ValueError("--lr-baseline var needs --group-size >= 3 (or --lr-baseline none)")
        if args.offline_data and n_online == args.prompts:
            raise ValueError("--offline-data is unused with all groups on-policy: --mode offpolicy")
        pool, held_out = problem_sets(task, sizes=args.sizes, train_size=args.train_size,
                                      eval_sizes=args.eval_sizes, eval_size=args.eval_size,
                                      seed=args.seed, source=args.problems)
        if len(pool) < n_online:
            raise ValueError(f"{n_online} on-policy prompts a batch are more than the {len(pool)} "
                             "training problems")
        rows = None  # a file's offline groups, read before a model is loaded (or sft.py run)
        if n_online < args.prompts and args.offline_data:
            rows = read_offline(args.offline_data, task, args.group_size)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tokenizer = common.load_model(args.model, device=device, task=args.task,
                                             run_dir=args.out, grad_checkpoint=args.grad_checkpoint)
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_model_defaults(args, model, MODEL_DEFAULTS)  # flags left at None
        ref_model = common.load_model(args.model_path, device=device)[0].requires_grad_(False)
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    style = common.prompt_style(model, tokenizer)
    prompts = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style))
                 for n, ps in held_out.items()}
    offline = None if rows is None else offline_groups(rows, task, args.reward, tokenizer, style)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    start = run.begin(model=model, optimizer=optimizer)  # 0, or the checkpoint's step
    engine = common.make_engine(args.engine, model, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    if n_online < args.prompts and offline is None:  # mu = pi_ref (§8.2), drawn once
        if not os.path.exists(samples_path):  # a resumed run reads the ones drawn before
            sample_reference(engine, ref_model, pool, prompts, args, samples_path)
        rows = read_offline(samples_path, task, args.group_size)  # the tokens, re-read
        offline = offline_groups(rows, task, args.reward, tokenizer, style)
    engine.sync(model)  # the policy's weights (resumed, if so)
    print(f"agro: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters from "
          f"{args.model_path}, engine {engine.name}, loss {args.loss}, B={args.prompts} "
          f"({n_online} on-policy) n={args.group_size} beta={args.beta} lambda_LR={args.lambda_lr} "
          f"run {args.out}")
    if start == 0:
        run.log(0, evaluate(engine, model, ref_model, task, eval_sets, prompts, args))
    done = start  # optimizer steps taken
    for step in tqdm(range(start, args.steps), "agro", total=args.steps, initial=start,
                     leave=False):
        t0 = time.perf_counter()
        batch = sample_batch(engine, task, pool, prompts, offline, step, args)
        t_gen = time.perf_counter() - t0
        row = agro_step(model, ref_model, optimizer, batch, args, step, tokenizer.pad_token_id)
        engine.sync(model)  # the next on-policy groups come from exactly these weights
        done = step + 1
        row.update(time_generate=t_gen, time_step=time.perf_counter() - t0)
        last = done == args.steps or time.monotonic() > run.deadline
        if done % args.eval_every == 0 or last:
            row.update(evaluate(engine, model, ref_model, task, eval_sets, prompts, args))
        run.log(done, row)
        if done % args.save_every == 0 or last:
            run.checkpoint(done)
        if last:
            break
    engine.close()
    return run.finish(model, tokenizer, stopped_early=done < args.steps)


# ---- Run section: the same code in all five scripts (tests/test_run_section.py) ----------------
class Run:
    """The run folder: config.json (flags), metrics.jsonl (a row a step), checkpoint.pt (weights,
    optimizer, RNGs, step) and final/. A kill loses what came after the last checkpoint, no more."""
    def __init__(self, parser, args, keys: set):
        """A new run folder, or --resume's flags, checkpoint and metrics; bad: one line, exit 2."""
        self.script, self.args, self.state = os.path.basename(__file__), args, None
        if args.resume is None:
            args.out = args.out or time.strftime(
                f"runs/{self.script[:-3]}-{args.task}-%Y%m%d-%H%M%S")
            if os.path.exists(os.path.join(args.out, "metrics.jsonl")):
                parser.error(f"--out {args.out} holds a run already: --resume it or pick another")
        else:  # one check covers every way a run folder can be wrong
            try:
                with open(path := os.path.join(args.resume, "config.json")) as f:
                    vars(args).update(json.load(f), resume=args.resume, out=args.resume)
                args.model = args.model_path  # the start model (`tiny`: the one built in RUN)
                path = os.path.join(args.out, "checkpoint.pt")
                self.state = torch.load(path, weights_only=False)
                if self.state.get("script") != self.script or not keys <= set(self.state):
                    raise ValueError(f"not a {self.script} checkpoint")
                with open(path := os.path.join(args.out, "metrics.jsonl"), "rb") as f:
                    size = sum(len(row) for row in f if row.endswith(b"\n")
                               and json.loads(row)["step"] <= self.state["step"])
                os.truncate(path, size)  # the rows after the checkpoint, or torn by a kill, go
            except Exception as e:  # torch.load alone raises many kinds
                parser.error(f"--resume {args.resume}: cannot use {path}: {e!r}")
        self.deadline = time.monotonic() + 60 * (args.time_limit or math.inf)

    def begin(self, **objects) -> int:
        """config.json (a new run), or `objects` and every RNG as saved; the step to start at."""
        self.objects, self.wall = objects, time.time()
        os.makedirs(self.args.out, exist_ok=True)
        self.file = open(os.path.join(self.args.out, "metrics.jsonl"), "a", buffering=1)
        if self.state is None:
            with open(os.path.join(self.args.out, "config.json"), "w") as f:
                json.dump(vars(self.args), f, indent=2, default=str)
            return 0
        for name, obj in objects.items():  # the model, AdamW, ...
            obj.load_state_dict(self.state[name])
        common.set_rng_state(self.state["rng"])
        return self.state["step"]

    def log(self, step: int, row: dict) -> None:
        row = {"step": step, "time": round(time.time() - self.wall, 3), **row}
        self.file.write(json.dumps(row) + "\n")  # line-buffered: a kill tears the last row at most
        if shown := [f"{k}={v:.3f}" for k, v in row.items() if k.endswith("/accuracy")]:
            tqdm.write(f"step {step}: " + "  ".join(shown))

    def checkpoint(self, step: int, **extra) -> None:
        """checkpoint.pt: the objects given to begin(), every RNG, the step and `extra`."""
        path = os.path.join(self.args.out, "checkpoint.pt")
        torch.save({**{k: obj.state_dict() for k, obj in self.objects.items()}, **extra,
                    "rng": common.rng_state(), "step": step, "script": self.script}, path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a kill leaves the old checkpoint or the new

    def finish(self, model, tokenizer, stopped_early: bool) -> str:
        """final/ (a Hugging Face folder: any script's --model), then the closing lines."""
        self.file.close()
        for obj in (model, tokenizer):
            obj.save_pretrained(os.path.join(self.args.out, "final"))
        print("\n".join(closing_lines(self.args, stopped_early)))
        return self.args.out


def closing_lines(args, stopped_early: bool) -> list[str]:
    """Held-out accuracy per size at the first and last evaluation, the run folder, what next."""
    with open(os.path.join(args.out, "metrics.jsonl")) as f:
        rows = [json.loads(row) for row in f]
    evals = [row for row in rows if any(k.startswith("eval") for k in row)] or [{"step": 0}]
    first, last, script = evals[0], evals[-1], os.path.basename(__file__)
    lines = [f"{script} done. Held-out accuracy (%), step {first['step']} -> step {last['step']}:"]
    for size in dict.fromkeys(k.split("/")[0][4:] for k in first if k.startswith("eval")):
        shown = [(name, [100 * row[f"eval{size}/{mode}/accuracy"] for row in (first, last)])
                 for name, mode in (("greedy", "greedy"), ("T = 1", "sampled"))
                 if f"eval{size}/{mode}/accuracy" in first]
        lines.append(f"  size {size}: " + ", ".join(f"{name} {a:.1f} -> {b:.1f} ({b - a:+.1f})"
                                                     for name, (a, b) in shown))
    if not any(row.get("grad_norm") and row.get("accuracy", 1) for row in rows):  # sft.py: none
        lines.append("no learning signal: no step had a correct sample and a non-zero gradient")
    if max([v for k, v in last.items() if k.endswith("/unfinished")], default=0) > 0.5:
        lines.append(f"most held-out samples were cut at --max-new-tokens {args.max_new_tokens}")
    lines.append(f"run folder: {args.out} (final model: {args.out}/final)")
    if stopped_early:
        lines.append(f"stopped at --time-limit; continue: python {script} --resume {args.out}")
    if script == "sft.py":
        lines.append(f"next: python topr.py --task {args.task} --model {args.out}/final")
    return lines


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
