"""Which -m paper tests catch which likely mistake (issue 69, "tests a teacher grades with").

Not a test file (pytest does not collect it): a script. For each function a student writes, it
puts a wrong version of it in place of the real one (in this process only: the files are never
changed), runs that algorithm's -m paper tests, and prints the tests that fail and the first line
of each failure. Every mistake should fail at least two tests; a blank function (raise
NotImplementedError, return None, return zeros) should fail with a message naming its equation.

    python tests/grading_check.py              # every algorithm (several minutes on 2 cores)
    python tests/grading_check.py topr rloo    # some
    python tests/grading_check.py --stubs      # the blank functions' messages too
"""
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import agro  # noqa: E402
import common  # noqa: E402
import rloo  # noqa: E402
import sft  # noqa: E402
import spo  # noqa: E402
import topr  # noqa: E402

REAL = {m.__name__: dict(vars(m)) for m in (sft, rloo, topr, agro, spo)}


def real(module, name):
    """The function as the file writes it (a wrong version may call the real one)."""
    return REAL[module.__name__][name]


# ---- sft.py --------------------------------------------------------------------------------------
def sft_loss_sign(logprobs, mask, norm="token"):
    return -real(sft, "sft_loss")(logprobs, mask, norm)


def sft_loss_no_mask(logprobs, mask, norm="token"):
    return real(sft, "sft_loss")(logprobs, torch.ones_like(mask), norm) if norm == "seq" else \
        -logprobs.sum() / mask.sum()


def sft_loss_token_over_all_positions(logprobs, mask, norm="token"):
    if norm == "token":
        return -(logprobs * mask).sum() / mask.numel()
    return real(sft, "sft_loss")(logprobs, mask, norm)


def sft_loss_token_is_mean_of_means(logprobs, mask, norm="token"):
    if norm == "token":
        return (-(logprobs * mask).sum(-1) / mask.sum(-1)).mean()
    return real(sft, "sft_loss")(logprobs, mask, norm)


def sft_loss_seq_is_a_sum(logprobs, mask, norm="token"):
    if norm == "seq":
        return -(logprobs * mask).sum()
    return real(sft, "sft_loss")(logprobs, mask, norm)


def sft_loss_norms_swapped(logprobs, mask, norm="token"):
    return real(sft, "sft_loss")(logprobs, mask, {"token": "seq", "seq": "token"}.get(norm, norm))


def lr_no_warmup(step, warmup, total):
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total)))


def lr_cosine_over_the_whole_run(step, warmup, total):
    if step < warmup:
        return step / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total)))


def lr_linear_decay(step, warmup, total):
    if step < warmup:
        return step / warmup
    return 1.0 - min(1.0, (step - warmup) / max(1, total - warmup))


def lr_warmup_off_by_one(step, warmup, total):
    if step < warmup:
        return (step + 1) / warmup
    return real(sft, "lr_lambda")(step, warmup, total)


# ---- rloo.py -------------------------------------------------------------------------------------
def adv_mean_includes_self(rewards):
    return rewards - rewards.mean(-1, keepdim=True)


def adv_sign(rewards):
    return -real(rloo, "rloo_advantages")(rewards)


def adv_batch_baseline(rewards):
    flat = rewards.reshape(-1)
    return (flat - (flat.sum() - flat) / (flat.numel() - 1)).reshape(rewards.shape)


def adv_over_std(rewards):
    centred = rewards - rewards.mean(-1, keepdim=True)
    return centred / (rewards.std(-1, keepdim=True) + 1e-4)


def adv_no_baseline(rewards):
    return rewards.clone()


def adv_others_over_k(rewards):
    k = rewards.shape[-1]
    return rewards - (rewards.sum(-1, keepdim=True) - rewards) / k


def rloo_loss_sign(logprobs, mask, advantages, norm="seq"):
    return -real(rloo, "rloo_loss")(logprobs, mask, advantages, norm)


def rloo_loss_no_stop_gradient(logprobs, mask, advantages, norm="seq"):
    lp = (logprobs * mask).sum(-1)
    if norm == "token":
        return -(advantages[:, None] * logprobs * mask).sum() / mask.sum()
    if norm == "seq/len":
        lp = lp / mask.sum(-1)
    return -(advantages * lp).mean()


def rloo_loss_seq_over_length(logprobs, mask, advantages, norm="seq"):
    norm = "seq/len" if norm == "seq" else norm
    return real(rloo, "rloo_loss")(logprobs, mask, advantages, norm)


def rloo_loss_no_mask(logprobs, mask, advantages, norm="seq"):
    return real(rloo, "rloo_loss")(logprobs, torch.ones_like(mask), advantages, norm)


def rloo_loss_sum_over_sequences(logprobs, mask, advantages, norm="seq"):
    return real(rloo, "rloo_loss")(logprobs, mask, advantages, norm) * len(advantages)


# ---- topr.py -------------------------------------------------------------------------------------
def t_plus_by_r(rewards, c, split):
    return rewards >= split


def t_plus_strict(rewards, c, split):
    return rewards - c > split


def t_plus_split_ignored(rewards, c, split):
    return rewards - c >= 0


def ratio_limits_of_the_other_set(log_ratio, positive, a_pos, b_pos, a_neg, b_neg):
    return real(topr, "truncated_ratio")(log_ratio, positive, a_neg, b_neg, a_pos, b_pos)


def ratio_a_b_swapped(log_ratio, positive, a_pos, b_pos, a_neg, b_neg):
    return real(topr, "truncated_ratio")(log_ratio, positive, b_pos, a_pos, b_neg, a_neg)


def ratio_no_upper_cap(log_ratio, positive, a_pos, b_pos, a_neg, b_neg):
    return real(topr, "truncated_ratio")(log_ratio, positive, a_pos, math.inf, a_neg, math.inf)


def ratio_no_exp(log_ratio, positive, a_pos, b_pos, a_neg, b_neg):
    return torch.log(real(topr, "truncated_ratio")(log_ratio, positive, a_pos, b_pos, a_neg, b_neg))


def _topr(logprobs, mask, rewards, c, norm, alpha, weight=None):
    weight = alpha * (rewards - c) if weight is None else weight
    return common.weighted_logprob_loss(weight, logprobs, mask, norm)


def topr_loss_sign(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len", split=0.0,
                   limits=topr.LIMITS["topr"]):
    return -real(topr, "topr_loss")(logprobs, mask, lp_mu, rewards, c, norm, split, limits)


def topr_loss_no_stop_gradient(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len", split=0.0,
                               limits=topr.LIMITS["topr"]):
    lp = (logprobs * mask).sum(-1)
    alpha = topr.truncated_ratio(lp - lp_mu, topr.in_t_plus(rewards, c, split), *limits)
    return _topr(logprobs, mask, rewards, c, norm, alpha)


def topr_loss_weight_r_not_r_minus_c(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len",
                                     split=0.0, limits=topr.LIMITS["topr"]):
    lp = (logprobs.detach() * mask).sum(-1)
    alpha = topr.truncated_ratio(lp - lp_mu, topr.in_t_plus(rewards, c, split), *limits)
    return _topr(logprobs, mask, rewards, c, norm, alpha, weight=alpha * rewards)


def topr_loss_t_plus_by_r(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len", split=0.0,
                          limits=topr.LIMITS["topr"]):
    lp = (logprobs.detach() * mask).sum(-1)
    alpha = topr.truncated_ratio(lp - lp_mu, topr.in_t_plus(rewards, 0.0, split), *limits)
    return _topr(logprobs, mask, rewards, c, norm, alpha)


def topr_loss_linear_space(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len", split=0.0,
                           limits=topr.LIMITS["topr"]):
    lp = (logprobs.detach() * mask).sum(-1)
    positive = topr.in_t_plus(rewards, c, split)
    u = torch.exp(lp) / torch.exp(lp_mu)  # pi / mu
    lo = torch.where(positive, limits[0], limits[2]).to(u.dtype)
    hi = torch.where(positive, limits[1], limits[3]).to(u.dtype)
    return _topr(logprobs, mask, rewards, c, norm, torch.minimum(torch.maximum(u, lo), hi))


def topr_loss_per_token_ratio(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len", split=0.0,
                              limits=topr.LIMITS["topr"]):
    lp = (logprobs.detach() * mask).sum(-1)
    log_ratio = (lp - lp_mu) / mask.sum(-1)
    alpha = topr.truncated_ratio(log_ratio, topr.in_t_plus(rewards, c, split), *limits)
    return _topr(logprobs, mask, rewards, c, norm, alpha)


def topr_loss_truncates_positives_too(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len",
                                      split=0.0, limits=topr.LIMITS["topr"]):
    lp = (logprobs.detach() * mask).sum(-1)
    alpha = topr.truncated_ratio(lp - lp_mu, torch.zeros_like(rewards, dtype=torch.bool), *limits)
    return _topr(logprobs, mask, rewards, c, norm, alpha)


def topr_loss_norm_ignored(logprobs, mask, lp_mu, rewards, c=0.0, norm="seq/len", split=0.0,
                           limits=topr.LIMITS["topr"]):
    return real(topr, "topr_loss")(logprobs, mask, lp_mu, rewards, c, "seq/len", split, limits)


# ---- agro.py -------------------------------------------------------------------------------------
def rpi_sign(rewards, h, beta):
    return rewards + beta * h.detach()


def rpi_no_stop_gradient(rewards, h, beta):
    return rewards - beta * h


def rpi_no_beta(rewards, h, beta):
    return rewards - h.detach()


def loo_includes_self(values):
    return values.mean(-1, keepdim=True).expand_as(values)


def loo_over_n(values):
    n = values.shape[-1]
    return (values.sum(-1, keepdim=True) - values) / n


def off_sign(rpi):
    return -real(agro, "agro_offpolicy_weights")(rpi)


def off_mean_includes_self(rpi):
    return rpi - rpi.mean(-1, keepdim=True)


def off_over_std(rpi):
    return real(agro, "agro_offpolicy_weights")(rpi) / (rpi.std(-1, keepdim=True) + 1e-4)


def _on(rpi, beta, lambda_lr, lr_baseline, change):
    adv = agro.agro_offpolicy_weights(rpi)
    v = real(agro, "agro_onpolicy_weights")(rpi, 0.5, 1.0, lr_baseline)  # adv - (adv^2 - v)
    v = v - adv + adv ** 2  # recovers v_i
    return change(adv, v)


def on_lr_sign(rpi, beta, lambda_lr, lr_baseline="var"):
    return _on(rpi, beta, lambda_lr, lr_baseline,
               lambda adv, v: adv + lambda_lr * 0.5 * (adv ** 2 - v) / beta)


def on_no_over_beta(rpi, beta, lambda_lr, lr_baseline="var"):
    return _on(rpi, beta, lambda_lr, lr_baseline,
               lambda adv, v: adv - lambda_lr * 0.5 * (adv ** 2 - v))


def on_no_half(rpi, beta, lambda_lr, lr_baseline="var"):
    return _on(rpi, beta, lambda_lr, lr_baseline,
               lambda adv, v: adv - lambda_lr * (adv ** 2 - v) / beta)


def on_v_ignored(rpi, beta, lambda_lr, lr_baseline="var"):
    return real(agro, "agro_onpolicy_weights")(rpi, beta, lambda_lr, "none")


def on_var_without_n_over_n_minus_1(rpi, beta, lambda_lr, lr_baseline="var"):
    n = rpi.shape[-1]
    factor = (n - 1) / n if lr_baseline == "var" else 1.0
    return _on(rpi, beta, lambda_lr, lr_baseline,
               lambda adv, v: adv - lambda_lr * 0.5 * (adv ** 2 - factor * v) / beta)


def agro_loss_sign(logprobs, mask, weights, norm="seq"):
    return -real(agro, "agro_loss")(logprobs, mask, weights, norm)


def agro_loss_no_stop_gradient(logprobs, mask, weights, norm="seq"):
    return -agro.reduce_tokens(weights[:, None] * logprobs, mask, norm)


def agro_loss_seq_over_length(logprobs, mask, weights, norm="seq"):
    return real(agro, "agro_loss")(logprobs, mask, weights, "seq/len" if norm == "seq" else norm)


def agro_loss_no_mask(logprobs, mask, weights, norm="seq"):
    return real(agro, "agro_loss")(logprobs, torch.ones_like(mask), weights, norm)


def agro_loss_sum_over_sequences(logprobs, mask, weights, norm="seq"):
    return real(agro, "agro_loss")(logprobs, mask, weights, norm) * len(weights)


# ---- spo.py --------------------------------------------------------------------------------------
def q0_no_failure_term(successes, samples, beta):
    return beta * torch.log(successes.double() / samples.double())


def q0_mean_reward(successes, samples, beta):
    return successes.double() / samples.double() - 1.0


def q0_exp_sign(successes, samples, beta):
    s0 = successes.double() / samples.double()
    return beta * torch.log(s0 + (1 - s0) * math.exp(1 / beta))


def q0_no_beta(successes, samples, beta):
    return real(spo, "q0_from_successes")(successes, samples, beta) / beta


def q_sign(logprobs, ref_logprobs, mask, q0, beta):
    return real(spo, "cumulative_q")(ref_logprobs, logprobs, mask, q0, beta)


def q_no_beta(logprobs, ref_logprobs, mask, q0, beta):
    a = (logprobs.float() - ref_logprobs.float().detach()) * mask
    q = q0.float()[:, None] + torch.cumsum(a, dim=-1)
    return q, q[:, -1]


def q_not_cumulative(logprobs, ref_logprobs, mask, q0, beta):
    a = beta * (logprobs.float() - ref_logprobs.float().detach()) * mask
    q = q0.float()[:, None] + a
    return q, q0.float() + a.sum(-1)


def q_over_length(logprobs, ref_logprobs, mask, q0, beta):
    q, q_T = real(spo, "cumulative_q")(logprobs, ref_logprobs, mask, q0, beta)
    length = mask.sum(-1).clamp(min=1)
    return q0.float()[:, None] + (q - q0.float()[:, None]) / length[:, None], \
        q0.float() + (q_T - q0.float()) / length


def q_no_mask(logprobs, ref_logprobs, mask, q0, beta):
    ref = ref_logprobs + 0.1 * (1 - mask)  # padding that is not 0 in both
    return real(spo, "cumulative_q")(logprobs, ref, torch.ones_like(mask), q0, beta)


def q_exclusive(logprobs, ref_logprobs, mask, q0, beta):
    q, q_T = real(spo, "cumulative_q")(logprobs, ref_logprobs, mask, q0, beta)
    return torch.cat([q0.float()[:, None], q[:, :-1]], 1), q_T


def q_no_q0(logprobs, ref_logprobs, mask, q0, beta):
    return real(spo, "cumulative_q")(logprobs, ref_logprobs, mask, torch.zeros_like(q0), beta)


def ce_no_entropy(y_hat, y, eps=spo.CE_EPS):
    y_c = y.clamp(max=0.0)
    entropy = -(torch.exp(y_c) * y_c + torch.special.xlogy(1 - torch.exp(y_c), -torch.expm1(y_c)))
    return real(spo, "ce_loss")(y_hat, y, eps) + entropy


def ce_no_clip(y_hat, y, eps=spo.CE_EPS):
    y_c = y.clamp(max=0.0)
    x = torch.exp(y_c)
    entropy = -(x * y_c + torch.special.xlogy(1 - x, -torch.expm1(y_c)))
    return x * F.relu(-y_hat) - (1 - x) * spo.log1mexp(y_hat) - entropy


def ce_no_relu(y_hat, y, eps=spo.CE_EPS):
    x = torch.exp(y.clamp(max=0.0))
    return real(spo, "ce_loss")(y_hat, y, eps) - x * F.relu(-y_hat) + x * -y_hat


def ce_clip_without_straight_through(y_hat, y, eps=spo.CE_EPS):
    y_c = y.clamp(max=0.0)
    x = torch.exp(y_c)
    entropy = -(x * y_c + torch.special.xlogy(1 - x, -torch.expm1(y_c)))
    return x * F.relu(-y_hat) - (1 - x) * spo.log1mexp(y_hat.clamp(max=-eps)) - entropy


def spo_sum_over_trajectories(q, q_T, mask, q0, r, beta, objective="terminal", loss_type="sq",
                              eps=spo.CE_EPS):
    return real(spo, "spo_loss")(q, q_T, mask, q0, r, beta, objective, loss_type, eps) * len(q_T)


def spo_nonterminal_mean_over_tokens(q, q_T, mask, q0, r, beta, objective="terminal",
                                     loss_type="sq", eps=spo.CE_EPS):
    if objective != "nonterminal":
        return real(spo, "spo_loss")(q, q_T, mask, q0, r, beta, objective, loss_type, eps)
    r = r.to(q_T)
    targets = (r[:, None] - (q_T[:, None] - q)).detach()
    L = (q - targets) ** 2 if loss_type == "sq" else spo.ce_loss(q / beta, targets / beta, eps)
    return ((L * mask).sum(-1) / mask.sum(-1)).mean()


def spo_nonterminal_targets_not_detached(q, q_T, mask, q0, r, beta, objective="terminal",
                                         loss_type="sq", eps=spo.CE_EPS):
    if objective != "nonterminal":
        return real(spo, "spo_loss")(q, q_T, mask, q0, r, beta, objective, loss_type, eps)
    r = r.to(q_T)
    targets = r[:, None] - (q_T[:, None] - q)
    L = (q - targets) ** 2 if loss_type == "sq" else spo.ce_loss(q / beta, targets / beta, eps)
    return (L * mask).sum(-1).mean()


def spo_advantage_unwarped(q, q_T, mask, q0, r, beta, objective="terminal", loss_type="sq",
                           eps=spo.CE_EPS):
    if objective != "advantage":
        return real(spo, "spo_loss")(q, q_T, mask, q0, r, beta, objective, loss_type, eps)
    return ((q_T - q0.to(q_T) - (r.to(q_T) - q0.to(q_T))) ** 2).mean()


def spo_terminal_regresses_q_t_minus_q0(q, q_T, mask, q0, r, beta, objective="terminal",
                                        loss_type="sq", eps=spo.CE_EPS):
    if objective != "terminal":
        return real(spo, "spo_loss")(q, q_T, mask, q0, r, beta, objective, loss_type, eps)
    return real(spo, "spo_loss")(q, q_T - q0.to(q_T), mask, q0, r, beta, objective, loss_type, eps)


MISTAKES = {
    "sft": [
        ("sft_loss", "sign flipped (maximises the NLL)", sft_loss_sign),
        ("sft_loss", "padding not masked", sft_loss_no_mask),
        ("sft_loss", "token: divided by every position, padding too",
         sft_loss_token_over_all_positions),
        ("sft_loss", "token: the mean of per-sequence means", sft_loss_token_is_mean_of_means),
        ("sft_loss", "seq: a sum over sequences, not the mean", sft_loss_seq_is_a_sum),
        ("sft_loss", "token and seq swapped", sft_loss_norms_swapped),
        ("lr_lambda", "no warm-up", lr_no_warmup),
        ("lr_lambda", "cosine over the whole run, not after the warm-up",
         lr_cosine_over_the_whole_run),
        ("lr_lambda", "linear decay, not cosine", lr_linear_decay),
        ("lr_lambda", "warm-up off by one step", lr_warmup_off_by_one),
    ],
    "rloo": [
        ("rloo_advantages", "baseline includes the sample itself", adv_mean_includes_self),
        ("rloo_advantages", "sign flipped", adv_sign),
        ("rloo_advantages", "baseline over the whole batch, not the group", adv_batch_baseline),
        ("rloo_advantages", "divided by the group's std (GRPO)", adv_over_std),
        ("rloo_advantages", "no baseline", adv_no_baseline),
        ("rloo_advantages", "others' sum divided by k, not k - 1", adv_others_over_k),
        ("rloo_loss", "sign flipped", rloo_loss_sign),
        ("rloo_loss", "no stop-gradient on A", rloo_loss_no_stop_gradient),
        ("rloo_loss", "seq: each sum divided by its length", rloo_loss_seq_over_length),
        ("rloo_loss", "padding not masked", rloo_loss_no_mask),
        ("rloo_loss", "a sum over sequences, not the mean", rloo_loss_sum_over_sequences),
    ],
    "topr": [
        ("in_t_plus", "T+ decided by R instead of R - c", t_plus_by_r),
        ("in_t_plus", "R - c > split, not >=", t_plus_strict),
        ("in_t_plus", "split ignored (always by sign)", t_plus_split_ignored),
        ("truncated_ratio", "T+ and T- limits swapped", ratio_limits_of_the_other_set),
        ("truncated_ratio", "a and b swapped", ratio_a_b_swapped),
        ("truncated_ratio", "no upper cap b", ratio_no_upper_cap),
        ("truncated_ratio", "the clamped log ratio, no exp", ratio_no_exp),
        ("topr_loss", "sign flipped", topr_loss_sign),
        ("topr_loss", "no stop-gradient on alpha", topr_loss_no_stop_gradient),
        ("topr_loss", "weight R, not R - c", topr_loss_weight_r_not_r_minus_c),
        ("topr_loss", "T+ decided by R instead of R - c", topr_loss_t_plus_by_r),
        ("topr_loss", "the ratio in linear space, exp(LP) / exp(LP_mu)", topr_loss_linear_space),
        ("topr_loss", "the ratio of per-token means (LP / T)", topr_loss_per_token_ratio),
        ("topr_loss", "positives truncated too", topr_loss_truncates_positives_too),
        ("topr_loss", "norm ignored (always seq/len)", topr_loss_norm_ignored),
    ],
    "agro": [
        ("regularised_rewards", "KL sign flipped: r + beta h", rpi_sign),
        ("regularised_rewards", "no stop-gradient on h", rpi_no_stop_gradient),
        ("regularised_rewards", "beta left out", rpi_no_beta),
        ("loo_baseline", "baseline includes the sample itself", loo_includes_self),
        ("loo_baseline", "divided by n, not n - 1", loo_over_n),
        ("agro_offpolicy_weights", "sign flipped", off_sign),
        ("agro_offpolicy_weights", "baseline includes the sample itself", off_mean_includes_self),
        ("agro_offpolicy_weights", "divided by the group's std", off_over_std),
        ("agro_onpolicy_weights", "g_LR's sign flipped", on_lr_sign),
        ("agro_onpolicy_weights", "g_LR not divided by beta", on_no_over_beta),
        ("agro_onpolicy_weights", "the 1/2 of g_LR left out", on_no_half),
        ("agro_onpolicy_weights", "v_i ignored (always 0)", on_v_ignored),
        ("agro_onpolicy_weights", "var: no n/(n-1)", on_var_without_n_over_n_minus_1),
        ("agro_loss", "sign flipped", agro_loss_sign),
        ("agro_loss", "no stop-gradient on w", agro_loss_no_stop_gradient),
        ("agro_loss", "seq: each sum divided by its length", agro_loss_seq_over_length),
        ("agro_loss", "padding not masked", agro_loss_no_mask),
        ("agro_loss", "a sum over sequences, not the mean", agro_loss_sum_over_sequences),
    ],
    "spo": [
        ("q0_from_successes", "the failure term left out: beta log S0", q0_no_failure_term),
        ("q0_from_successes", "the mean reward S0 - 1, not the soft value", q0_mean_reward),
        ("q0_from_successes", "e^{+1/beta}", q0_exp_sign),
        ("q0_from_successes", "beta left out", q0_no_beta),
        ("cumulative_q", "A_t sign flipped", q_sign),
        ("cumulative_q", "beta left out of A_t", q_no_beta),
        ("cumulative_q", "not cumulative: Q_t = Q0 + A_t", q_not_cumulative),
        ("cumulative_q", "divided by the length", q_over_length),
        ("cumulative_q", "padding not masked", q_no_mask),
        ("cumulative_q", "Q_t before token t (exclusive sum)", q_exclusive),
        ("cumulative_q", "Q0_hat left out", q_no_q0),
        ("ce_loss", "the target's entropy not subtracted", ce_no_entropy),
        ("ce_loss", "no clip at -eps", ce_no_clip),
        ("ce_loss", "no relu on the success term", ce_no_relu),
        ("ce_loss", "clip without the straight-through gradient", ce_clip_without_straight_through),
        ("spo_loss", "a sum over trajectories, not the mean", spo_sum_over_trajectories),
        ("spo_loss", "nonterminal: a mean over tokens", spo_nonterminal_mean_over_tokens),
        ("spo_loss", "nonterminal: targets R_t not detached", spo_nonterminal_targets_not_detached),
        ("spo_loss", "advantage regression not sigmoid-warped", spo_advantage_unwarped),
        ("spo_loss", "terminal: Q_T - Q0 regressed on r", spo_terminal_regresses_q_t_minus_q0),
    ],
}
MODULES = {"sft": sft, "rloo": rloo, "topr": topr, "agro": agro, "spo": spo}


def stubs(name):
    """A student's blank function, three ways."""
    def raises(*args, **kwargs):
        raise NotImplementedError

    def returns_none(*args, **kwargs):
        return None

    def returns_zeros(*args, **kwargs):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None:  # a function of numbers (lr_lambda)
            return 0.0
        return torch.zeros(()) if name.endswith("loss") else torch.zeros_like(first)
    return [("blank: raise NotImplementedError", raises), ("blank: pass (None)", returns_none),
            ("blank: returns zeros", returns_zeros)]


class Report:
    """A pytest plugin that keeps each failed test's name and the first line of its message."""
    def __init__(self):
        self.failed, self.passed = {}, 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            text = str(report.longrepr.reprcrash.message if hasattr(report.longrepr, "reprcrash")
                       else report.longrepr)
            self.failed[report.nodeid.split("::")[-1]] = text.strip().splitlines()[0][:150]


def run_paper_tests(algo, first_only=False):
    report = Report()
    args = [os.path.join(ROOT, "tests", f"test_{algo}.py"), "-m", "paper", "-p",
            "no:cacheprovider", "-p", "no:terminal"]
    pytest.main(args + (["-x"] if first_only else []), plugins=[report])
    return report


def main(argv):
    show_stubs = "--stubs" in argv
    algos = [a for a in argv if a in MODULES] or list(MODULES)
    torch.set_num_threads(1)
    for algo in algos:
        module = MODULES[algo]
        base = run_paper_tests(algo)
        print(f"\n=== {algo}.py: {base.passed} -m paper tests pass, {len(base.failed)} fail "
              "as written")
        cases = [(name, what, fn, False) for name, what, fn in MISTAKES[algo]]
        if show_stubs:
            names = dict.fromkeys(name for name, _, _ in MISTAKES[algo])
            cases += [(name, what, fn, True) for name in names for what, fn in stubs(name)]
        for name, what, fn, stub in cases:
            setattr(module, name, fn)
            try:
                report = run_paper_tests(algo, first_only=stub)
            finally:
                setattr(module, name, REAL[algo][name])
            if stub:
                first = next(iter(report.failed.values()), "NOT CAUGHT")
                print(f"{name}: {what}\n    -> {first}")
                continue
            flag = "" if len(report.failed) >= 2 else "   <-- fewer than 2"
            print(f"{name}: {what}: {len(report.failed)} failing{flag}")
            for test, message in report.failed.items():
                print(f"    {test}: {message}")


if __name__ == "__main__":
    main(sys.argv[1:])
