"""spo.py: Soft Policy Optimization (SPO), the cumulative Q-parameterization, online + offline data.

[SPO] Cohen, Zhang, Zheng, Tang, Munos, Synnaeve, "Soft Policy Optimization: Online Off-Policy RL
for Sequence Models", 2025, arXiv:2503.05453.

The objective is E_pi r - beta KL(pi || pi_0) ([SPO] Eq. 1), pi_0 the frozen start model, with a
terminal reward r = 0 for a correct answer and -1 otherwise. The policy IS the Q-function (§2.4):

    A_t = beta * (log pi_theta(a_t|x,a<t) - log pi_0(a_t|x,a<t))        (Eq. 11)
    Q_t = Q0_hat(x) + sum_{t'<=t} A_t'                                   (Eq. 12, cumulative Q)
    Q_T = Q0_hat(x) + beta * (log pi_theta(y|x) - log pi_0(y|x)) ~ r     (Eq. 13)

Whatever theta is, Q_t = beta log sum_v pi_0(v) exp(Q_{t+1}(v)/beta) (Theorem 2.2, soft Bellman
consistency), so only the reward needs a loss (§3.1.2): regress Q_T onto r (`--objective terminal`,
squared or cross-entropy loss, §3.1.1), every Q_t onto reverse-Q targets (`nonterminal`), or sum_t
A_t onto r - Q0_hat under a sigmoid (`advantage`). The fixed point is pi* = pi_0 exp(r/beta) / Z
(Theorem 2.1) whatever generated the trajectories: no behaviour log-probs, no importance weights.
Q0_hat(x) = beta log(S0 + (1 - S0) e^{-1/beta}) comes from --q0-samples samples of pi_0 at
temperature 1 (§3.1.3).

beta is the paper's 1/ln 1e5: Q0_hat then sits near an easy prompt's best reward and the first
updates mostly push sampled failures down; a larger beta makes the first update a centred REINFORCE
step (tests/test_spo.py, test_large_beta_makes_the_squared_loss_a_centred_reinforce_update) but
regularises more. The paper's settings (800 samples want a GPU):
      python spo.py --temperature 0.1,0.8 --top-p 0.95 --model-update-interval 10 --q0-samples 800
      python scripts/spo_offline_data.py --model runs/sft-.../final --out runs/spo-offline-sft.jsonl
      python spo.py ... --offline-data runs/spo-offline-sft.jsonl --online-fraction 0.5
"""
import argparse
import copy
import json
import math
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import common
from tasks import get_task, problem_sets, problems_source
from tasks.files import read_jsonl, write_jsonl
from tasks.scoring import score

BETA = 1 / math.log(1e5)  # the paper's beta: a failure (r = -1) is worth a likelihood ratio of 1e-5


def temperature_range(text: str) -> tuple[float, float]:
    """argparse type: "lo,hi" with 0 < lo <= hi, both finite."""
    try:
        lo, hi = (float(part) for part in text.split(","))
    except ValueError:  # not two numbers
        lo = hi = math.nan
    if not 0 < lo <= hi < math.inf:
        raise argparse.ArgumentTypeError(f"expected lo,hi with 0 < lo <= hi (finite), got {text!r}")
    return lo, hi


# Flags left at None: (the tiny model's value, a pretrained model's), sources in their --help.
MODEL_DEFAULTS = {"lr": (6e-5, 1e-5), "max_new_tokens": (64, 512)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--beta", type=common.positive_float, default=BETA, help="KL strength (paper: 1/ln 1e5)")
    add("--objective", choices=["terminal", "nonterminal", "advantage"], default="terminal",
        help="regressed onto R (§3.1.2)")
    add("--loss", choices=["sq", "ce"], default="sq",
        help="sq (best in the paper's ablation) or ce (its main runs); unused by advantage")
    add("--eps", type=common.positive_float, default=1e-3,
        help="ce clips Q/beta to <= -eps in the forward pass (paper: 'close to 0')")
    add("--train-size", type=common.positive_int, default=256, help="training problems a size; "
        "fewer than the other scripts' as Q0_hat is estimated for each before training (§3.1.3)")
    add("--problems", type=problems_source, default=None, help="problems: JSONL, `hub`, a hub id")
    add("--sizes", type=common.int_list, default=None, help="sizes trained on; None: the task's")
    add("--q0-samples", type=common.positive_int, default=64,
        help="samples of pi_0 (T = 1) a training problem for Q0_hat (paper: 800; 64 for CPU time)")
    add("--q0-chunk", type=common.positive_int, default=32, help="problems a Q0 cache update")
    add("--q0-cache", default=None, metavar="FILE", help="another run's q0.jsonl to reuse")
    add("--batch-size", type=common.positive_int, default=256,
        help="sequences (a prompt and its completion) an optimizer step")
    add("--group-size", type=common.positive_int, default=8, help="online samples a prompt")
    add("--online-fraction", type=common.fraction, default=1.0, help="online share (paper: 0.5)")
    add("--offline-data", default=None, metavar="FILE", help="offline trajectories (read_offline)")
    add("--temperature", type=temperature_range, default=(1.0, 1.0), metavar="LO,HI",
        help="online sampling temperature ~ U(lo, hi), one draw per step (paper: 0.1,0.8)")
    add("--top-p", type=common.positive_float, default=1.0, help="nucleus sampling (paper: 0.95)")
    add("--max-new-tokens", type=common.positive_int, default=None, help="tokens a completion; "
        "None: 64 for tiny, 512 for a pretrained model ([TOPR] §4)")
    add("--model-update-interval", type=common.positive_int, default=1,
        help="refresh the sampler's weights every N steps (paper: 10; 1 = on-policy)")
    add("--steps", type=common.positive_int, default=125, help="optimizer steps: ~5 min on 2 cores")
    add("--lr", type=common.positive_float, default=None, help="AdamW lr, constant after "
        "warm-up; None: 6e-5 for tiny (larger rates collapsed it), 1e-5 for a pretrained model "
        "(rloo.py's; [SPO]'s 6e-8 is for 8B over 100,000 steps)")
    add("--warmup", type=common.nonnegative_int, default=10, help="warm-up steps (paper: 200)")
    add("--micro-batch", type=common.positive_int, default=64, help="sequences a pass (memory)")
    add("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    add("--bf16", action="store_true", help="bf16 autocast (weights, AdamW, log-softmax fp32)")
    add("--grad-checkpoint", action="store_true", help="recompute activations in backward")
    add("--task", default="countdown", help="task module in tasks/")
    add("--model", default=None, help="start model pi_0: a folder, a hub id, `tiny` (built in, "
        "untrained), `smollm2` (SmolLM2-135M-Instruct, pretrained) or `sft` (the newest sft.py run "
        "of --task); None: that run, made first by sft.py if none")
    add("--engine", default="auto", choices=["auto", "kv", "hf", "vllm"],
        help="generation engine; auto: vLLM, else hf on a GPU, kv on a CPU")
    add("--eval-sizes", type=common.int_list, default=None, help="held-out sizes; None: the task's")
    add("--eval-size", type=common.positive_int, default=200, help="held-out problems a size")
    add("--eval-k", type=common.positive_int, default=8, help="held-out samples a problem, T = 1")
    add("--eval-every", type=common.positive_int, default=75, help="evaluate every N steps")
    add("--out", default=None, help="run folder; None: runs/spo-TASK-TIME")
    add("--save-every", type=common.positive_int, default=50, help="checkpoint every N steps")
    add("--resume", default=None, metavar="RUN", help="continue the run in this folder")
    add("--time-limit", type=common.positive_float, default=None, metavar="MIN",
        help="stop MIN minutes after the start (evaluate, save)")
    add("--seed", type=common.nonnegative_int, default=0, help="seeds problems, batches, samples")
    add("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    return p, p.parse_args(argv)


# ---- The Q-parameterization and the losses: pure functions of tensors ----------------------------
def q0_from_successes(successes: torch.Tensor, samples: torch.Tensor, beta: float) -> torch.Tensor:
    """Q0_hat = beta * log(S0 + (1 - S0) * exp(-1/beta)), S0 = successes/samples (§3.1.3).

    successes, samples: [P] counts. The soft value beta log E_{pi_0} exp(r/beta) of a prompt for r
    in {0, -1}; it lies in [-1, 0]. Returns [P] float64.
    """
    s0 = successes.double() / samples.double()
    return beta * torch.log(s0 + (1 - s0) * math.exp(-1 / beta))


def cumulative_q(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                 q0: torch.Tensor, beta: float):
    """The cumulative Q-parameterization, Eqs. 11-12.

    logprobs:     [N, T] log pi_theta(a_t | x, a<t) of the tokens, with gradient; 0 on pads
    ref_logprobs: [N, T] log pi_0 of the same tokens (detached here)
    mask:         [N, T] 1 on completion tokens, EOS included
    q0:           [N]    Q0_hat of each trajectory's prompt
    Returns Q [N, T] (Q_t after token t; on padding it stays at Q_T) and Q_T [N]. The sum runs in
    fp32 and is never divided by the length: Q_T is a log-likelihood ratio, not an average.
    """
    adv = beta * (logprobs.float() - ref_logprobs.float().detach()) * mask  # [N, T] A_t (Eq. 11)
    q = q0.float()[:, None] + torch.cumsum(adv, dim=-1)                    # [N, T] Q_t (Eq. 12)
    return q, q[:, -1]  # padding adds 0: the last column is Q_T (an empty completion gives Q0_hat)


def log1mexp(u: torch.Tensor) -> torch.Tensor:
    """log(1 - e^u) for u < 0, elementwise, stable at both ends (Maechler 2012)."""
    return torch.where(u > -math.log(2), torch.log(-torch.expm1(u)), torch.log1p(-torch.exp(u)))


def squared_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(y_hat - y)^2, elementwise (§3.1.1)."""
    return (pred - target) ** 2


def ce_loss(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Binary cross-entropy between log-probabilities, clipped as in §3.1.1, elementwise.

    pred = y_hat and target = y are log-probabilities (in SPO, Q/beta), equal shapes; x = e^y:
        L = x * relu(-y_hat) - (1 - x) * log(1 - e^{y_hat_c})  - H(x)
    * y is clipped to <= 0; y_hat_c = min(y_hat, -eps) in the forward pass with a straight-through
      gradient (the backward pass ignores the clip), so log(1 - e^y_hat_c) is always finite;
    * the positive term uses relu(-y_hat) rather than -y_hat: nothing pushes y_hat above 0;
    * H(x) = -x log x - (1-x) log(1-x), the entropy of the target, is a constant (no gradient)
      subtracted so that the loss is the binary KL divergence: 0 exactly at y_hat = y, positive
      elsewhere (for y_hat <= 0; with x = 1 every y_hat >= 0 is a minimum, by the relu). It changes
      no gradient; it makes the loss's value readable as a distance (docs/DERIVATIONS.md).
    """
    y = target.clamp(max=0.0)
    x = torch.exp(y)
    # straight-through clip: the forward value is exactly min(y_hat, -eps), the gradient y_hat's
    # (clamp + (y_hat - y_hat) keeps the value exact: y_hat + (clamp - y_hat) loses -eps at 1e6)
    pred_c = pred.clamp(max=-eps).detach() + (pred - pred.detach())
    entropy = -(x * y + torch.special.xlogy(1 - x, -torch.expm1(y)))
    return x * F.relu(-pred) - (1 - x) * log1mexp(pred_c) - entropy


def binary_kl_with_logits(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """BCEWithLogits(logits, target) - H(target), elementwise: 0 exactly at sigmoid(logits) =
    target. logits, target: equal shapes; target in [0, 1]."""
    entropy = -(torch.special.xlogy(target, target) + torch.special.xlogy(1 - target, 1 - target))
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") - entropy


def spo_loss(q: torch.Tensor, q_t: torch.Tensor, mask: torch.Tensor, q0: torch.Tensor,
             r: torch.Tensor, beta: float, objective: str = "terminal", loss: str = "sq",
             eps: float = 1e-3) -> torch.Tensor:
    """The SPO objectives of §3.1.2, mean over trajectories (no length normalisation); a scalar.

    q [N, T], q_t [N] from cumulative_q; mask [N, T]; q0 [N] Q0_hat; r [N] rewards in {0, -1}.
    terminal:    L(Q_T, r)
    nonterminal: sum_{t=1..T} L(Q_t, R_t), reverse-Q targets R_t = sg(r - sum_{t'>t} A_t')
                 = sg(r - (Q_T - Q_t)); with the squared loss every residual Q_t - R_t equals
                 Q_T - r, but term t's gradient reaches only A_1..A_t: early tokens get larger ones
    advantage:   binary KL(sigmoid(r - Q0) || sigmoid(sum_t A_t)), the sigmoid-warped advantage
                 regression sum_t A_t = Q_T - Q0 ~ r - Q0 (the Q scale as in the paper, no 1/beta);
                 unwarped, it would equal the terminal squared loss, so `loss` is ignored here
    L: sq (Q - r)^2, or ce on log-probabilities Q/beta and r/beta (ce_loss).
    """
    q0, r = q0.to(q_t), r.to(q_t)

    def regress(pred, target):
        if loss == "sq":
            return squared_loss(pred, target)
        return ce_loss(pred / beta, target / beta, eps)

    if objective == "terminal":
        per_traj = regress(q_t, r)                                   # [N]
    elif objective == "nonterminal":
        targets = (r[:, None] - (q_t[:, None] - q)).detach()         # [N, T] R_t
        per_traj = (regress(q, targets) * mask).sum(-1)              # [N]
    elif objective == "advantage":
        per_traj = binary_kl_with_logits(q_t - q0, torch.sigmoid(r - q0))  # [N]
    else:
        raise ValueError(f"unknown SPO objective {objective!r}")
    if loss not in ("sq", "ce"):
        raise ValueError(f"unknown loss {loss!r}")
    return per_traj.mean()


# ---- Data: training problems, Q0_hat, offline trajectories, batches ------------------------------
class Trajectory(NamedTuple):
    prompt: list[int]  # prompt token ids
    ids: list[int]     # completion token ids, EOS included when it ended
    reward: float      # r: 0 (correct) or -1
    problem: int       # index in the training pool (its Q0_hat)
    online: bool       # sampled this step (False: a row of --offline-data)


def spo_reward(task, problem: dict, text: str) -> float:
    """r = 0 for a fully correct answer, -1 otherwise: the binary reward of Q0_hat (§3.1.3)."""
    return 0.0 if task.is_correct(problem, text) else -1.0


def check_args(args, parser) -> tuple:
    """The task, training pool (with the offline rows' problems), held-out sets and offline rows,
    checked before a model is loaded (bad input: one line, exit 2)."""
    try:
        task = get_task(args.task)
        if args.top_p > 1:
            raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
        if args.online_fraction < 1.0 and args.offline_data is None:
            raise ValueError("--online-fraction below 1 needs --offline-data FILE")
        offline = read_offline(args.offline_data, task) if args.offline_data is not None else []
        if args.q0_cache is not None:  # checked here, read by q0_hat
            if not os.path.isfile(args.q0_cache):
                raise ValueError(f"no such Q0 cache: {args.q0_cache}")
            ref_path = common.resolve_model_path(args.model, task=args.task)
            read_q0_cache(args.q0_cache, q0_made_with(args, ref_path))
        pool, held_out = problem_sets(task, sizes=args.sizes, train_size=args.train_size,
                                      eval_sizes=args.eval_sizes, eval_size=args.eval_size,
                                      seed=args.seed, source=args.problems)
        keys = {task.problem_key(p) for p in pool}
        for row in offline:  # offline problems join the pool (each needs its Q0_hat)
            if task.problem_key(row["problem"]) not in keys:
                keys.add(task.problem_key(row["problem"]))
                pool.append(row["problem"])
        return task, pool, held_out, offline
    except ValueError as e:  # UsageError is one
        parser.error(str(e))


def q0_made_with(args, ref_path: str) -> dict:
    """What a Q0 estimate depends on: a cache row made otherwise is never reused."""
    model = os.path.realpath(ref_path) if os.path.exists(ref_path) else ref_path
    return {"model": model, "task": args.task, "max_new_tokens": args.max_new_tokens,
            "samples": args.q0_samples}


def read_q0_cache(path: str, made_with: dict) -> dict:
    """{problem key: row} of a q0.jsonl file; ValueError naming the line of a bad or foreign row."""
    table = {}
    for n, row in enumerate(read_jsonl(path, "Q0 cache"), 1):
        wins = row.get("successes")
        if not isinstance(row.get("key"), str) or not isinstance(wins, int) or \
                not 0 <= wins <= made_with["samples"]:
            raise ValueError(f"{path}:{n}: expected a Q0 row with 'key' and 'successes' in "
                             f"[0, {made_with['samples']}]")
        other = {k: row.get(k) for k in made_with if row.get(k) != made_with[k]}
        if other:
            raise ValueError(f"{path}:{n}: made with {other}, this run has "
                             f"{ {k: made_with[k] for k in other} }: not reused")
        table[row["key"]] = row
    return table


def q0_hat(engine, task, pool, prompts, ref_model, args) -> torch.Tensor:
    """Q0_hat [P] of the pool (§3.1.3): --q0-samples of pi_0 at T = 1 for each problem not in
    --q0-cache or RUN/q0.jsonl (rewritten after each chunk, whose seed is its own)."""
    cache_file = os.path.join(args.out, "q0.jsonl")
    made_with = q0_made_with(args, args.model_path)
    table = read_q0_cache(args.q0_cache, made_with) if args.q0_cache is not None else {}
    if os.path.exists(cache_file):  # this run's own, from before it was stopped
        table.update(read_q0_cache(cache_file, made_with))
    engine.sync(ref_model)  # sample pi_0 itself
    keys = [task.problem_key(p) for p in pool]
    chunks = range(0, len(pool), args.q0_chunk)
    for j, start in enumerate(tqdm(chunks, desc="Q0 estimate", dynamic_ncols=True)):
        todo = [i for i in range(start, min(start + args.q0_chunk, len(pool)))
                if keys[i] not in table]
        if not todo:
            continue
        sc = common.SamplingConfig(n=args.q0_samples, max_new_tokens=args.max_new_tokens,
                                   temperature=1.0, seed=args.seed * 1_000_003 + j)
        for i, group in zip(todo, engine.generate([prompts[i] for i in todo], sc)):
            wins = sum(task.is_correct(pool[i], s.text) for s in group)
            table[keys[i]] = {"key": keys[i], "successes": wins, **made_with}
        write_jsonl(cache_file, list(table.values()))  # atomically: a kill keeps the old
    write_jsonl(cache_file, list(table.values()))  # whole, also when --q0-cache held every one
    counts = torch.tensor([table[key]["successes"] for key in keys])
    return q0_from_successes(counts, torch.full_like(counts, args.q0_samples), args.beta).float()


def read_offline(path: str, task) -> list[dict]:
    """Offline trajectories: JSON lines with the task's problem fields, "completion" and "finished"
    (default true). Rewards are scored from the text, never read from the file."""
    rows = []
    for n, row in enumerate(read_jsonl(path, "offline data file"), 1):
        try:
            problem = task.problem_from_row(row)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}") from None
        finished = row.get("finished", True)
        if not isinstance(row.get("completion"), str) or not isinstance(finished, bool):
            raise ValueError(f"{path}:{n}: expected 'completion' (a string) and optionally "
                             "'finished' (true or false)")
        rows.append({"problem": problem, "completion": row["completion"], "finished": finished})
    if not rows:
        raise ValueError(f"offline data file {path} holds no trajectories")
    return rows


def fit_offline(rows: list[dict], task, pool, prompts, tokenizer, max_new_tokens: int):
    """Offline rows as the sampler would have made them with --max-new-tokens M: the first M tokens,
    EOS appended if the row finished and EOS fits within M, r scored on the kept text (a solution
    cut short fails, as a sample would); a row that stopped unfinished before M (a smaller budget)
    is dropped. Returns (the kept rows as Trajectories, rows cut, rows dropped)."""
    index = {task.problem_key(p): i for i, p in enumerate(pool)}
    kept, cut, dropped = [], 0, 0
    for row in rows:
        ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        if not row["finished"] and len(ids) < max_new_tokens:
            dropped += 1
            continue
        fits = row["finished"] and len(ids) < max_new_tokens
        cut += not fits and len(ids) + row["finished"] > max_new_tokens
        ids = ids if fits else ids[:max_new_tokens]
        i = index[task.problem_key(row["problem"])]
        r = spo_reward(task, pool[i], tokenizer.decode(ids, skip_special_tokens=True))
        ids = ids + [tokenizer.eos_token_id] if fits else ids
        kept.append(Trajectory(prompts[i], ids, r, i, False))
    return kept, cut, dropped


def draw_batch(engine, task, pool, prompts, offline: list[Trajectory], step: int, args):
    """This step's trajectories and temperature ~ U(lo, hi), seeded by (seed, step): the sampler's
    for round(online_fraction * batch_size / group_size) prompts, then random offline rows."""
    rng = np.random.default_rng([args.seed, step])
    n_prompts = min(len(pool), round(args.online_fraction * args.batch_size / args.group_size))
    temperature = float(rng.uniform(*args.temperature))
    batch = []
    if n_prompts:
        idx = rng.choice(len(pool), n_prompts, replace=False)
        sc = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                                   temperature=temperature, top_p=args.top_p)
        for i, group in zip(idx, engine.generate([prompts[i] for i in idx], sc)):
            batch += [Trajectory(prompts[i], s.ids, spo_reward(task, pool[i], s.text), int(i), True)
                      for s in group]
    if offline:
        for j in rng.choice(len(offline), max(0, args.batch_size - len(batch)), replace=True):
            batch.append(offline[j])
    return batch, temperature


# ---- One optimizer step, and evaluation ----------------------------------------------------------
def spo_step(model, ref_model, optimizer, schedule, batch: list[Trajectory], q0_all: torch.Tensor,
             args, step: int, pad_id: int) -> dict:
    """One optimizer step on the SPO loss of `batch` (Eqs. 11-13, §3.1.2), micro-batched; a loss or
    gradient norm that is not finite stops the run before the weights change."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum, q_ts, log_ratios = 0.0, [], []
    for start in range(0, len(batch), args.micro_batch):
        mb = batch[start:start + args.micro_batch]
        prompts, completions = [t.prompt for t in mb], [t.ids for t in mb]
        logprobs, mask = common.completion_logprobs(model, prompts, completions, pad_id,
                                                    bf16=args.bf16)                   # [n, T]
        with torch.no_grad():
            ref_lp, _ = common.completion_logprobs(ref_model, prompts, completions, pad_id,
                                                   bf16=args.bf16)
        q0 = q0_all[[t.problem for t in mb]].to(device)                                 # [n]
        r = torch.tensor([t.reward for t in mb], device=device)                          # [n]
        q, q_t = cumulative_q(logprobs, ref_lp, mask, q0, args.beta)
        loss = spo_loss(q, q_t, mask, q0, r, args.beta, args.objective, args.loss, args.eps)
        loss = loss * len(mb) / len(batch)  # the mean over the whole batch
        loss.backward()
        loss_sum += loss.item()
        q_ts.append(q_t.detach())
        log_ratios.append(((logprobs.detach() - ref_lp) * mask).sum(-1))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):  # stop before the update
        tqdm.write(f"error: step {step + 1}: non-finite loss={loss_sum} or grad_norm={grad_norm}; "
                   "weights not updated, the last checkpoint is the last good state. Likely cause: "
                   "--lr too large, or --beta too small for Q/beta", file=sys.stderr)
        raise SystemExit(1)
    optimizer.step()
    schedule.step()
    model.eval()
    r_all, q_t = torch.tensor([t.reward for t in batch], device=device), torch.cat(q_ts)
    online = [t.reward == 0 for t in batch if t.online]
    return {"loss": loss_sum, "accuracy": float((r_all == 0).float().mean()),
            "online_accuracy": float(np.mean(online)) if online else None,
            "q_t": q_t.mean().item(), "q_t_error": (q_t - r_all).abs().mean().item(),
            # mean log pi(y|x) - log pi_ref(y|x) over the batch's trajectories: tempered, lagging
            # and offline ones alike, so not KL(pi || pi_ref), which needs y ~ pi at T = 1
            "log_ratio_ref": torch.cat(log_ratios).mean().item(),
            "length": float(np.mean([len(t.ids) for t in batch])),
            "online_share": float(np.mean([t.online for t in batch])), "grad_norm": grad_norm,
            "lr": schedule.get_last_lr()[0], "samples": len(batch)}


def evaluate(engine, model, sampler, task, eval_sets, args) -> dict:
    """Held-out metrics of the policy per size (tasks/scoring.py): greedy and --eval-k samples at
    T = 1 drawn with seed 0 (every checkpoint meets the same draws); then the sampler's weights."""
    engine.sync(model)  # the policy's weights copied into the engine (vLLM; hf/kv share them)
    metrics = {}
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    sampled = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens, seed=0)
    for n, (problems, prompts) in eval_sets.items():
        for mode, sc in [("greedy", greedy), ("sampled", sampled)]:
            groups = engine.generate(prompts, sc)
            metrics.update(score(task, problems, groups, mode, prefix=f"eval{n}/"))
    engine.sync(sampler)
    return metrics


# ---- main(): every input checked, then the loop (saving and resuming: the run section) -----------
def main(argv=None):
    parser, args = parse_args(argv)
    run = Run(parser, args, keys={"model", "optimizer", "schedule", "sampler"})
    common.setup(args.seed, args.threads)
    # Every input is checked before anything long starts: bad input is one line and exit 2.
    task, pool, held_out, offline_rows = check_args(args, parser)
    try:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tokenizer = common.load_model(args.model, device=device, task=args.task,
                                             run_dir=args.out, grad_checkpoint=args.grad_checkpoint)
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_model_defaults(args, model, MODEL_DEFAULTS)  # flags left at None
        ref_model = common.load_model(args.model_path, device=device)[0].requires_grad_(False)
        style = common.prompt_style(model, tokenizer)
        prompts = common.encode_prompts(task, pool, tokenizer, style)
        offline, cut, dropped = fit_offline(offline_rows, task, pool, prompts, tokenizer,
                                            args.max_new_tokens)
        if not offline and args.online_fraction < 1.0:
            raise ValueError(f"--offline-data {args.offline_data}: every row stopped unfinished "
                             f"before --max-new-tokens {args.max_new_tokens}")
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style))
                 for n, ps in held_out.items()}
    sampler = copy.deepcopy(model).eval().requires_grad_(False)  # lags the policy (§3.2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, then constant
        optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    start = run.begin(model=model, optimizer=optimizer, schedule=schedule)  # 0, or the step saved
    if run.state:  # the sampler's weights; None: it held the policy's
        sampler.load_state_dict(run.state["sampler"] or run.state["model"])
    engine = common.make_engine(args.engine, sampler, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    t_q0 = time.perf_counter()
    q0_all = q0_hat(engine, task, pool, prompts, ref_model, args)  # §3.1.3, once
    t_q0 = time.perf_counter() - t_q0
    engine.sync(sampler)
    print(f"spo: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters from "
          f"{args.model_path} at step {start}, engine {engine.name}, objective {args.objective}/"
          f"{args.loss}, beta={args.beta:.4f}, {len(pool)} problems (Q0_hat mean "
          f"{q0_all.mean():.3f}), {len(offline)} offline rows ({cut} cut, {dropped} dropped)")
    if start == 0:
        run.log(0, {**evaluate(engine, model, sampler, task, eval_sets, args), "time_q0": t_q0,
                    "offline_cut": cut, "offline_dropped": dropped})
    done = start  # optimizer steps taken
    for step in tqdm(range(start, args.steps), "spo", total=args.steps, initial=start,
                     leave=False):
        t0 = time.perf_counter()
        if step % args.model_update_interval == 0:  # refresh the sampler (§3.2)
            sampler.load_state_dict(model.state_dict())
            engine.sync(sampler)
        batch, temperature = draw_batch(engine, task, pool, prompts, offline, step, args)
        t_gen = time.perf_counter() - t0
        row = spo_step(model, ref_model, optimizer, schedule, batch, q0_all, args, step,
                       tokenizer.pad_token_id)  # Eqs. 11-13, §3.1.2
        done = step + 1
        row.update(temperature=temperature, sampler_age=step % args.model_update_interval,
                   time_generate=t_gen, time_step=time.perf_counter() - t0)
        last = done == args.steps or time.monotonic() > run.deadline
        if done % args.eval_every == 0 or last:
            row.update(evaluate(engine, model, sampler, task, eval_sets, args))
        run.log(done, row)
        lagging = done % args.model_update_interval != 0  # the sampler is not the policy
        if done % args.save_every == 0 or last:
            run.checkpoint(done, sampler=sampler.state_dict() if lagging else None)
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
