"""agro.py: Any-Generation Reward Optimization, one loss for on-policy and offline groups.

[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm",
       2025, arXiv:2503.19612. Names: its beta, h, b, v, lambda_lr, mu, pi; r the reward, r_pi
       (rpi) the regularised one; n completions per prompt, B prompts, N = B n; [N, L]: N
       sequences of L tokens; T the temperature
Eqs. 1-3  pi* = argmax E r - beta KL zeroes 1/2 Var[r_pi]  tests/test_agro.py
§3.1      r_pi = r - beta sg(h), h = log pi - log pi_ref   regularised_rewards (common), log_ratio
Eq. 4     weights r_pi,i - b_i, b_i leave-one-out mean     agro_offpolicy_weights, loo_baseline
Eqs. 5-6  w_i: Eq. 4's + lambda_LR x g_LR, baseline v_i    agro_onpolicy_weights
§8        -mean sg(w_i) log pi(y_i), groups of pi or mu    agro_loss, agro_step, sample_batch
Departures: lambda_LR (1 in the paper) defaults to beta/2: at 1 the tiny model collapses. On-
  policy weights are divided by beta, to the off-policy loss's scale.
  v_i defaults to "var", unbiased; the paper's variance-reduced v_i is biased (--lr-baseline
  paper). --loss klpg (§8's KL-PG, klpg_loss): RLOO with the sequence KL in the reward.
Run: python agro.py --task countdown [--mode offpolicy]   More: docs/PAPERS.md, section [AGRO].
"""
import argparse
import math
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task, problem_sets
from tasks.files import read_jsonl, write_jsonl
from tasks.scoring import score

REFERENCE_SAMPLES = "reference_samples.jsonl"  # in the run folder: mu = pi_ref, drawn once
# Each setting's default for the tiny model and for a pretrained one: a flag left at None takes it
# (common.fill_defaults); why: the flag's --help (max_new_tokens: 512 as in [TOPR] §4).
DEFAULTS = {"lr": (6e-5, 1e-5), "max_new_tokens": (64, 512)}  # flag: (tiny, a pretrained model)
# beta per sequence (docs/RESULTS-agro-spo.md): 0.05 beat 0.5 on-policy; 0.1 lost accuracy offline
BETA_ONPOLICY, BETA_OFFPOLICY = 0.05, 0.3
# Random streams [--seed, STREAM]: the draws are a pure function of the flags
# (on-policy: [seed, step])
REFERENCE_STREAM, OFFLINE_ORDER_STREAM, KL_STREAM = 99, 1234, 7
# kl_to_ref: 256 sequences; EVAL_SEED: every evaluation draws alike, so checkpoints compare fairly
KL_PROMPTS, KL_SAMPLES, EVAL_SEED = 64, 4, 0


# ---- Settings: AGRO's flags (those every script shares: common.add_common_flags) ----------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--mode", choices=["offpolicy", "onpolicy"], default="onpolicy",
        help="onpolicy: groups sampled from pi each step (Eqs. 5-6); offpolicy: offline (Eq. 4)")
    add("--loss", choices=["agro", "klpg"], default="agro", help="klpg: §8's KL-regularised PG")
    add("--beta", type=common.nonnegative_float, default=None, help="KL coefficient, per "
        f"sequence; None: {BETA_ONPOLICY} with on-policy groups, else {BETA_OFFPOLICY}")
    add("--lambda-lr", type=common.nonnegative_float, default=None,
        help="lambda_LR, the weight of g_LR (the paper's: 1; 0: RLOO); None: beta/2")
    add("--lr-baseline", choices=["var", "none", "paper"], default="var",
        help="v_i in g_LR: var, unbiased and centred (n >= 3); paper: biased")
    add("--online-fraction", type=common.fraction, default=None,
        help="share of a batch's groups sampled from pi; None: 1 with --mode onpolicy, else 0")
    add("--offline-data", default=None, metavar="FILE",
        help="offline groups, JSONL (read_offline); None: samples of pi_ref, drawn once")
    add("--offline-prompts", type=common.positive_int, default=2048,
        help="prompts that pi_ref samples for the offline groups")
    add("--steps", type=common.positive_int, default=125, help="optimizer steps: ~5 min on 2 cores")
    add("--prompts", type=common.positive_int, default=32, help="prompts per batch (B)")
    add("--group-size", type=common.positive_int, default=8,
        help="completions per prompt (n, >= 2)")
    add("--loss-norm", choices=["seq", "seq/len", "token"], default="seq",
        help="seq: sum over tokens, mean over sequences")
    add("--reward", default=None, help="reward variant; None: the task's first")
    add("--lr", type=common.positive_float, default=None,
        help="AdamW lr (tiny: rloo.py's; a pretrained model: on SmolLM2 on-policy 1e-5 gained "
        "more than 3e-6, one seed each: docs/REAL-MODEL.md)")
    add("--warmup", type=common.nonnegative_int, default=10, help="lr warm-up steps (rloo.py's)")
    add("--micro-batch", type=common.positive_int, default=8,
        help="groups per forward and backward pass (memory)")
    common.add_common_flags(parser, __file__, DEFAULTS, "start model and pi_ref")
    args = parser.parse_args(argv)
    # The defaults that depend on other flags (each flag's help says its rule)
    if args.online_fraction is None:
        args.online_fraction = float(args.mode == "onpolicy")
    if args.beta is None:
        args.beta = BETA_ONPOLICY if online_groups(args) > 0 else BETA_OFFPOLICY
    if args.lambda_lr is None and args.beta > 0:  # at beta 0 it stays None: nothing divides by 0
        args.lambda_lr = args.beta / 2  # the on-policy threshold below 0 (docs/DERIVATIONS.md)
    return parser, args


def online_groups(args) -> int:
    """On-policy groups per batch: round(f B), f = --online-fraction; the others are offline."""
    return round(args.online_fraction * args.prompts)


# ---- The estimators, pure functions of tensors: B prompts, n completions each, N = B n, L tokens
def log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor):
    """h(y) = log pi(y|x) - log pi_ref(y|x), a sum over the tokens.  [N, L] each -> [N]"""
    return ((logprobs - ref_logprobs) * mask).sum(-1)


# r_pi = r - beta sg(h), the regularised reward (§3.1), [B, n] each: defined once in common.py,
# where rloo.py's --beta takes it too
regularised_rewards = common.regularised_rewards


def loo_baseline(values: torch.Tensor) -> torch.Tensor:
    """b_i = 1/(n-1) sum_{j != i} values_j per group (Eq. 4; [CR] Eq. 2's baseline, rloo.py), the
    mean of the OTHER n-1; n >= 2 (else ValueError). [B, n]"""
    n = values.shape[-1]
    if n < 2:
        raise ValueError("a leave-one-out baseline needs n >= 2 completions per prompt")
    return (values.sum(-1, keepdim=True) - values) / (n - 1)


def agro_offpolicy_weights(rpi: torch.Tensor) -> torch.Tensor:
    """Off-policy AGRO weights r_pi,i - b_i on grad log pi(y_i) (Eq. 4).  rpi: [B, n] -> [B, n]
    Their mean, times grad log pi, is -(1/beta) grad 1/2 s^2(r_pi), ddof 1, with the gradient
    through h: the consistency loss (Eq. 3) on these samples (Lemma 3). All 0 at pi* (Theorem 1)."""
    return rpi - loo_baseline(rpi)


def agro_onpolicy_weights(rpi, beta: float, lambda_lr: float, lr_baseline: str = "var"):
    """On-policy AGRO weights w_i / beta (Eqs. 5-6).  rpi: [B, n] -> [B, n]
    w_i = beta (r_pi,i - b_i) - lambda_LR 1/2 [(r_pi,i - b_i)^2 - v_i]: Eq. 4's pathwise term, and
    g_LR because the samples come from pi itself. v_i: "none" 0, unbiased (Proposition 4) but each
    weight is then -(lambda_LR/2beta) n/(n-1) Var on average; "var" n/(n-1) x the ddof-1 variance
    of the other n-1 (n >= 3), unbiased and centred; "paper" the mean of the others' squared
    residuals (our reading of its variance-reduced estimate), centred, biased through b_j."""
    adv = agro_offpolicy_weights(rpi)  # r_pi,i - b_i  [B, n]
    n = rpi.shape[-1]
    if lr_baseline == "none":
        v = torch.zeros_like(rpi)
    elif lr_baseline == "var":
        if n < 3:
            raise ValueError("--lr-baseline var needs n >= 3 (the variance of the other n-1)")
        b = loo_baseline(rpi)  # b_i, the mean of the other n-1  [B, n]
        sq_others = (rpi ** 2).sum(-1, keepdim=True) - rpi ** 2  # sum_{j != i} r_pi,j^2
        v = n / (n - 1) * (sq_others - (n - 1) * b ** 2) / (n - 2)
    elif lr_baseline == "paper":
        v = loo_baseline(adv ** 2)
    else:
        raise ValueError(f"unknown lr_baseline {lr_baseline!r}")
    return adv - lambda_lr * 0.5 * (adv ** 2 - v) / beta


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, norm: str = "seq") -> torch.Tensor:
    """Per-token values [N, L] -> scalar. seq: sum over tokens, mean over sequences; seq/len: each
    sum divided by its own length; token: sum over all tokens divided by their count.
    common.weighted_logprob_loss (rloo.py, topr.py) is this reduction of w_i log pi; agro.py keeps
    its own for the KL term too, and because it multiplies w_i in before summing the tokens
    (rloo's and topr's sum first): the same loss, its last float bit may differ."""
    if norm == "token":
        return (values * mask).sum() / mask.sum()
    per_seq = (values * mask).sum(-1)  # [N]
    if norm == "seq/len":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif norm != "seq":  # a pure function called from elsewhere too: no silent default
        raise ValueError(f"unknown loss normalisation {norm!r}")
    return per_seq.mean()


def agro_loss(logprobs: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, norm: str = "seq"):
    """-mean_i sg(w_i) log pi(y_i): Eq. 4 with off-policy weights, Eqs. 5-6 with on-policy ones.
    logprobs: [N, L] log pi(y_t|x, y_<t) with gradient;  mask: [N, L], EOS counted;  weights: [N]"""
    return -reduce_tokens(weights.detach()[:, None] * logprobs, mask, norm)


def token_kl(logp_all: torch.Tensor, ref_logp_all: torch.Tensor, mask: torch.Tensor):
    """Exact KL(pi(.|x,y_<t) || pi_ref(.|x,y_<t)), a sum over the vocabulary, at every position.
    logp_all, ref_logp_all: [N, L, V] log-softmax;  mask: [N, L]  ->  [N, L], 0 on padding."""
    return (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1) * mask


def klpg_loss(logprobs, mask, rewards, kl, beta: float, norm: str = "seq", h=None, online=None):
    """§8's KL-regularised PG. Offline groups (§8.2): -1/(B n) sum_i (r_i - b^r_i) log pi(y_i) +
    beta/(B n) sum_i sum_t KL_t(y_i), KL differentiated (Fig. 1: it misses pi*). On-policy groups
    (§8.1): RLOO with the sequence KL in the reward, Eq. 4's weights (per-token is biased there).
    logprobs, mask, kl: [N, L] (kl: token_kl, with gradient; None if every group is on-policy);
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
    offline = (~online).repeat_interleave(rewards.shape[1]).to(kl.dtype)[:, None]  # [N, 1]
    return loss + beta * reduce_tokens(kl * offline, mask, norm)  # + beta sum_t KL_t(y_i)


# ---- Data: groups of n completions, sampled now from the policy or read from an offline file -----
class Group(NamedTuple):  # one prompt's n completions and what the step needs to know of them
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
    return Group(prompt_ids, ids, rewards, grades, sampler_logprobs, sampler_logprobs is not None)


def write_offline(path, problems, groups):
    """Offline groups as JSONL (task fields + completions + finished), written atomically."""
    write_jsonl(path, [{**problem, "completions": [s.text for s in group],
                        "finished": [s.finished for s in group]}
                       for problem, group in zip(problems, groups)])


def read_offline(path, task, n) -> list[tuple[dict, list[str], list[bool]]]:
    """(problem, n completions, n finished flags) per record of an offline JSONL file: the task's
    fields, "completions" and optionally "finished" (false: cut at the length limit, no EOS)."""
    rows = []
    for i, record in enumerate(read_jsonl(path, "file"), 1):
        try:
            problem = task.problem_from_row(record)
        except ValueError as e:
            raise ValueError(f"{path}: row {i}: {e}") from None
        texts, finished = record.get("completions"), record.get("finished", [True] * n)
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
    """mu = pi_ref (§8.2): --group-size completions (T = 1) of --offline-prompts prompts, seeded"""
    chosen = np.random.default_rng([args.seed, REFERENCE_STREAM]).choice(
        len(pool), min(args.offline_prompts, len(pool)), replace=False)
    print(f"sampling {len(chosen)} prompts x {args.group_size} from pi_ref into {path}", flush=True)
    engine.sync(ref_model)  # copies pi_ref's weights into the engine (main syncs pi's after)
    config = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                                   seed=args.seed)
    write_offline(path, [pool[i] for i in chosen],
                  engine.generate([prompts[i] for i in chosen], config))


def offline_groups(rows, task, reward, tokenizer, style) -> list[Group]:
    """Offline rows re-tokenised (EOS appended unless "finished" says the completion was cut)."""
    eos = [tokenizer.eos_token_id]
    prompts = common.encode_prompts(task, [problem for problem, _, _ in rows], tokenizer, style)
    return [make_group(task, reward, problem, prompt_ids,
                       [tokenizer(t, add_special_tokens=False)["input_ids"] + (eos if fin else [])
                        for t, fin in zip(texts, finished)], texts)
            for (problem, texts, finished), prompt_ids in zip(rows, prompts)]


def sample_batch(engine, task, pool, prompts, offline, step, args) -> list[Group]:
    """round(f B) groups sampled now from pi (temperature 1, no top-p), then offline ones: epochs
    of seeded permutations of the offline set, a pure function of step (so --resume is exact)."""
    batch, n_online = [], online_groups(args)
    if n_online:
        chosen = np.random.default_rng([args.seed, step]).choice(len(pool), n_online, replace=False)
        config = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens)
        for i, samples in zip(chosen, engine.generate([prompts[i] for i in chosen], config)):
            batch.append(make_group(task, args.reward, pool[i], prompts[i],
                                    [s.ids for s in samples], [s.text for s in samples],
                                    sampler_logprobs=[s.logprobs for s in samples]))
    taken = step * (args.prompts - n_online)  # offline groups taken before this step
    while len(batch) < args.prompts:
        epoch, offset = divmod(taken, len(offline))
        order = np.random.default_rng([args.seed, OFFLINE_ORDER_STREAM, epoch]).permutation(
            len(offline))
        count = min(args.prompts - len(batch), len(offline) - offset)
        batch.extend(offline[i] for i in order[offset:offset + count])
        taken += count
    return batch


# ---- One optimizer step --------------------------------------------------------------------------
def policy_and_reference(model, ref_model, prompts, completions, pad_id, with_kl: bool, bf16=False):
    """log pi per token (with gradient), log pi_ref per token, the mask, and (with_kl) the exact
    per-token KL(pi || pi_ref) along each completion, with gradient: [N, L] each (else kl None)."""
    out = common.completion_logprobs(model, prompts, completions, pad_id, full=with_kl, bf16=bf16)
    with torch.no_grad():
        ref = common.completion_logprobs(ref_model, prompts, completions, pad_id, full=with_kl,
                                         bf16=bf16)
    return out[0], ref[0], out[1], token_kl(out[2], ref[2], out[1]) if with_kl else None


def agro_step(model, ref_model, optimizer, batch: list[Group], args, step: int, pad_id: int):
    """One optimizer step of --loss on a batch, `step` steps taken before it; returns metrics."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(len(c) for g in batch for c in g.completion_ids)
    loss_sum, seen = 0.0, []  # seen: what step_metrics reports, a tuple a micro-batch
    by_length = sorted(batch, key=lambda g: max(len(c) for c in g.completion_ids))  # less padding
    for first in range(0, len(by_length), args.micro_batch):
        groups = by_length[first:first + args.micro_batch]
        prompts = [g.prompt_ids for g in groups for _ in range(args.group_size)]
        completions = [c for g in groups for c in g.completion_ids]
        rewards = torch.tensor([g.rewards for g in groups], device=device)  # [b, n]
        online = torch.tensor([g.online for g in groups], device=device)  # [b]
        with_kl = args.loss == "klpg" and not online.all()  # per-token KL on offline groups only
        logprobs, ref_logprobs, mask, kl = policy_and_reference(
            model, ref_model, prompts, completions, pad_id, with_kl=with_kl, bf16=args.bf16)
        h = log_ratio(logprobs.detach(), ref_logprobs, mask).view_as(rewards)  # [b, n]
        if args.loss == "klpg":
            loss = klpg_loss(logprobs, mask, rewards, kl, args.beta, args.loss_norm, h, online)
        else:
            rpi = regularised_rewards(rewards, h, args.beta)  # §3.1
            w = agro_offpolicy_weights(rpi)  # Eq. 4: offline groups (and the pathwise term)
            if online.any() and args.lambda_lr != 0:  # Eqs. 5-6 on the on-policy groups
                on = agro_onpolicy_weights(rpi, args.beta, args.lambda_lr, args.lr_baseline)
                w = torch.where(online[:, None], on, w)
            loss = agro_loss(logprobs, mask, w.reshape(-1), norm=args.loss_norm)
        share = (mask.sum().item() / n_tokens if args.loss_norm == "token"  # of the batch's mean
                 else len(completions) / (len(batch) * args.group_size))
        loss = loss * share
        loss.backward()
        loss_sum += loss.item()
        seen.append((groups, logprobs.detach(), h, online, kl))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    metrics = step_metrics(batch, seen, loss_sum, grad_norm, n_tokens, args.group_size, step)
    for param_group in optimizer.param_groups:  # linear warm-up to --lr over --warmup steps
        param_group["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
    optimizer.step()
    model.eval()
    return metrics


def step_metrics(batch, seen, loss: float, grad_norm: float, n_tokens: int, n: int, step: int):
    """agro_step's metrics, before the weights change (a nan or inf loss or gradient: exit 1): mean
    h by kind of group, token KL, logprob_gap = max |log pi - engine's log-prob| (0: pi sampled)"""
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        tqdm.write(f"error: step {step + 1}: non-finite loss={loss} or grad_norm={grad_norm}; "
                   "weights not updated, the last checkpoint is the last good state. Likely cause: "
                   "too high --lr, --beta or --lambda-lr", file=sys.stderr)
        raise SystemExit(1)
    grades = [grade for g in batch for grade in g.grades]
    metrics = {"loss": loss, "reward": float(np.mean([g.rewards for g in batch])),
               "accuracy": float(np.mean([grade == "correct" for grade in grades])),
               "format_rate": float(np.mean([grade != "no_answer" for grade in grades])),
               "length": n_tokens / len(grades), "grad_norm": grad_norm, "samples": len(grades)}
    gap = 0.0
    for groups, logprobs, *_ in seen:
        for j, group in enumerate(groups):
            for k, engine_logprobs in enumerate(group.sampler_logprobs or []):
                diff = (logprobs[j * n + k, :len(engine_logprobs)]
                        - torch.tensor(engine_logprobs, device=logprobs.device))
                gap = max(gap, diff.abs().max().item())
    h_on = torch.cat([h[online].reshape(-1) for _, _, h, online, _ in seen])
    h_off = torch.cat([h[~online].reshape(-1) for _, _, h, online, _ in seen])
    if len(h_on):  # on fresh policy samples, mean h estimates KL(pi || pi_ref)
        on_grades = [grade for g in batch if g.online for grade in g.grades]
        metrics.update(kl=h_on.mean().item(), logprob_gap=gap,
                       online_accuracy=float(np.mean([grade == "correct" for grade in on_grades])))
    if len(h_off):  # mean h on the offline texts re-tokenised, not on mu's own tokens: near
        metrics["h_offline_retokenised"] = h_off.mean().item()  # -KL(pi_ref || pi) if mu = pi_ref
    if kls := [kl.detach().sum(-1) for _, _, _, _, kl in seen if kl is not None]:
        metrics["token_kl"] = torch.cat(kls).mean().item()
    return metrics


# ---- Evaluation ----------------------------------------------------------------------------------
def evaluate(engine, model, ref_model, task, eval_sets, train_prompts, args) -> dict:
    """Held-out metrics per size (tasks/scoring.py): greedy and --eval-k samples at T = 1; then
    kl_to_ref = E_pi h = KL(pi || pi_ref) by Monte Carlo: KL_SAMPLES per prompt, KL_PROMPTS
    prompts"""
    metrics = {}
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    t_1 = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens, seed=EVAL_SEED)
    for size, (problems, prompts) in eval_sets.items():
        for decoding, config in [("greedy", greedy), ("sampled", t_1)]:
            metrics.update(score(task, problems, engine.generate(prompts, config), mode=decoding,
                                 reward_variant=args.reward, prefix=f"eval{size}/"))
    chosen = np.random.default_rng([args.seed, KL_STREAM]).choice(
        len(train_prompts), min(KL_PROMPTS, len(train_prompts)), replace=False)
    config = common.SamplingConfig(n=KL_SAMPLES, max_new_tokens=args.max_new_tokens, seed=EVAL_SEED)
    samples = [s for g in engine.generate([train_prompts[i] for i in chosen], config) for s in g]
    with torch.no_grad():
        logprobs, ref_logprobs, mask, _ = policy_and_reference(
            model, ref_model, [s.prompt_ids for s in samples], [s.ids for s in samples],
            engine.tokenizer.pad_token_id, with_kl=False, bf16=args.bf16)
    metrics["kl_to_ref"] = log_ratio(logprobs, ref_logprobs, mask).mean().item()
    return metrics


# ---- main(): every input checked before anything long starts, then the loop ---------------------
def main(argv=None):
    parser, args = parse_args(argv)
    # --resume, the run folder and its checkpoint (common.Run)
    run = common.Run(parser, args, __file__, keys={"model", "optimizer"})
    common.setup(args.seed, args.threads)
    n_online = online_groups(args)
    try:  # bad input: one line and exit 2 (saving and resuming: common.Run)
        task = get_task(args.task)
        args.reward = args.reward or task.REWARD_VARIANTS[0]
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}, not in {task.REWARD_VARIANTS}")
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
            raise ValueError(f"{n_online} on-policy groups per batch > {len(pool)} training "
                             "problems")
        offline_rows = (read_offline(args.offline_data, task, args.group_size)
                        if args.offline_data else None)  # before a model loads: bad files fail fast
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # --model None: the newest sft.py run of --task, and sft.py runs first if there is none
        model, tokenizer = common.load_model(args.model, device=device, task=args.task,
                                             run_dir=args.out, grad_checkpoint=args.grad_checkpoint)
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_defaults(args, DEFAULTS, model)  # flags left at None
        ref_model = common.load_model(args.model_path, device=device)[0].requires_grad_(False)
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    style = common.prompt_style(model, tokenizer)
    prompts = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {size: (problems, common.encode_prompts(task, problems, tokenizer, style))
                 for size, problems in held_out.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    start = run.begin(model=model, optimizer=optimizer)  # 0, or the checkpoint's step
    engine = common.make_engine(args.engine, model, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    if n_online < args.prompts and offline_rows is None:  # mu = pi_ref (§8.2), drawn once
        samples_path = os.path.join(args.out, REFERENCE_SAMPLES)
        if not os.path.exists(samples_path):  # a resumed run reads the ones drawn before
            sample_reference(engine, ref_model, pool, prompts, args, samples_path)
        offline_rows = read_offline(samples_path, task, args.group_size)  # the tokens, re-read
    offline = offline_groups(offline_rows or [], task, args.reward, tokenizer, style)
    engine.sync(model)  # copies the policy's weights (resumed, if so) into the generation engine
    print(f"agro: {common.count_parameters(model) / 1e6:.2f}M parameters from {args.model_path}, "
          f"engine {engine.name}, loss {args.loss}, B={args.prompts} ({n_online} on-policy) "
          f"n={args.group_size} beta={args.beta} lambda_LR={args.lambda_lr} run {args.out}")
    if start == 0:
        run.log(0, evaluate(engine, model, ref_model, task, eval_sets, prompts, args))
    for step in tqdm(range(start, args.steps), "agro", total=args.steps, initial=start,
                     leave=False):
        t0 = time.perf_counter()
        batch = sample_batch(engine, task, pool, prompts, offline, step, args)
        t_generate = time.perf_counter() - t0
        metrics = agro_step(model, ref_model, optimizer, batch, args, step, tokenizer.pad_token_id)
        engine.sync(model)  # the new weights into the engine: the next groups come from them
        metrics.update(time_generate=t_generate, time_step=time.perf_counter() - t0)
        # the metrics row; an evaluation and a checkpoint where due; the end, or --time-limit
        if run.end_step(step + 1, metrics, last=step + 1 == args.steps, evaluate=lambda: evaluate(
                engine, model, ref_model, task, eval_sets, prompts, args)):
            break
    engine.close()
    return run.finish(model, tokenizer)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
