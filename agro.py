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
1 with `--mode onpolicy`, else 0) and the rest from a fixed offline set: `--offline-data`, or the
paper's offline setting (mu = pi_ref, §8.2), n samples of `--offline-prompts` prompts drawn once
from pi_ref at temperature 1. Off-policy AGRO needs no behaviour log-probs, so file completions are
simply re-tokenised.

On-policy threshold (docs/DERIVATIONS.md): with rewards {a, b} and success rate p at
pi = pi_ref, the expected on-policy AGRO update raises a correct answer's probability only if
p > 1/2 - beta/(lambda_LR |a - b|); below it, the g_LR term pushes rarely-solved prompts towards
never being solved (a zero-variance policy). At the paper's lambda_LR = 1 and a small beta most
Countdown prompts are below it (scripts/agro_threshold.py counts them) and the tiny model
collapses; agro.py's default lambda_LR = beta/2 puts the threshold at 1/2 - 2/|a - b| < 0 for
0/1 rewards, whatever beta, and keeps g_LR at a quarter of the pathwise term's scale.

Run:  python agro.py --model runs/sft-countdown-.../final  [--mode onpolicy --engine vllm: GPU]
"""
import argparse
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task

REFERENCE_SAMPLES = "reference_samples.jsonl"  # in the run folder: mu = pi_ref, drawn once


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["offpolicy", "onpolicy"], default="offpolicy",
                   help="default data: offline groups (Eq. 4) or fresh ones from pi (Eqs. 5-6)")
    p.add_argument("--loss", choices=["agro", "klpg"], default="agro",
                   help="agro, or the KL-regularised policy gradient it is compared with (§8)")
    p.add_argument("--beta", type=common.nonnegative_float, default=None, help="KL coefficient "
                   "per sequence: 0.05 with on-policy groups, else 0.3 (docs/RESULTS-agro-spo.md)")
    p.add_argument("--lambda-lr", type=common.nonnegative_float, default=None,
                   help="weight of g_LR: beta/2, not the paper's 1 (module docstring); 0 = RLOO")
    p.add_argument("--lr-baseline", choices=["var", "none", "paper"], default="var",
                   help="v_i in g_LR (agro_onpolicy_weights): var, unbiased and centred (n >= 3)")
    p.add_argument("--online-fraction", type=common.fraction, default=None,
                   help="on-policy share of each batch's groups: 1 with --mode onpolicy, else 0")
    p.add_argument("--offline-data", type=common.existing_file, default=None, metavar="FILE",
                   help="JSONL of offline groups (read_offline); default: pi_ref's samples")
    p.add_argument("--offline-prompts", type=common.positive_int, default=2048,
                   help="without --offline-data: prompts sampled n times from pi_ref first")
    p.add_argument("--steps", type=common.positive_int, default=150, help="optimizer steps")
    p.add_argument("--prompts", type=common.positive_int, default=32, help="prompts per batch (B)")
    p.add_argument("--n", type=int, default=8, help="completions per prompt (n >= 2)")
    p.add_argument("--loss-norm", choices=["seq", "seq/len", "token"], default="seq",
                   help="seq: sum over tokens, mean over sequences, as the derivation")
    p.add_argument("--reward", default=None, help="reward variant; default: the task's first")
    p.add_argument("--lr", type=common.positive_float, default=6e-5, help="AdamW lr (rloo.py's)")
    p.add_argument("--warmup", type=common.nonnegative_int, default=10,
                   help="steps of linear lr warm-up (rloo.py's)")
    common.add_run_flags(p, eval_every=50, save_every=50, micro_batch=8,
                         micro_help="prompts (groups of n) per forward/backward pass: memory only")
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
    """b_i = 1/(n-1) sum_{j != i} values_j within each group (Eq. 4).  values: [B, n] -> [B, n]"""
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


def agro_onpolicy_weights(rpi, beta: float, lambda_lr: float = 1.0, lr_baseline: str = "var"):
    """On-policy AGRO weights w_i / beta (Eqs. 5-6).  rpi: [B, n] -> [B, n]
    w_i = beta (r_pi,i - b_i) - lambda_lr 1/2 [(r_pi,i - b_i)^2 - v_i], divided by beta to give the
    pathwise part the off-policy scale. E[(r_pi,i - b_i)^2 | y_i] = (r_pi,i - m)^2 + Var/(n-1): any
    v_i independent of y_i multiplies a zero-mean score, so v_i = 0 is unbiased (Proposition 4),
    but then every weight carries -(lambda/2beta) n/(n-1) Var on average, a push on all sampled
    sequences that cancels only in expectation and, on Countdown, outweighs the signal (the model
    drifts). As the group's average of (r_pi,i - b_i)^2 is n/(n-1) Var, these baselines remove it:
      "var"   n/(n-1) x the ddof-1 variance of the other n-1 rewards: independent of y_i, so
              unbiased, and centred (the variance alone would leave Var/(n-1) uncentred);
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
    """One prompt with its n completions and what the step needs to know about them."""
    problem: dict
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
    return Group(problem, prompt_ids, ids, rewards, grades, sampler_logprobs,
                 online=sampler_logprobs is not None)


def write_offline(path, problems, groups):
    """Offline groups as JSONL (task fields + completions + finished), written atomically."""
    common.write_jsonl_atomic(path, [{**problem, "completions": [s.text for s in group],
                                      "finished": [s.finished for s in group]}
                                     for problem, group in zip(problems, groups)])


def read_offline(path, task, n) -> list[tuple[dict, list[str], list[bool]]]:
    """(problem, n completions, n finished flags) from each row of an offline JSONL file: the
    task's fields, "completions" (>= n strings) and optionally "finished" (booleans; false = cut
    at the length limit, no EOS). Bad rows: common.UsageError naming the file and row."""
    rows = []
    for i, row in enumerate(common.read_jsonl(path, "file"), 1):
        try:
            problem = task.problem_from_row(row)
        except ValueError as e:
            raise common.UsageError(f"{path}: row {i}: {e}") from None
        texts, finished = row.get("completions"), row.get("finished", [True] * n)
        for key, value, kind, what in (("completions", texts, str, f"at least --n {n} strings"),
                                       ("finished", finished, bool, f"{n} or more booleans")):
            if not (isinstance(value, list) and len(value) >= n
                    and all(isinstance(v, kind) for v in value)):
                raise common.UsageError(f"{path}: row {i}: '{key}' must be a list of {what}")
        rows.append((problem, texts[:n], finished[:n]))
    if not rows:
        raise common.UsageError(f"{path}: no offline groups in it")
    return rows


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


def sample_batch(args, inputs: common.Inputs, engine, offline, step) -> list[Group]:
    """round(f B) groups sampled now from pi (temperature 1, no top-p), then offline ones: epochs
    of seeded permutations of the offline set, a pure function of step (so --resume is exact)."""
    batch, n_online = [], online_groups(args)
    if n_online:
        idx = np.random.default_rng([args.seed, step]).choice(len(inputs.pool), n_online,
                                                              replace=False)
        sc = common.SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0)
        for i, g in zip(idx, engine.generate([inputs.prompts[i] for i in idx], sc)):
            batch.append(make_group(inputs.task, args.reward, inputs.pool[i], inputs.prompts[i],
                                    [s.ids for s in g], [s.text for s in g],
                                    [s.logprobs for s in g]))
    pos = step * (args.prompts - n_online)  # offline groups taken before this step
    while len(batch) < args.prompts:
        epoch, offset = divmod(pos, len(offline))
        order = np.random.default_rng([args.seed, 1234, epoch]).permutation(len(offline))
        take = min(args.prompts - len(batch), len(offline) - offset)
        batch.extend(offline[i] for i in order[offset:offset + take])
        pos += take
    return batch


def reference_samples(args, inputs: common.Inputs, run, engine) -> list[Group]:
    """mu = pi_ref (§8.2): n samples of --offline-prompts training prompts drawn ONCE (seeded, so a
    run killed while drawing them draws them again), kept in the run folder for --resume."""
    path = run.path(REFERENCE_SAMPLES)
    if not os.path.exists(path):
        idx = np.random.default_rng([args.seed, 99]).choice(
            len(inputs.pool), min(args.offline_prompts, len(inputs.pool)), replace=False)
        print(f"sampling {len(idx)} prompts x {args.n} from the reference into {path}", flush=True)
        engine.sync(inputs.ref_model)
        sc = common.SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, seed=args.seed)
        write_offline(path, [inputs.pool[i] for i in idx],
                      engine.generate([inputs.prompts[i] for i in idx], sc))
    rows = read_offline(path, inputs.task, args.n)  # read back: a resumed run sees the same tokens
    return offline_groups(rows, inputs.task, args.reward, inputs.tokenizer, inputs.style)


# ---- Inputs checked, one optimizer step, evaluation ----------------------------------------------
def load_inputs(args, parser) -> tuple[common.Inputs, list | None, common.Run]:
    """Flags and files checked (one line, exit 2, before the run folder is made), then loaded, with
    the offline groups of --offline-data or of the resumed run (None: pi_ref is to be sampled)."""
    n_online = online_groups(args)
    try:
        task = get_task(args.task)
        args.reward = common.check_reward(task, args.reward)
        if args.n < 2:
            raise ValueError(f"--n must be at least 2 for a leave-one-out baseline, got {args.n}")
        if args.beta == 0 and args.loss == "agro" and n_online > 0 and args.lambda_lr != 0:
            raise ValueError("on-policy AGRO divides by beta: give --beta > 0 or --lambda-lr 0")
        if args.lr_baseline == "var" and n_online > 0 and args.n < 3:
            raise ValueError("--lr-baseline var needs --n >= 3; use --lr-baseline none with n = 2")
        if args.offline_data and n_online == args.prompts:
            raise ValueError("--offline-data is unused when every group is on-policy")
        pool, held_out = common.task_problems(task, args)
        # read and checked before a model is loaded, or sft.py run to make one
        path, rows = args.offline_data or os.path.join(args.resume or "", REFERENCE_SAMPLES), None
        if n_online < args.prompts and (args.offline_data or args.resume and os.path.exists(path)):
            rows = read_offline(path, task, args.n)
        # no checkpoint: killed before its first one (the reference samples may be on disk)
        inputs = common.load_inputs("agro", args, task, pool, held_out,
                                    ("optimizer", "rng", "step"), required=False)
        offline = None if rows is None else offline_groups(rows, task, args.reward,
                                                           inputs.tokenizer, inputs.style)
        return inputs, offline, common.Run(args.out, vars(args), resume=bool(args.resume))
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))


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
    n_samples = len(batch) * args.n
    n_tokens = sum(len(c) for g in batch for c in g.completion_ids)
    loss_sum, gap, h_on, h_off, kls = 0.0, 0.0, [], [], []
    order = sorted(batch, key=lambda g: max(len(c) for c in g.completion_ids))  # similar lengths
    for start in range(0, len(order), args.micro_batch):
        mb = order[start:start + args.micro_batch]
        prompts = [g.prompt_ids for g in mb for _ in range(args.n)]
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
                diff = logprobs[j * args.n + k, :len(lp)].detach() - torch.tensor(lp, device=device)
                gap = max(gap, diff.abs().max().item())  # 0 if sampled from these very weights
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    common.check_finite(step + 1, "--lr too large, or --beta / --lambda-lr against the rewards' "
                        "scale", loss=loss_sum, grad_norm=grad_norm)
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
    if len(h_off):  # on reference samples, mean h = -KL(pi_ref || pi) (when mu = pi_ref)
        row["h_offline"] = h_off.mean().item()
    if kls:
        row["token_kl"] = torch.cat(kls).mean().item()
    return row


def evaluate(args, inputs: common.Inputs, engine) -> dict:
    """Held-out metrics per size (seeded) and KL(pi || pi_ref) = E_{y~pi} h(y) by Monte Carlo."""
    metrics = common.evaluate_sizes(engine, inputs.task, inputs.eval_sets, k=args.eval_k,
                                    max_new_tokens=args.max_new_tokens, reward_variant=args.reward)
    metrics["kl_to_ref"] = common.kl_to_ref(engine, inputs, args.seed,
                                            max_new_tokens=args.max_new_tokens, bf16=args.bf16)
    return metrics


def main(argv=None):
    started = time.monotonic()
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    inputs, offline, run = load_inputs(args, parser)
    model, tokenizer = inputs.model, inputs.tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step = common.restore(inputs.state, optimizer, run)
    engine = common.make_engine(args.engine, model, tokenizer, inputs.ckpt or args.model_path,
                                seed=args.seed)
    with common.StopOnInterrupt() as stop:
        if online_groups(args) < args.prompts and offline is None:
            offline = reference_samples(args, inputs, run, engine)  # mu = pi_ref, drawn once
        engine.sync(model)
        print(f"agro: {common.count_parameters(model) / 1e6:.2f}M parameters from "
              f"{args.model_path}, engine {engine.name}, loss {args.loss}, B={args.prompts} "
              f"({online_groups(args)} on-policy) n={args.n} beta={args.beta} "
              f"lambda_LR={args.lambda_lr}, run {run.dir}")
        if step == 0:
            run.log(0, evaluate(args, inputs, engine))
        bar = tqdm(total=args.steps, initial=step, desc=f"agro {args.loss}", dynamic_ncols=True)
        deadline = started + 60 * args.time_limit if args.time_limit else float("inf")
        snapshots = common.Snapshots(args.snapshots, started, run.dir)
        done = step  # optimizer steps taken
        for step in range(step, args.steps):
            snapshots.take(model, tokenizer, step)
            t0 = time.perf_counter()
            batch = sample_batch(args, inputs, engine, offline, step)  # fresh and offline groups
            t_gen = time.perf_counter() - t0
            row = agro_step(model, inputs.ref_model, optimizer, batch, args, step,
                            tokenizer.pad_token_id)
            engine.sync(model)  # the next on-policy groups come from exactly these weights
            done = step + 1
            row.update(time_generate=t_gen, time_step=time.perf_counter() - t0)
            last = done == args.steps or time.monotonic() >= deadline
            if done % args.eval_every == 0 or last:
                row.update(evaluate(args, inputs, engine))
                common.report(done, row)
            run.log(done, row)
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", acc=f"{row['accuracy']:.2f}")
            if done % args.save_every == 0 or last or stop.requested:
                common.save_state(run, model, tokenizer, optimizer, step=done)
            if stop.requested:
                bar.close()
                common.exit_interrupted("agro.py", run.dir, done)
            if last:
                break
        bar.close()
    return common.finish(run, model, tokenizer, engine, snapshots, done)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
