"""spo.py: Soft Policy Optimization (SPO) with the cumulative Q-parameterization, online + offline data.

Cohen et al. (../shared/papers/001_*, §2-§5), ../shared/ALGORITHMS.md §5. Terminal reward r in {0 (correct),
-1 (otherwise)}, KL-regularised objective E_pi r - beta KL(pi || pi_0) (the paper's beta = 1/ln(1e5) ~ 0.0869;
our default 0.5, see "Defaults" below). The policy IS the Q-function:

    A_t = beta * (log pi_theta(a_t|x,a<t) - log pi_0(a_t|x,a<t))        (Eq. 11, pi_0 = the frozen start model)
    Q_t = Q0_hat(x) + sum_{t'<=t} A_t'                                   (Eq. 12, cumulative Q)
    Q_T = Q0_hat(x) + beta * (log pi_theta(y|x) - log pi_0(y|x))         (the prediction of r, Eq. 13)

Whatever theta is, Q_t = beta log sum_v pi_0(v) exp(Q_{t+1}(v)/beta) (Theorem 2.2, soft Bellman consistency),
so only the terminal step needs a loss: regress Q_T onto r (`--objective terminal`, squared or cross-entropy
loss), or every Q_t onto reverse-Q targets (`nonterminal`), or sum_t A_t onto r - Q0_hat under a sigmoid
(`advantage`). At the fixed point pi_theta = pi* = pi_0 exp(r/beta) / Z (Theorem 2.1), whatever generated the
trajectories: no behaviour log-probs, no importance weights. Q0_hat(x) = beta log(S0 + (1 - S0) e^{-1/beta}) is
estimated once per training prompt from --q0-samples samples of pi_0 at temperature 1 (§3.1.3) and cached.

What beta does at initialisation (derived; measured on the tiny model, see the README): Q0_hat is a SOFT
value, beta log E exp(r/beta), between the mean reward (beta -> inf) and the max (beta -> 0). The regression
residual at theta_0 is Q_T - r = Q0_hat - r. With the paper's beta and an easy task (our SFT model solves ~1/3
of the 3-number puzzles; median Q0_hat -0.17), successes are already nearly "right" and every failure must lose
(1 + Q0_hat)/beta ~ 10 nats: the update is dominated by pushing sampled failures down, which on the tiny model
squeezed the probability mass onto degenerate text. As beta grows, Q0_hat -> E r and the squared terminal loss
at theta_0 becomes REINFORCE with a mean baseline (2 beta (r - E r) on log pi(y)): a centred update.

Data per step: online samples of a SAMPLER copy of the policy (the paper, §5: temperature ~ U(0.1, 0.8),
top-p 0.95), whose weights are refreshed only every --model-update-interval steps (the paper: 10), mixed with trajectories
from a JSONL file (--offline-data, e.g. samples of the SFT model made by scripts/spo_offline_data.py) in the
proportion --online-fraction.

Defaults: measured on the tiny model (README), the paper's settings (beta 1/ln 1e5, tempered stale sampler,
batch 64) collapsed it (sq 3e-5, ce 1e-4) or did not improve it (ce 3e-5); beta 0.5-1 with on-policy T=1
samples was stable, so the defaults are beta 0.5, temperature 1, top-p 1, sampler refreshed every step.
The paper's settings are flags:
      python spo.py --beta 0.0869 --temperature 0.1,0.8 --top-p 0.95 --model-update-interval 10
      python scripts/spo_offline_data.py --model runs/sft-.../final --out runs/spo-offline-sft.jsonl
      python spo.py ... --offline-data runs/spo-offline-sft.jsonl --online-fraction 0.5      (half offline)
      python spo.py --model runs/sft-.../final --engine vllm --q0-samples 800                 (GPU)
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import common
from tasks import get_task

BETA = 1 / math.log(1e5)  # the paper's beta: a failure (r = -1) is worth a likelihood ratio of 1e-5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown", help="task module in tasks/")
    p.add_argument("--model", default="sft", help="`sft` (the newest sft.py run of --task), a folder or a hub id; "
                   "it is also pi_0, the frozen reference")
    p.add_argument("--out", default=None, help="run folder (default runs/spo-TASK-TIME)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    # the algorithm
    p.add_argument("--beta", type=common.positive_float, default=0.5,
                   help=f"KL strength (paper: 1/ln 1e5 = {BETA:.4f}, for hard prompts where Q0 ~ -1; it collapsed "
                        "the tiny model, see the docstring)")
    p.add_argument("--objective", choices=["terminal", "nonterminal", "advantage"], default="terminal",
                   help="terminal: L(Q_T, r); nonterminal: sum_t L(Q_t, reverse-Q target R_t); "
                        "advantage: BCE(sum_t A_t, sigmoid(r - Q0)) (§3.1.2)")
    p.add_argument("--loss", choices=["sq", "ce"], default="sq",
                   help="sq: (Q - r)^2 (best in the paper's ablation); ce: binary cross-entropy on Q/beta as a "
                        "log-probability, clipped (the paper's main runs). Ignored by --objective advantage")
    p.add_argument("--eps", type=common.positive_float, default=1e-3,
                   help="ce: the prediction Q/beta is clipped to <= -eps in the forward pass (paper: 'close to 0')")
    p.add_argument("--train-prompts", type=common.positive_int, default=256,
                   help="training puzzles per size: the finite pool whose Q0 is estimated before training")
    p.add_argument("--q0-samples", type=common.positive_int, default=64,
                   help="samples of pi_0 (temperature 1) per training puzzle for Q0_hat (paper: 800; 64 takes "
                        "about 2 minutes for 512 puzzles on one CPU thread)")
    p.add_argument("--q0-cache", default=None, metavar="FILE",
                   help="reuse Q0 estimates from this q0.jsonl (e.g. another run's); missing puzzles are estimated")
    # data
    p.add_argument("--batch-size", type=common.positive_int, default=256,
                   help="trajectories per optimizer step (the online part rounded to whole prompts)")
    p.add_argument("--samples-per-prompt", type=common.positive_int, default=8, help="online samples per prompt")
    p.add_argument("--online-fraction", type=float, default=1.0,
                   help="share of each batch sampled online; the rest comes from --offline-data (paper: 0.5)")
    p.add_argument("--offline-data", default=None, metavar="FILE",
                   help="JSONL of offline trajectories {nums, target, completion[, finished]} (any source)")
    p.add_argument("--temperature", default="1,1",
                   help="online sampling temperature ~ U(lo, hi), one draw per step (paper: 0.1,0.8)")
    p.add_argument("--top-p", type=common.positive_float, default=1.0, help="online nucleus sampling (paper: 0.95)")
    p.add_argument("--model-update-interval", type=common.positive_int, default=1,
                   help="refresh the sampler's weights every N steps (paper: 10; 1 = on-policy)")
    # optimisation
    p.add_argument("--steps", type=common.positive_int, default=150, help="optimizer steps")
    p.add_argument("--time-limit", type=common.positive_float, default=None, metavar="MIN",
                   help="stop training MIN minutes after the start of this invocation, the Q0 estimate included "
                        "(then evaluate and save as at --steps)")
    p.add_argument("--lr", type=common.positive_float, default=6e-5,
                   help="AdamW lr, constant after warm-up (tiny model: 1e-4 at batch 64 collapsed, see the README)")
    p.add_argument("--warmup", type=int, default=10, help="linear warm-up steps (paper: 200)")
    p.add_argument("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    p.add_argument("--micro-batch", type=common.positive_int, default=64,
                   help="trajectories per forward/backward pass: memory only, same gradient")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--num-numbers", default="3,4", help="puzzle sizes to train on, comma-separated")
    p.add_argument("--problems", default=None,
                   help="training puzzles from a JSONL file or the hub instead of the generator")
    # evaluation
    p.add_argument("--eval-every", type=common.positive_int, default=75)
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="held-out puzzles per size")
    p.add_argument("--eval-k", type=common.positive_int, default=8,
                   help="samples a puzzle at temperature 1: sampled accuracy (pass@1) and pass@k")
    p.add_argument("--save-every", type=common.positive_int, default=50)
    # system
    p.add_argument("--engine", default="hf", choices=["auto", "vllm", "hf"], help="generation engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    return p, p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------
# The Q-parameterization and the losses: pure functions of tensors
# ---------------------------------------------------------------------------------------------------
def q0_from_successes(successes: torch.Tensor, samples: torch.Tensor, beta: float) -> torch.Tensor:
    """Q0_hat = beta * log(S0 + (1 - S0) * exp(-1/beta)), S0 = successes/samples (§3.1.3).

    The soft value beta log E_{pi_0} exp(r/beta) of a prompt for r in {0, -1}; it lies in [-1, 0].
    """
    s0 = successes.double() / samples.double()
    return beta * torch.log(s0 + (1 - s0) * math.exp(-1 / beta))


def cumulative_q(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                 q0: torch.Tensor, beta: float):
    """The cumulative Q-parameterization, Eqs. 11-12.

    logprobs:     [N, T] log pi_theta(a_t | x, a<t) of the trajectory's tokens, with gradient; 0 on padding
    ref_logprobs: [N, T] log pi_0 of the same tokens (detached here)
    mask:         [N, T] 1 on completion tokens, EOS included
    q0:           [N]    Q0_hat of each trajectory's prompt
    Returns Q [N, T] (Q_t after token t; on padding it stays at Q_T) and Q_T [N]. The sum runs in fp32 and
    is never divided by the length: Q_T is a log-likelihood ratio, not an average.
    """
    adv = beta * (logprobs.float() - ref_logprobs.float().detach()) * mask  # [N, T] A_t (Eq. 11)
    q = q0.float()[:, None] + torch.cumsum(adv, dim=-1)                    # [N, T] Q_t (Eq. 12)
    return q, q[:, -1]  # padding adds 0, so the last column is Q_T (an empty completion gives Q0_hat)


def log1mexp(u: torch.Tensor) -> torch.Tensor:
    """log(1 - e^u) for u < 0, stable at both ends (Maechler 2012): log(-expm1(u)) near 0, log1p(-e^u) far."""
    return torch.where(u > -math.log(2), torch.log(-torch.expm1(u)), torch.log1p(-torch.exp(u)))


def squared_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(y_hat - y)^2, elementwise (§3.1.1)."""
    return (pred - target) ** 2


def ce_loss(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Binary cross-entropy between log-probabilities, clipped as in §3.1.1, elementwise.

    pred = y_hat and target = y are log-probabilities (in SPO, Q/beta). With x = e^y:
        L = x * relu(-y_hat) - (1 - x) * log(1 - e^{y_hat_c})  - H(x)
    * y is clipped to <= 0; y_hat_c = min(y_hat, -eps) in the forward pass with a straight-through gradient
      (the backward pass ignores the clip), so log(1 - e^y_hat_c) is always finite;
    * the positive term uses relu(-y_hat) rather than -y_hat: nothing pushes y_hat above 0;
    * H(x) = -x log x - (1-x) log(1-x), the entropy of the target, is a constant (no gradient) subtracted so
      that the loss is the binary KL divergence: 0 exactly at y_hat = y, positive elsewhere (for y_hat <= 0;
      with x = 1 every y_hat >= 0 is a minimum, by the relu).
    """
    y = target.clamp(max=0.0)
    x = torch.exp(y)
    # straight-through clip: the forward value is exactly min(y_hat, -eps), the gradient that of y_hat (written
    # as clamp + (y_hat - y_hat) so that the value is not rounded: y_hat + (clamp - y_hat) loses -eps at 1e6)
    pred_c = pred.clamp(max=-eps).detach() + (pred - pred.detach())
    entropy = -(x * y + torch.special.xlogy(1 - x, -torch.expm1(y)))
    return x * F.relu(-pred) - (1 - x) * log1mexp(pred_c) - entropy


def binary_kl_with_logits(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """BCEWithLogits(logits, target) - H(target), elementwise: 0 exactly when sigmoid(logits) = target."""
    entropy = -(torch.special.xlogy(target, target) + torch.special.xlogy(1 - target, 1 - target))
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") - entropy


def spo_loss(q: torch.Tensor, q_t: torch.Tensor, mask: torch.Tensor, q0: torch.Tensor, r: torch.Tensor,
             beta: float, objective: str = "terminal", loss: str = "sq", eps: float = 1e-3) -> torch.Tensor:
    """The SPO objectives of §3.1.2, mean over trajectories (no length normalisation).

    q [N, T], q_t [N] from cumulative_q; mask [N, T]; q0 [N] Q0_hat; r [N] rewards in {0, -1}.
    terminal:    L(Q_T, r)
    nonterminal: sum_{t=1..T} L(Q_t, R_t) with reverse-Q targets R_t = sg(r - sum_{t'>t} A_t') = sg(r - (Q_T - Q_t));
                 with the squared loss every residual Q_t - R_t equals Q_T - r, but the gradient of term t only
                 reaches A_1..A_t, so early tokens get larger gradients
    advantage:   binary KL(sigmoid(r - Q0) || sigmoid(sum_t A_t)), the sigmoid-warped advantage regression
                 sum_t A_t = Q_T - Q0 ~ r - Q0 (the Q scale as written in the paper, no 1/beta)
    L: sq (Q - r)^2, or ce on log-probabilities Q/beta and r/beta (ce_loss).
    """
    q0, r = q0.to(q_t), r.to(q_t)

    def regress(pred, target):
        return squared_loss(pred, target) if loss == "sq" else ce_loss(pred / beta, target / beta, eps)

    if objective == "terminal":
        per_traj = regress(q_t, r)
    elif objective == "nonterminal":
        targets = (r[:, None] - (q_t[:, None] - q)).detach()  # [N, T] R_t
        per_traj = (regress(q, targets) * mask).sum(-1)
    elif objective == "advantage":
        per_traj = binary_kl_with_logits(q_t - q0, torch.sigmoid(r - q0))
    else:
        raise ValueError(f"unknown SPO objective {objective!r}")
    if loss not in ("sq", "ce"):
        raise ValueError(f"unknown loss {loss!r}")
    return per_traj.mean()


# ---------------------------------------------------------------------------------------------------
# Data: the training pool, Q0_hat, offline trajectories
# ---------------------------------------------------------------------------------------------------
def spo_reward(task, problem: dict, text: str) -> float:
    """r = 0 for a fully correct answer, -1 otherwise (ALGORITHMS.md §5.7)."""
    return 0.0 if task.is_correct(problem, text) else -1.0


def key_of(problem: dict) -> str:
    return json.dumps([sorted(problem["nums"]), problem["target"]])


def read_q0_cache(path: str, model_path: str) -> dict:
    """{puzzle key: row} of a q0.jsonl file, keeping the rows estimated with this model."""
    table = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    if row.get("model") == model_path:
                        table[key_of(row)] = row
    return table


def estimate_q0(engine, task, problems, prompts, samples, max_new_tokens, cache_file, model_path, chunk=32):
    """Count successes of `samples` completions of pi_0 at temperature 1 per puzzle; append rows to the cache
    as they come (an interrupted estimate resumes where it stopped)."""
    sc = common.SamplingConfig(n=samples, max_new_tokens=max_new_tokens, temperature=1.0)
    for start in tqdm(range(0, len(problems), chunk), desc="Q0 estimate", dynamic_ncols=True):
        groups = engine.generate(prompts[start:start + chunk], sc)
        with open(cache_file, "a") as f:
            for problem, group in zip(problems[start:start + chunk], groups):
                wins = sum(task.is_correct(problem, s.text) for s in group)
                f.write(json.dumps({"nums": problem["nums"], "target": problem["target"], "samples": samples,
                                    "successes": wins, "model": model_path}) + "\n")


def read_offline(path: str, task) -> list[dict]:
    """Offline trajectories: JSON lines {"nums", "target", "completion"[, "finished"]}. The reward is
    recomputed here from the text (never trusted from the file); EOS is appended unless finished is false."""
    rows = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    problem = {"nums": [int(x) for x in row["nums"]], "target": int(row["target"])}
                    text = row["completion"]
                    if not isinstance(text, str):
                        raise TypeError
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    raise ValueError(f"--offline-data {path}, line {n}: expected a JSON object with nums, target "
                                     "and completion (a string)") from None
                rows.append({"problem": problem, "completion": text, "finished": bool(row.get("finished", True))})
    except OSError as e:
        raise ValueError(f"--offline-data: cannot read {path}: {e.strerror}") from None
    if not rows:
        raise ValueError(f"--offline-data {path} holds no trajectories")
    return rows


def fit_offline(rows: list[dict], pool_index: list[int], pool: list[dict], task, tokenizer,
                max_new_tokens: int):
    """Offline rows as the sampler would have produced them with --max-new-tokens M, scored on that text.

    A row keeps its first M tokens; EOS is appended only if the row finished and EOS fits within M (it counts,
    as in sampling); the reward is computed on the decoded kept tokens, so a solution cut short scores as the
    failure the sampler would have made of it. A row that stopped unfinished before M tokens (made with a
    smaller budget) is no trajectory of this run: dropped. Returns ([(pool index, ids, r)], cut, dropped).
    """
    kept, cut, dropped = [], 0, 0
    for row, i in zip(rows, pool_index):
        ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        if not row["finished"] and len(ids) < max_new_tokens:
            dropped += 1
            continue
        fits = row["finished"] and len(ids) < max_new_tokens
        cut += not fits and len(ids) + row["finished"] > max_new_tokens
        ids = ids if fits else ids[:max_new_tokens]
        r = spo_reward(task, pool[i], tokenizer.decode(ids, skip_special_tokens=True))
        kept.append((i, ids + [tokenizer.eos_token_id] if fits else ids, r))
    return kept, cut, dropped


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def draw_batch(engine, task, pool, prompts_of, offline, step, args, t_lo, t_hi):
    """A batch of trajectories (prompt ids, completion ids, r, pool index, source) for this step.

    Seeded by (seed, step), so a resumed run draws the same batches. Online: one temperature ~ U(lo, hi) for
    the step, top-p, --samples-per-prompt samples of the sampler for each of round(online_fraction *
    batch_size / samples_per_prompt) prompts. Offline: the rest of the batch, uniform draws from the file."""
    rng = np.random.default_rng([args.seed, step])
    n_prompts = min(len(pool), round(args.online_fraction * args.batch_size / args.samples_per_prompt))
    temperature = float(rng.uniform(t_lo, t_hi))
    batch = []
    if n_prompts:
        idx = rng.choice(len(pool), n_prompts, replace=False)
        sc = common.SamplingConfig(n=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
                                   temperature=temperature, top_p=args.top_p)
        for i, group in zip(idx, engine.generate([prompts_of[i] for i in idx], sc)):
            for s in group:
                batch.append((prompts_of[i], s.ids, spo_reward(task, pool[i], s.text), int(i), "online"))
    if offline:
        for j in rng.choice(len(offline), max(0, args.batch_size - len(batch)), replace=True):
            i, ids, r = offline[j]
            batch.append((prompts_of[i], ids, r, i, "offline"))
    return batch, temperature


def main(argv=None):
    started = time.time()
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or common.default_out_dir("spo", args.task)

    try:  # every bad input surfaces here, before any training: one line, exit status 2
        task = get_task(args.task)
        try:
            sizes = [int(s) for s in str(args.num_numbers).split(",")]
            t_lo, t_hi = (float(t) for t in str(args.temperature).split(","))
        except ValueError:
            raise ValueError("--num-numbers takes comma-separated integers and --temperature two numbers lo,hi") \
                from None
        if not 0 < t_lo <= t_hi:
            raise ValueError(f"--temperature lo,hi needs 0 < lo <= hi, got {args.temperature}")
        if not 0.0 <= args.online_fraction <= 1.0:
            raise ValueError(f"--online-fraction must lie in [0, 1], got {args.online_fraction}")
        if args.online_fraction < 1.0 and not args.offline_data:
            raise ValueError("--online-fraction below 1 needs --offline-data FILE")
        if args.top_p > 1:
            raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
        if args.q0_cache and not os.path.exists(args.q0_cache):
            raise ValueError(f"--q0-cache: no such file {args.q0_cache}")
        offline = read_offline(args.offline_data, task) if args.offline_data else []
        ckpt = common.checkpoint_path(os.path.join(out, "checkpoint")) if args.resume else None
        if args.resume and ckpt is None:
            raise ValueError(f"--resume {args.resume}: no checkpoint to resume from")
        ref_path = common.resolve_model_path(args.model, task=args.task)
        if args.problems:
            pool = task.get_problems("train", args.train_prompts, source=args.problems, seed=args.seed)
        else:
            pool = [p for n in sizes for p in task.get_problems("train", args.train_prompts, size=n,
                                                                 seed=args.seed)]
        eval_problems = {n: task.get_problems("test", args.eval_size, size=n, seed=args.seed) for n in sizes}
        run = common.Run(out, {**vars(args), "model_path": ref_path}, resume=bool(args.resume))
        model, tokenizer = common.load_model(ckpt or ref_path, device=device)
        ref_model, _ = common.load_model(ref_path, device=device)  # pi_0: frozen, defines A_t and Q0_hat
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))
    ref_model.requires_grad_(False)
    style = common.prompt_style(model, tokenizer)

    # offline puzzles join the pool (each needs its Q0_hat); trajectories are tokenized once
    index = {key_of(p): i for i, p in enumerate(pool)}
    for row in offline:
        if key_of(row["problem"]) not in index:
            index[key_of(row["problem"])] = len(pool)
            pool.append(row["problem"])
    prompts_of = common.encode_prompts(task, pool, tokenizer, style)
    offline, offline_cut, offline_dropped = fit_offline(offline, [index[key_of(row["problem"])] for row in offline],
                                                        pool, task, tokenizer, args.max_new_tokens)
    if not offline and args.online_fraction < 1.0:
        parser.error(f"--offline-data {args.offline_data}: no row is a trajectory of --max-new-tokens "
                     f"{args.max_new_tokens} (all {offline_dropped} stopped unfinished before it)")
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style)) for n, ps in eval_problems.items()}

    # the sampler: a copy of the policy whose weights are refreshed every --model-update-interval steps
    sampler = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    step = 0
    if ckpt:
        state = common.load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        if state.get("sampler") is not None:
            sampler.load_state_dict(state["sampler"])
        common.set_rng_state(state["rng"])
        step = state["step"]
        run.truncate(step)
        print(f"resumed from {ckpt} at step {step}")
    engine = common.make_engine(args.engine, sampler, tokenizer, ckpt or ref_path, seed=args.seed)

    # Q0_hat for every puzzle of the pool: cached in RUN/q0.jsonl (and reused from --q0-cache)
    model_id = os.path.realpath(ref_path) if os.path.exists(ref_path) else ref_path
    cache_file = run.path("q0.jsonl")
    table = read_q0_cache(cache_file, model_id)
    if args.q0_cache:
        reused = {k: v for k, v in read_q0_cache(args.q0_cache, model_id).items() if k not in table}
        with open(cache_file, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in reused.values())
        table.update(reused)
    missing = [i for i, p in enumerate(pool) if key_of(p) not in table]
    t_q0 = time.perf_counter()
    if missing:
        engine.sync(ref_model)  # sample pi_0 itself at temperature 1
        estimate_q0(engine, task, [pool[i] for i in missing], [prompts_of[i] for i in missing], args.q0_samples,
                    args.max_new_tokens, cache_file, model_id)
        table = read_q0_cache(cache_file, model_id)
    t_q0 = time.perf_counter() - t_q0
    engine.sync(sampler)
    rows = [table[key_of(p)] for p in pool]
    q0_all = q0_from_successes(torch.tensor([r["successes"] for r in rows]), torch.tensor([r["samples"] for r in rows]),
                               args.beta).float()
    print(f"spo: {common.count_parameters(model) / 1e6:.2f}M parameters from {ref_path}, engine {engine.name}, "
          f"{len(pool)} training puzzles (Q0_hat mean {q0_all.mean():.3f}, {len(missing)} estimated in {t_q0:.0f}s), "
          f"{len(offline)} offline trajectories ({offline_cut} cut to --max-new-tokens and rescored, "
          f"{offline_dropped} dropped: unfinished before it), objective {args.objective}/{args.loss}, beta={args.beta:.4f}, "
          f"run folder {run.dir}")

    def evaluate():
        engine.sync(model)  # evaluate the current weights, then give the sampler its own back
        metrics = {}
        for n, (problems, prompts) in eval_sets.items():
            metrics.update(common.evaluate(engine, task, problems, prompts, k=args.eval_k, prefix=f"eval{n}/",
                                           max_new_tokens=args.max_new_tokens))
        engine.sync(sampler)
        return metrics

    if step == 0:
        row = {**evaluate(), "time_q0": t_q0, "offline_cut": offline_cut, "offline_dropped": offline_dropped}
        run.log(0, row)
        tqdm.write("step 0: " + "  ".join(f"{k}={v:.3f}" for k, v in row.items() if "sampled/acc" in k or "pass@" in k))
    bar = tqdm(total=args.steps, initial=step, desc="spo", dynamic_ncols=True)
    deadline = started + 60 * args.time_limit if args.time_limit else float("inf")
    while step < args.steps:
        t0 = time.perf_counter()
        if step % args.model_update_interval == 0:  # refresh the sampler (the engine's weights)
            sampler.load_state_dict(model.state_dict())
            engine.sync(sampler)
        batch, temperature = draw_batch(engine, task, pool, prompts_of, offline, step, args, t_lo, t_hi)
        t_gen = time.perf_counter() - t0

        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss_sum, qt_all, kl_all = 0.0, [], []
        for start in range(0, len(batch), args.micro_batch):
            mb = batch[start:start + args.micro_batch]
            prompts, completions = [b[0] for b in mb], [b[1] for b in mb]
            r = torch.tensor([b[2] for b in mb])
            q0 = q0_all[[b[3] for b in mb]]
            logprobs, mask = common.completion_logprobs(model, prompts, completions, tokenizer.pad_token_id)
            with torch.no_grad():
                ref_lp, _ = common.completion_logprobs(ref_model, prompts, completions, tokenizer.pad_token_id)
            q, q_t = cumulative_q(logprobs, ref_lp, mask, q0, args.beta)
            loss = spo_loss(q, q_t, mask, q0, r, args.beta, args.objective, args.loss, args.eps) * len(mb) / len(batch)
            loss.backward()
            loss_sum += loss.item()
            qt_all.append(q_t.detach())
            kl_all.append(((logprobs.detach() - ref_lp) * mask).sum(-1))
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        optimizer.step()
        schedule.step()
        model.eval()
        step += 1

        r_all = torch.tensor([b[2] for b in batch])
        online = [b[4] == "online" for b in batch]
        q_t = torch.cat(qt_all)
        row = {"loss": loss_sum, "accuracy": float((r_all == 0).float().mean()),
               "online_accuracy": float(np.mean([b[2] == 0 for b in batch if b[4] == "online"])) if any(online)
               else None,
               "q_t": q_t.mean().item(), "q_t_error": (q_t - r_all).abs().mean().item(),
               "kl": torch.cat(kl_all).mean().item(), "length": float(np.mean([len(b[1]) for b in batch])),
               "online_share": float(np.mean(online)), "temperature": temperature,
               "sampler_age": (step - 1) % args.model_update_interval,  # steps since the sampler's weights were fresh
               "grad_norm": grad_norm, "lr": schedule.get_last_lr()[0], "time_generate": t_gen,
               "samples": len(batch), "time_step": time.perf_counter() - t0}
        last = step == args.steps or time.time() >= deadline
        if step % args.eval_every == 0 or last:
            row.update(evaluate())
            tqdm.write(f"step {step}: " + "  ".join(f"{k}={row[k]:.3f}" for k in row
                                                     if "sampled/acc" in k or "pass@" in k))
        run.log(step, row)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_sum:.3f}", acc=f"{row['accuracy']:.2f}", kl=f"{row['kl']:.2f}")
        if step % args.save_every == 0 or last:
            stale = step % args.model_update_interval != 0  # the sampler lags: keep its weights for --resume
            common.save_checkpoint(run.path("checkpoint"), model, tokenizer,
                                   {"step": step, "optimizer": optimizer.state_dict(),
                                    "schedule": schedule.state_dict(), "rng": common.rng_state(),
                                    "sampler": sampler.state_dict() if stale else None})
        if last:
            break
    bar.close()
    common.save_checkpoint(run.path("final"), model, tokenizer)
    engine.close()
    print(f"done: final model in {run.path('final')}  ({run.path('metrics.jsonl')})")
    return run.dir


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
