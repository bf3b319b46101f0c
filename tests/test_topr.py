"""topr.py's tests. First the paper's claims on pure functions (marked `paper`: no model, seconds;
`python -m pytest -q -m paper tests/test_topr.py` runs them alone), each naming its equation: the
taper (Eq. 11), alpha in log space (Eq. 7), the one loss path and Eq. 8, R - c and [CR] Eq. 4, p~
(Eq. 12), the tabular collapse of naive REINFORCE (Prop. 3.2), Anna Karenina selection (§4.3).
Then the tiny model end to end: the data file, --data reuse, resume after a kill (SIGKILL of a real
process) or Ctrl-C, non-finite losses, bad files and flags.

Graded (a teacher blanks these in topr.py; the -m paper tests grade a student's version):
in_t_plus (Eq. 7's set T+), truncated_ratio (Eq. 7's alpha = [pi/mu]_a^b in log space) and
topr_loss (Eq. 7, Eq. 8 with TOPR's limits). The expected values are written out in the tests,
never computed with a function of topr.py; a blank function fails with a message naming its
equation (GRADED, tests/conftest.py); python tests/grading_check.py topr lists which tests catch
which likely mistake.

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement
       learning for LLMs", 2025, arXiv:2503.14286.
[CR]   the course report "Off-Policy Finetuning for LLM Math Reasoning"."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import common
import topr
from conftest import run_until_killed, write_jsonl

# The functions a student writes: (equation, whether its result carries the gradient)
GRADED = (topr, {"in_t_plus": ("[TOPR] Eq. 7's set T+ (R - c >= split)", False),
                 "truncated_ratio": ("[TOPR] Eq. 7's alpha = [pi/mu]_a^b", False),
                 "topr_loss": ("[TOPR] Eq. 7 (Eq. 8 with TOPR's limits)", True)})
LIMIT_SETS = [topr.LIMITS[name] for name in ("topr", "naive", "tis", "is", "sft")] + [
    (0.5, 2.0, 0.2, 3.0)]


def taper(u: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """The taper rho(u; a, b) of [TOPR] Eq. 11, for u = pi/mu > 0 and 0 <= a <= b <= inf.

    rho(u) = a (1 + ln(u/a)) if u < a;  b (1 + ln(u/b)) if u > b;  u otherwise.
    It is continuous with u rho'(u) = [u]_a^b, so the gradient of sum mu rho(pi/mu) R is Eq. 7.
    Limits: a = 0 has no lower branch, b = inf no upper one, b = 0 gives rho = 0 (the b -> 0 limit).
    """
    lower = a * (1 + torch.log(u / a)) if a > 0 else u
    if 0 < b < math.inf:
        upper = b * (1 + torch.log(u / b))
    else:
        upper = u if b == math.inf else torch.zeros_like(u)
    return torch.where(u < a, lower, torch.where(u > b, upper, u))


def c_for_p_tilde(p: float, p_tilde: float) -> float:
    """The inverse of [TOPR] Eq. 12 (solved for c): the baseline c that gives p~ from a true share
    p of positives."""
    return (p - p_tilde) / (p + p_tilde - 2 * p * p_tilde)


def _batch(seed=0, n=6, t=7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 5, (n, t), generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).double()
    lp_mu = -torch.rand(n, generator=g, dtype=torch.float64) * 10
    return logits, ids, mask, lp_mu


def _token_logprobs(logits, ids, mask):
    return torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1) * mask


def eq8_written_out(lp, mask, lp_mu, rewards, c=0.0, split=0.0, norm="seq/len"):
    """[TOPR] Eq. 8 as the paper writes it: R - c on T+, sg([pi/mu]_0^1) (R - c) on T-, then
    -1/N sum_i weight_i LP_i, each LP_i over its length T_i (seq/len), or per token (token).
    Written out in full: no function of topr.py."""
    r_minus_c = rewards - c
    ratio = torch.exp(torch.clamp((lp.detach() * mask).sum(-1) - lp_mu, max=0.0))  # [pi/mu]_0^1
    weight = torch.where(r_minus_c >= split, r_minus_c, ratio * r_minus_c)  # T+ sum, T- sum
    if norm == "token":
        return -(weight[:, None] * lp * mask).sum() / mask.sum()
    seq = (lp * mask).sum(-1)  # LP_i
    if norm == "seq/len":
        seq = seq / mask.sum(-1)
    return -(weight * seq).mean()


def _tabular_run(limits, steps, seed=0, lr=0.1):
    """5 arms, mu = softmax(N(0,1)), R = [1,-1,-1,1,-1], pi starts at mu; exact full-batch gradient
    ascent of Eq. 7 computed through topr_loss."""
    g = torch.Generator().manual_seed(seed)
    mu_logits = torch.randn(5, generator=g, dtype=torch.float64)
    mu = torch.softmax(mu_logits, 0)
    R = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    theta = mu_logits.clone().requires_grad_(True)
    ones = torch.ones(5, 1, dtype=torch.float64)
    for _ in range(steps):
        loss = topr.topr_loss(torch.log_softmax(theta, 0)[:, None], ones, torch.log(mu),
                              5 * mu * R, norm="seq", limits=limits)
        (grad,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * grad
    pi = torch.softmax(theta.detach(), 0)
    naive_objective = (mu * R * torch.log(pi)).sum().item()  # Eq. 4
    u = pi / mu
    j_topr = sum((mu[i] * taper(u[i:i + 1], *(limits[:2] if R[i] >= 0 else limits[2:]))
                  * R[i]).item() for i in range(5))  # Eq. 11
    return theta.detach(), pi, mu, grad.norm().item(), naive_objective, j_topr


# --------------------------------------------------------------------------------------------------
# The papers' claims on pure functions (pytest -m paper): no model, seconds
# --------------------------------------------------------------------------------------------------
@pytest.mark.paper
def test_taper_values_at_and_around_its_limits():
    """Eq. 11: rho(u; a, b) is u inside [a, b], continuous at a and b, and 1 + ln u <= u for the
    canonical positives (a = b = 1)."""
    a, b = 0.5, 2.0
    u = torch.tensor([a, b, 1.0, a * math.exp(-1), b * math.e, a - 1e-9, a + 1e-9, b - 1e-9,
                      b + 1e-9], dtype=torch.float64)
    rho = taper(u, a, b)
    assert rho[:3].tolist() == [a, b, 1.0]                    # identity inside [a, b]
    assert rho[3].item() == pytest.approx(0.0, abs=1e-12)     # a (1 + ln(1/e)) = 0
    assert rho[4].item() == pytest.approx(2 * b)              # b (1 + ln e) = 2b
    assert torch.allclose(rho[5:], u[5:], atol=1e-8)          # continuous at both limits
    small = torch.tensor([1e-30, 0.3])
    assert taper(small, 0.0, 1.0).tolist() == pytest.approx([1e-30, 0.3])   # a = 0
    assert taper(torch.tensor([1e6]), 0.0, math.inf).item() == 1e6           # b = inf
    # canonical positives (a = b = 1): 1 + ln u <= u, so J_TOPR <= J for R >= 0
    u = torch.logspace(-5, 5, 101, dtype=torch.float64)
    assert torch.all(taper(u, 1.0, 1.0) <= u + 1e-12)


@pytest.mark.paper
@pytest.mark.parametrize("a,b", [(1.0, 1.0), (0.0, 1.0), (0.0, math.inf), (0.5, 2.0), (0.0, 0.0)])
def test_u_times_taper_derivative_is_the_clamp(a, b):
    """Eq. 11 -> Eq. 7: u rho'(u; a, b) = [u]_a^b, so the taper's gradient is the truncated one."""
    u = torch.logspace(-3, 3, 61, dtype=torch.float64).requires_grad_(True)
    if b == 0.0:  # rho(u; 0, 0) = 0 * (...) is the constant 0: the "dropped negatives" of SFT
        assert torch.all(taper(u.detach(), 0.0, 0.0) == 0)
        return
    (grad,) = torch.autograd.grad(taper(u, a, b).sum(), u)
    assert torch.allclose(u.detach() * grad, u.detach().clamp(a, b), atol=1e-12)


@pytest.mark.paper
@pytest.mark.parametrize("limits", LIMIT_SETS)
def test_taper_objective_gradient_is_eq7_and_the_loss_gives_it(limits):
    """Tabular: the autograd gradient of J = sum_y mu rho(pi/mu) R (Eq. 11) equals Eq. 7,
    sum_y mu [pi/mu]_a^b R grad log pi, and so does topr_loss on the full 'dataset' weighted by
    mu."""
    a_pos, b_pos, a_neg, b_neg = limits
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True)
    mu = torch.softmax(torch.randn(8, generator=g, dtype=torch.float64), 0)
    R = torch.tensor([1.0, -1.0, 0.5, -0.3, 1.0, -1.0, 0.2, -2.0], dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    u = pi / mu
    J = sum(mu[i] * taper(u[i:i + 1], *((a_pos, b_pos) if R[i] >= 0 else (a_neg, b_neg)))
            * R[i] for i in range(8))
    (g_rho,) = torch.autograd.grad(J.sum(), theta)
    logpi = torch.log_softmax(theta, 0)
    clamp = torch.stack([u[i].detach().clamp(*((a_pos, b_pos) if R[i] >= 0 else (a_neg, b_neg)))
                         for i in range(8)])
    (g_eq7,) = torch.autograd.grad((mu * clamp * R * logpi).sum(), theta)
    assert torch.allclose(g_rho, g_eq7, atol=1e-8)
    # the minibatch loss on one-token "sequences", rewards scaled by 8 mu (> 0, so no sign changes)
    ones = torch.ones(8, 1, dtype=torch.float64)
    loss = topr.topr_loss(torch.log_softmax(theta, 0)[:, None], ones, torch.log(mu), 8 * mu * R,
                          norm="seq", limits=limits)
    (g_loss,) = torch.autograd.grad(loss, theta)
    assert torch.allclose(-g_loss, g_eq7, atol=1e-8)


@pytest.mark.paper
def test_alpha_is_the_ratio_clamped_to_table1s_limits():
    """Eq. 7: alpha = [pi/mu]_a^b, formed in log space, with the limits of Table 1 (LIMITS)."""
    neg, pos = torch.tensor([False]), torch.tensor([True])
    def ratio(log_ratio, positive, loss):
        return topr.truncated_ratio(torch.tensor([log_ratio], dtype=torch.float64), positive,
                                    *topr.LIMITS[loss]).item()
    assert ratio(-1.0, neg, "topr") == pytest.approx(math.exp(-1), abs=1e-12)      # 0.3679
    assert ratio(-1.0, pos, "topr") == 1.0                    # positives: SFT
    assert ratio(0.7, neg, "topr") == 1.0                     # capped at b- = 1
    assert ratio(0.7, neg, "is") == pytest.approx(math.exp(0.7))
    assert ratio(0.7, neg, "sft") == 0.0                      # negatives dropped
    assert ratio(-50.0, neg, "naive") == 1.0


@pytest.mark.paper
def test_log_space_ratio_is_finite_for_1000_token_sequences():
    """Eq. 7's alpha in log space: LP = -6000 (1,000 tokens of -6), LP_mu = -6001: pi/mu = e, so
    alpha = 1 for a negative; exp(LP) would be 0/0 in linear space."""
    logprobs = torch.full((2, 1000), -6.0, requires_grad=True)
    mask = torch.ones(2, 1000)
    lp_mu = torch.tensor([-6001.0, -5000.0])
    rewards = torch.tensor([-1.0, -1.0])
    log_ratio = (logprobs.detach() * mask).sum(-1) - lp_mu
    alpha = topr.truncated_ratio(log_ratio, topr.in_t_plus(rewards, 0.0, 0.0), *topr.LIMITS["topr"])
    assert alpha[0].item() == 1.0 and alpha[1].item() == 0.0  # e^-1000 underflows to 0, not NaN
    loss = topr.topr_loss(logprobs, mask, lp_mu, rewards)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    assert loss.item() == pytest.approx(-(1.0 * -1 * -6.0) / 2)  # seq/len: LP/T = -6; second term 0


@pytest.mark.paper
@pytest.mark.parametrize("tokens", [2, 1000])
def test_alpha_depends_on_lp_minus_lp_mu_alone_even_for_1000_tokens(tokens):
    """Eq. 7's alpha in log space, by hand: three sequences of `tokens` tokens with LP - LP_mu =
    (-1, 0.5, -2), R = (-1, -1, 1). alpha = (e^-1, 1, 1): a negative's ratio below 1, a negative's
    capped at b- = 1, a positive's at 1 (T+). With norm "seq" the gradient on every token of y_i is
    -alpha_i R_i / 3, whatever LP is: at 1,000 tokens (LP = -900) too, where a ratio formed in
    linear space, exp(LP) / exp(LP_mu), is 0/0."""
    logprobs = torch.full((3, tokens), -0.9, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, tokens, dtype=torch.float64)
    lp_mu = -0.9 * tokens - torch.tensor([-1.0, 0.5, -2.0], dtype=torch.float64)
    rewards = torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64)
    topr.topr_loss(logprobs, mask, lp_mu, rewards, norm="seq").backward()
    alpha = torch.tensor([math.exp(-1), 1.0, 1.0], dtype=torch.float64)
    expected = (-alpha * rewards / 3)[:, None].expand(3, tokens)
    assert torch.isfinite(logprobs.grad).all(), (
        "topr_loss: a NaN gradient at LP = -900: is pi/mu formed in linear space (Eq. 7 needs "
        "exp(LP - LP_mu), never exp(LP))?")
    assert torch.allclose(logprobs.grad, expected, atol=1e-12), (
        f"topr_loss: gradient rows {logprobs.grad[:, 0].tolist()}, Eq. 7 gives -alpha_i R_i / N = "
        f"{expected[:, 0].tolist()} (alpha = (e^-1, 1, 1): [pi/mu]_0^1 on T-, 1 on T+)")


@pytest.mark.paper
@pytest.mark.parametrize("norm", ["seq/len", "seq", "token"])
def test_one_loss_path_with_topr_limits_is_eq8s_two_sums(norm):
    """Eq. 8: topr_loss (Eq. 7 with LIMITS["topr"], the one loss path) and Eq. 8's two sums written
    out give the same loss and gradient, with and without a baseline and split; the other limits of
    Table 1 differ on the same batch."""
    logits, ids, mask, lp_mu = _batch(seed=5)
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 0.1], dtype=torch.float64)
    for kw in ({}, {"c": -0.8}, {"c": 0.5}, {"c": 0.0, "split": 1.0}):
        lp = _token_logprobs(logits, ids, mask)
        mu = lp.detach().sum(-1) + torch.tensor([0.5, -0.5, 2.0, 1.0, -3.0, 0.2])  # ratios >, < 1
        canonical = eq8_written_out(lp, mask, mu, rewards, norm=norm, **kw)
        (g1,) = torch.autograd.grad(canonical, logits)
        lp = _token_logprobs(logits, ids, mask)
        general = topr.topr_loss(lp, mask, mu, rewards, norm=norm, limits=topr.LIMITS["topr"], **kw)
        (g2,) = torch.autograd.grad(general, logits)
        torch.testing.assert_close(general, canonical, rtol=0, atol=1e-12)
        torch.testing.assert_close(g2, g1, rtol=0, atol=1e-12)
        for other in ("naive", "tis", "sft"):
            value = topr.topr_loss(_token_logprobs(logits, ids, mask), mask, mu, rewards, norm=norm,
                                   limits=topr.LIMITS[other], **kw).item()
            assert abs(value - canonical.item()) > 1e-6, other


@pytest.mark.paper
def test_all_positive_data_is_reward_weighted_sft_in_value_and_gradient():
    """Eq. 8 on T+ alone: a+ = b+ = 1 and R >= 0: loss and gradient equal -mean_i R_i LP_i / T_i,
    whatever LP_mu."""
    logits, ids, mask, lp_mu = _batch()
    rewards = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.1], dtype=torch.float64)
    for mu in (lp_mu, lp_mu - 300.0, torch.zeros_like(lp_mu)):
        lp = _token_logprobs(logits, ids, mask)
        loss = topr.topr_loss(lp, mask, mu, rewards)
        (g1,) = torch.autograd.grad(loss, logits)
        lp = _token_logprobs(logits, ids, mask)
        sft = -(rewards * lp.sum(-1) / mask.sum(-1)).mean()
        (g2,) = torch.autograd.grad(sft, logits)
        assert loss.item() == pytest.approx(sft.item(), abs=1e-12)
        assert torch.allclose(g1, g2, atol=1e-12)


@pytest.mark.paper
def test_loss_normalisations_and_split_on_hand_computed_tensors():
    """Eq. 8 by hand: seq, seq/len (Algorithm 1's LP / |y|) and token; a baseline c (Eqs. 9-10),
    the split at 1 ([CR] Eq. 4); right-padding changes nothing."""
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    lp_mu = torch.tensor([-3.0, -2.0])  # log_ratio = [0, -1]
    r = torch.tensor([1.0, -1.0])
    e = math.exp(-1)
    def loss(rewards, **kw):
        return topr.topr_loss(logprobs, mask, lp_mu, rewards, **kw).item()
    assert loss(r, norm="seq") == pytest.approx(-(-3 + e * 3) / 2)
    assert loss(r, norm="seq/len") == pytest.approx(-(-1.5 + e * 3) / 2)
    assert loss(r, norm="token") == pytest.approx(-(-3 + e * 3) / 3)
    # c = 0.5: R - c = [0.5, -1.5]; split 1 ([CR] Eq. 4): R = 0.5 < 1 is truncated, R = 1 is not
    assert loss(r, c=0.5, norm="seq") == pytest.approx(-(0.5 * -3 + e * -1.5 * -3) / 2)
    r01 = torch.tensor([1.0, 0.1])
    assert loss(r01, norm="seq", split=1.0) == pytest.approx(-(1.0 * -3 + e * 0.1 * -3) / 2)
    assert loss(r01, norm="seq", split=0.0) == pytest.approx(-(1.0 * -3 + 0.1 * -3) / 2)
    # right-padding changes nothing
    pad = torch.cat([logprobs, torch.zeros(2, 4)], 1), torch.cat([mask, torch.zeros(2, 4)], 1)
    for norm in ("seq", "seq/len", "token"):
        assert topr.topr_loss(*pad, lp_mu, r, norm=norm).item() == pytest.approx(
            topr.topr_loss(logprobs, mask, lp_mu, r, norm=norm).item(), abs=1e-7)


@pytest.mark.paper
def test_split_is_by_r_minus_c_not_by_r():
    """Eqs. 9-10 with Eq. 7's sets: c = 0.5, R = [1, 0.1]: R - c = [0.5, -0.4] puts the second
    sample in T- (truncated, alpha = e^-1); a split by R alone (R >= 0) would give it alpha = 1.
    With split 1 and R = [1, 1.4], R - c = [0.5, 0.9]: both are in T-, though R >= 1 for both."""
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    lp_mu = torch.tensor([-2.0, -3.0], dtype=torch.float64)  # log_ratio = [-1, -1]
    e = math.exp(-1)
    r = torch.tensor([1.0, 0.1], dtype=torch.float64)
    by_r_minus_c = -(1.0 * 0.5 * -3 + e * -0.4 * -4) / 2
    by_r = -(1.0 * 0.5 * -3 + 1.0 * -0.4 * -4) / 2
    loss = topr.topr_loss(logprobs, mask, lp_mu, r, c=0.5, norm="seq").item()
    assert loss == pytest.approx(by_r_minus_c) and loss != pytest.approx(by_r)
    r = torch.tensor([1.0, 1.4], dtype=torch.float64)
    loss = topr.topr_loss(logprobs, mask, lp_mu, r, c=0.5, norm="seq", split=1.0).item()
    assert loss == pytest.approx(-(e * 0.5 * -3 + e * 0.9 * -4) / 2)
    assert loss != pytest.approx(-(0.5 * -3 + 0.9 * -4) / 2)


@pytest.mark.paper
def test_task_rewards_default_to_the_reports_eq4():
    """[CR] Eq. 4: grad = E_{R=1}[R grad log pi] + E_{R<1}[[pi/mu]_0^1 R grad log pi], no baseline.
    The default (c, split) for the task's rewards gives exactly that loss, and leaves negatives,
    where the pm1 default c = -0.8 (split 0) would put every sample of reward A in T+."""
    def default_baseline(reward):  # (c, split) that parse_args gives a run of this reward
        args = topr.parse_args(["--reward", reward])[1]
        return args.c, args.split
    assert default_baseline("pm1") == (-0.8, 0.0)
    for variant in ("original", "A", "B", "A+B"):
        assert default_baseline(variant) == (0.0, 1.0)
    c, split = default_baseline("A")
    logits, ids, mask, lp_mu = _batch(seed=3)
    rewards = torch.tensor([1.0, 0.1, 0.1, -0.006, 1.0, -0.0003], dtype=torch.float64)  # reward A
    lp = _token_logprobs(logits, ids, mask)
    seq = lp.sum(-1)
    ratio = torch.exp(seq.detach() - lp_mu).clamp(0, 1)
    eq4 = -(torch.where(rewards == 1, rewards, ratio * rewards) * seq / mask.sum(-1)).mean()
    loss = topr.topr_loss(lp, mask, lp_mu, rewards, c=c, split=split)
    (g1,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(eq4, logits)
    assert loss.item() == pytest.approx(eq4.item(), abs=1e-12)
    assert torch.allclose(g1, g2, atol=1e-12)
    assert (~topr.in_t_plus(rewards, -0.8, 0.0)).double().mean() == 0.0  # the old default: none
    assert (~topr.in_t_plus(rewards, c, split)).double().mean().item() == pytest.approx(4 / 6)


@pytest.mark.paper
def test_effective_positive_share_values():
    """Eq. 12 by hand: p = 0.1: c = 0 -> 0.1, c = -1 -> 1, c = 0.5 -> 0.0357; p = 0.5, c = 0.7 ->
    0.15; the multi-level p~ of docs/DERIVATIONS.md reduces to Eq. 12 on +1/-1 data."""
    assert topr.p_tilde_pm1(0.1, 0.0) == pytest.approx(0.1)
    assert topr.p_tilde_pm1(0.1, -1.0) == pytest.approx(1.0)
    assert topr.p_tilde_pm1(0.1, 0.5) == pytest.approx(0.0357, abs=5e-5)
    assert topr.p_tilde_pm1(0.5, 0.7) == pytest.approx(0.15)
    rewards = [1.0] * 10 + [-1.0] * 90  # p = 0.1: the multi-level formula is Eq. 12 on +1/-1 data
    for c in (-0.5, 0.0, 0.3, 0.5, 0.9):
        assert topr.effective_positive_share(rewards, c) == pytest.approx(topr.p_tilde_pm1(0.1, c))
        assert c_for_p_tilde(0.1, topr.p_tilde_pm1(0.1, c)) == pytest.approx(c)
    # two levels r+ > c > r-: p (r+ - c) / (p (r+ - c) + (1-p)(c - r-))
    rewards = [1.0] * 3 + [0.1] * 7
    assert topr.effective_positive_share(rewards, 0.5) == pytest.approx(
        0.3 * 0.5 / (0.3 * 0.5 + 0.7 * 0.4))


@pytest.mark.paper
def test_effective_positive_share_for_several_reward_levels():
    """Eq. 12 for several reward levels (docs/DERIVATIONS.md): at pi = mu the update is
    sum_i (R_i - c) grad log pi(y_i); p~ is the share of sum_i |R_i - c| carried by samples with
    R_i > c:
    sum_k p_k (r_k - c)^+ / sum_k p_k |r_k - c| over the reward levels r_k with shares p_k. Reward
    B's four levels, then [CR] Eq. 4 (c = 0) on the original reward, where nothing is pushed down
    (p~ = 1), then a baseline between levels."""
    levels, shares = [1.0, 0.0, -0.1, -0.2], [0.3, 0.2, 0.3, 0.2]
    rewards = [r for r, p in zip(levels, shares) for _ in range(round(100 * p))]
    assert topr.effective_positive_share(rewards, 0.0) == pytest.approx(0.3 / (0.3 + 0.03 + 0.04))
    c = -0.15
    up = 0.3 * 1.15 + 0.2 * 0.15 + 0.3 * 0.05
    assert topr.effective_positive_share(rewards, c) == pytest.approx(up / (up + 0.2 * 0.05))
    original = [1.0] * 30 + [0.1] * 50 + [0.0] * 20
    assert topr.effective_positive_share(original, 0.0) == 1.0
    assert topr.effective_positive_share(original, 0.5) == pytest.approx(
        0.3 * 0.5 / (0.3 * 0.5 + 0.5 * 0.4 + 0.2 * 0.5))


@pytest.mark.paper
def test_naive_reinforce_collapses_and_topr_stays_bounded():
    """Prop. 3.2: naive REINFORCE (Eqs. 3-4) collapses off-policy, TOPR stays bounded. Seed 2 draws
    mu with more mass on negatives (0.71) than on positives. Seen: naive logit range 110 at 1k
    steps, 560 at 5k, |g| = 0.83 throughout; TOPR range 7.2, |g| = 2.4e-3, negatives at 7e-4."""
    theta_1k = _tabular_run(topr.LIMITS["naive"], 1000, seed=2)[0]
    theta, pi, mu, gnorm, naive_obj, _ = _tabular_run(topr.LIMITS["naive"], 5000, seed=2)
    spread_1k, spread = (theta_1k.max() - theta_1k.min()).item(), (theta.max() - theta.min()).item()
    assert spread > 300 and spread > 4 * spread_1k  # logits run away, linearly in the steps
    assert gnorm > 0.5                          # and the gradient never vanishes: it keeps pushing
    assert pi[[1, 2, 4]].max() < 1e-100         # every negative arm's probability goes to 0 ...
    assert pi[3] < 1e-100                       # ... and even the less likely positive arm dies
    assert naive_obj > 100                      # Eq. 4 grows without bound

    theta, pi, mu, gnorm, _, j_topr = _tabular_run(topr.LIMITS["topr"], 5000, seed=2)
    assert (theta.max() - theta.min()).item() < 10 and gnorm < 1e-2
    assert pi[[1, 2, 4]].max() < 2e-3           # negatives are unlearned, but gently
    ratio_pi, ratio_mu = (pi[0] / pi[3]).item(), (mu[0] / mu[3]).item()
    assert ratio_pi == pytest.approx(ratio_mu, rel=0.05)  # positives keep mu's proportions
    # Prop. 3.2: J_TOPR <= sum_{T+} mu (1 + ln(pi/mu)) <= sum_{T+} mu (1 + ln(1/mu)) whatever pi
    assert j_topr <= (mu[[0, 3]] * (1 - torch.log(mu[[0, 3]]))).sum().item()


@pytest.mark.paper
def test_anna_karenina_keeps_the_first_positive_of_each_prompt():
    """[TOPR] §4.3: the first correct sample of each prompt, every incorrect one; `keep` fills the
    rest with random negatives; uniform keeps `keep` at random."""
    grades = ["correct", "wrong", "correct", "no_answer", "wrong", "wrong", "wrong", "wrong"]
    rows = [{"prompt_index": i // 4, "grade": g} for i, g in enumerate(grades)]
    kept = topr.select(rows, "anna-karenina", 0, np.random.default_rng(0))
    assert [r["grade"] for r in kept] == ["correct", "wrong", "no_answer"] + ["wrong"] * 4
    assert kept[0] is rows[0]
    kept = topr.select(rows, "anna-karenina", 3, np.random.default_rng(0))
    assert len(kept) == 3 and kept[0] is rows[0] and all(r["grade"] != "correct" for r in kept[1:])
    assert len(topr.select(rows, "uniform", 5, np.random.default_rng(0))) == 5


@pytest.mark.paper
def test_a_plus_b_is_a_for_the_first_half_of_all_epochs_then_b():
    """[CR] §5.1, "Reward B TOPR after using Reward A": variant_at over all epochs of a run."""
    assert [topr.variant_at("A+B", e, 4) for e in range(4)] == ["A", "A", "B", "B"]


# --------------------------------------------------------------------------------------------------
# End to end on the tiny model: --report-variant, the data file, --data reuse, LP_mu, resume
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["original", "A", "A+B"])
def test_report_variant_is_one_command_for_eq4_in_the_reports_setting(variant, tiny_path, capsys):
    """--report-variant V: reward V, c = 0, split 1 and whole-sequence log pi ([CR] Eq. 4), a
    dataset of 1,000 completions at T = 0.15, top-p 0.85 (§4.1), batch 32, two epochs (A+B: a round
    of A, then a round of B on data sampled from A's model); an explicit flag wins; a different
    --reward is refused."""
    args = topr.parse_args(["--report-variant", variant])[1]
    assert (args.reward, args.c, args.split, args.loss_norm) == (variant, 0.0, 1.0, "seq")
    assert (args.iterations, args.prompts * args.group_size, args.batch_size, args.epochs) == (
        2 if variant == "A+B" else 1, 1000, 32, 2)
    assert (args.temperature, args.top_p) == (0.15, 0.85)
    assert topr.parse_args(["--report-variant", variant, "--epochs", "4"])[1].epochs == 4
    with pytest.raises(SystemExit) as e:
        topr.main(["--report-variant", variant, "--reward", "B", "--model", tiny_path])
    assert e.value.code == 2 and "--report-variant" in capsys.readouterr().err.splitlines()[-1]


RUN = ["--engine", "hf", "--threads", "1", "--seed", "0", "--sizes", "3", "--eval-sizes", "3",
       "--prompts", "6", "--group-size", "4", "--train-size", "50", "--max-new-tokens", "12",
       "--batch-size", "8", "--eval-size", "3", "--eval-k", "2", "--lr", "1e-3",
       "--reward", "original", "--c", "0.05"]


def _weights(run_dir, name="final"):
    return AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, name)).state_dict()


def _same(a, b, atol=1e-6):
    return all(torch.allclose(a[k], b[k], atol=atol) for k in a)


def _rows(path):
    return [json.loads(line) for line in open(path)]


def _metrics(run_dir):
    """metrics.jsonl without the wall-clock fields."""
    return [{k: v for k, v in m.items() if k not in ("time", "time_step")}
            for m in _rows(os.path.join(run_dir, "metrics.jsonl"))]


def test_run_writes_its_data_and_data_reuse_trains_identically(tiny_path, tmp_path):
    out = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2",
                           "--out", str(tmp_path / "a")])
    rows = _rows(os.path.join(out, "data-0.jsonl"))
    assert len(rows) == 6 * 4
    assert {"problem", "prompt_ids", "completion_ids", "completion", "reward", "grade",
            "lp_mu"} <= set(rows[0])
    # the stored behaviour log-probs are the sampled model's own (T = 1): recomputing them agrees
    model, tok = common.load_model(tiny_path)
    lp, mask = common.completion_logprobs(model, [r["prompt_ids"] for r in rows],
                                          [r["completion_ids"] for r in rows], tok.pad_token_id)
    assert torch.allclose((lp * mask).sum(-1), torch.tensor([r["lp_mu"] for r in rows]), atol=1e-3)
    metrics = _rows(os.path.join(out, "metrics.jsonl"))
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4, 5, 6]
    assert abs(metrics[1]["log_ratio"]) < 1e-4    # pi = mu at the first step: every ratio is 1
    assert "eval3/sampled/accuracy" in metrics[-1]
    start = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    assert not _same(_weights(out), start)  # it trained

    data = os.path.join(out, "data-0.jsonl")
    again = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2",
                             "--data", data, "--out", str(tmp_path / "b")])
    assert _same(_weights(out), _weights(again))
    # a file from elsewhere without behaviour log-probs (nor rewards or grades): mu is taken as the
    # starting model at T = 1, which is what sampled these data, so training is the same again.
    # (Token ids are kept: the random tiny model emits ids that do not survive a decode/encode round
    # trip.)
    bare = tmp_path / "bare.jsonl"
    keys = ("problem", "completion", "prompt_ids", "completion_ids")
    bare.write_text("".join(json.dumps({k: r[k] for k in keys}) + "\n" for r in rows))
    third = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2",
                             "--data", str(bare), "--out", str(tmp_path / "c")])
    assert _same(_weights(out), _weights(third), atol=1e-4)  # seen: 2e-5


def test_interrupted_then_resumed_run_equals_an_uninterrupted_one(tiny_path, tmp_path, monkeypatch):
    args = RUN + ["--model", tiny_path, "--iterations", "2", "--save-every", "2",
                  "--sampling", "anna-karenina"]
    straight = topr.main(args + ["--out", str(tmp_path / "a")])

    # killed in the second iteration, after its data were written
    run_until_killed(topr.main, args + ["--out", str(tmp_path / "b")], monkeypatch, step=5)
    resumed = topr.main(["--resume", str(tmp_path / "b")])
    assert _same(_weights(straight), _weights(resumed))
    assert _rows(os.path.join(straight, "data-1.jsonl")) == \
        _rows(os.path.join(resumed, "data-1.jsonl"))
    assert [m["step"] for m in _rows(os.path.join(resumed, "metrics.jsonl"))] == \
        [m["step"] for m in _rows(os.path.join(straight, "metrics.jsonl"))]


def test_task_reward_run_logs_its_negative_share_and_uses_eq4(tiny_path, tmp_path):
    """--reward A without --c/--split: c = 0, split 1, and every sample that is not fully correct is
    in T- (the old default c = -0.8 put none there)."""
    args = [a for a in RUN if a not in ("--c", "0.05")]
    args[args.index("original")] = "A"
    out = topr.main(args + ["--model", tiny_path, "--iterations", "1",
                            "--out", str(tmp_path / "a")])
    config = json.load(open(os.path.join(out, "config.json")))
    assert (config["c"], config["split"]) == (0.0, 1.0)
    data = _rows(os.path.join(out, "data-0.jsonl"))
    share = sum(r["grade"] != "correct" for r in data) / len(data)
    steps = [m for m in _rows(os.path.join(out, "metrics.jsonl")) if m["step"] > 0]
    assert share > 0 and all(m["negative_share"] == pytest.approx(share) for m in steps)


def test_resume_with_data_lacking_lp_mu_takes_mu_from_the_start_model(tiny_path, tmp_path,
                                                                      monkeypatch):
    """A --data file without lp_mu: mu is the starting model, also when the run resumes in iteration
    0 from a checkpoint (whose weights are not mu)."""
    first = topr.main(RUN + ["--model", tiny_path, "--iterations", "1",
                             "--out", str(tmp_path / "gen")])
    bare = tmp_path / "bare.jsonl"
    keys = ("problem", "completion", "prompt_ids", "completion_ids")
    bare.write_text("".join(json.dumps({k: r[k] for k in keys}) + "\n"
                            for r in _rows(os.path.join(first, "data-0.jsonl"))))
    args = RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2", "--save-every", "2",
                  "--data", str(bare)]
    straight = topr.main(args + ["--out", str(tmp_path / "a")])
    run_until_killed(topr.main, args + ["--out", str(tmp_path / "b")], monkeypatch, step=5)
    resumed = topr.main(["--resume", str(tmp_path / "b")])
    assert _same(_weights(straight), _weights(resumed))


def test_time_limit_stops_training_then_evaluates_and_saves(tiny_path, tmp_path):
    out = topr.main(RUN + ["--model", tiny_path, "--iterations", "3", "--epochs", "2",
                           "--time-limit", "0.001", "--out", str(tmp_path / "run")])
    rows = _rows(os.path.join(out, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1]  # the budget (0.06 s) ran out in the first step
    assert "eval3/sampled/accuracy" in rows[-1] and rows[-1]["samples"] == 8
    assert os.path.isdir(os.path.join(out, "final"))
    assert not os.path.exists(os.path.join(out, "data-1.jsonl"))


# --------------------------------------------------------------------------------------------------
# Faults: a kill at any moment, Ctrl-C, non-finite values, bad files and flags
# --------------------------------------------------------------------------------------------------
KILL_RUN = RUN + ["--iterations", "2", "--save-every", "2"]  # 3 steps an iteration, 6 in all

# Runs topr.main in a real process that SIGKILLs itself at a chosen moment (argv[1]); the hooks only
# decide when, the kill is the operating system's.
KILLER = '''
import json, os, signal, sys
sys.path.insert(0, {repo!r})
import torch
import topr
phase, argv = sys.argv[1], sys.argv[2:]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


real_write, real_clip, real_save, real_replace = (topr.write_jsonl, torch.nn.utils.clip_grad_norm_,
                                                  torch.save, os.replace)
saving, steps = [], []


def write_jsonl(path, rows):  # half of iteration 1's data file written, then killed
    if phase == "data" and path.endswith("data-1.jsonl"):
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(rows[0]) + "\\n" + json.dumps(rows[1])[:40])
        die()
    real_write(path, rows)


def clip_grad_norm_(*a, **kw):  # step 5: gradient computed, weights not yet updated
    steps.append(len(steps) + 1)
    if phase == "mid-step" and steps[-1] == 5:
        die()
    return real_clip(*a, **kw)


def save(obj, path, *a, **kw):  # step 4's checkpoint.pt.tmp half written, then killed
    saving[:] = [obj.get("step")] if isinstance(obj, dict) else []
    real_save(obj, path, *a, **kw)
    if phase == "checkpoint-write" and saving == [4]:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        die()


def replace(src, dst):  # step 4 done and its checkpoint swapped in, step 5 not begun
    real_replace(src, dst)
    if phase == "between-steps" and saving == [4] and dst.endswith("checkpoint.pt"):
        die()


topr.write_jsonl, torch.nn.utils.clip_grad_norm_, torch.save = write_jsonl, clip_grad_norm_, save
os.replace = replace
topr.main(argv)
'''


@pytest.fixture(scope="module")
def straight_run(tiny_path, tmp_path_factory):
    return topr.main(KILL_RUN + ["--model", tiny_path,
                                 "--out", str(tmp_path_factory.mktemp("straight") / "run")])


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["data", "mid-step", "between-steps", "checkpoint-write"])
def test_sigkill_at_any_moment_then_resume_gives_the_uninterrupted_run(phase, straight_run,
                                                                       tiny_path, tmp_path):
    """A real process killed by SIGKILL during iteration 1's data generation (half its file
    written), inside step 5 (after backward), between steps 4 and 5, or while step 4's checkpoint is
    written (half of checkpoint.pt.tmp); `--resume` then ends with exactly the uninterrupted run's
    metrics and weights."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(repo=os.path.dirname(os.path.abspath(topr.__file__))))
    out = str(tmp_path / "run")
    env = {**os.environ, "TORCH_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), phase] + KILL_RUN
                          + ["--model", tiny_path, "--out", out], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not os.path.exists(os.path.join(out, "final"))
    resumed = topr.main(["--resume", out])
    assert _metrics(resumed) == _metrics(straight_run)
    a, b = _weights(straight_run), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_is_a_kill_and_the_last_checkpoint_stands(straight_run, tiny_path, tmp_path,
                                                         monkeypatch):
    """SIGINT during step 3 (no handler: Python's KeyboardInterrupt) stops the run at once; the
    checkpoint on disk is step 2's, and the resumed run equals the uninterrupted one."""
    real_step = topr.topr_step

    def step_then_sigint(*a, **kw):
        if a[-1] == 2:  # steps taken: this is step 3
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(*a, **kw)
    monkeypatch.setattr(topr, "topr_step", step_then_sigint)
    out = str(tmp_path / "run")
    # Python's own handler, whatever this process inherited (a background job ignores SIGINT)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            topr.main(KILL_RUN + ["--model", tiny_path, "--out", out])
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)["step"] == 2
    monkeypatch.setattr(topr, "topr_step", real_step)
    assert _metrics(topr.main(["--resume", out])) == _metrics(straight_run)


def test_non_finite_loss_stops_before_the_optimizer_step(tiny_path, tmp_path, capsys):
    """Untruncated IS (--loss is) on a sample whose lp_mu is far below its log-prob: pi/mu = inf in
    step 2. The run stops there with one line and status 1; the checkpoint on disk is step 1's, with
    finite weights, and no final model is written."""
    gen = topr.main(RUN + ["--model", tiny_path, "--iterations", "1",
                           "--out", str(tmp_path / "gen")])
    rows = _rows(os.path.join(gen, "data-0.jsonl"))
    order = np.random.default_rng([0, 0, 0, 2]).permutation(len(rows))  # plan_epoch's shuffle
    rows[order[8]]["lp_mu"] = -1e5  # the first sample of step 2
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--loss", "is", "--save-every",
                         "1", "--data", bad, "--out", str(out)])
    assert e.value.code == 1
    err = capsys.readouterr().err.replace("\r", "\n")  # progress bars redraw after a "\r"
    last = [line for line in err.splitlines() if line.strip() and "%|" not in line][-1]
    assert "step 2: non-finite" in last and "--lr" in last
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] == 1
    assert all(torch.isfinite(w).all() for w in state["model"].values())
    assert not os.path.exists(out / "final")


@pytest.mark.parametrize("args,content,message", [
    (["--reward", "C"], None, "unknown --reward"),
    (["--group-size", "0"], None, "positive integer"),
    (["--top-p", "1.5"], None, "--top-p"),
    (["--c", "nan"], None, "--c: invalid finite number value: 'nan'"),
    (["--data", "/nonexistent.jsonl"], None, "no such file"),
    (["--problems", "/nonexistent/p.jsonl"], None, "no such file"),
    ([], "not json\n", ":1: bad JSON"),
    ([], '{"problem": {"nums": [1, 2], "target": 3}, "completion": "x"}\n{"problem": {"nu',
     ":2: bad JSON (truncated"),
    ([], '{"completion": "x"}\n', "needs a `problem` object"),
    ([], '{"problem": {"nums": [1, 2]}, "completion": "x"}\n', "is not a countdown problem"),
    ([], '{"problem": {"nums": [1, 2], "target": 3}, "completion": "x", "lp_mu": "a"}\n',
     "lp_mu must be"),
    ([], '{"problem": {"nums": [1, 2], "target": 3}, "completion": "x", "prompt_ids": "ab"}\n',
     "prompt_ids must be a list"),
    ([], "\n", "holds no samples"),
    (["--resume", "/nonexistent/run"], None, "config.json"),
])
def test_bad_input_gives_one_line_and_status_2(args, content, message, tiny_path, tmp_path, capsys):
    if content is not None:
        (tmp_path / "d.jsonl").write_text(content)
        args = args + ["--data", str(tmp_path / "d.jsonl")]
    with pytest.raises(SystemExit) as e:
        topr.main(["--model", tiny_path, "--out", str(tmp_path / "run"), "--engine", "hf",
                   "--train-size", "10", "--eval-size", "2"] + args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("damage", ["no run state", "torn trainer state", "no weights"])
def test_damaged_checkpoint_on_resume_gives_one_line_and_status_2(damage, straight_run, tmp_path,
                                                                   capsys):
    run = tmp_path / "run"
    shutil.copytree(straight_run, run)
    ckpt = run / "checkpoint.pt"  # the run's whole state, one dict
    if damage == "no run state":
        os.remove(ckpt)
    elif damage == "torn trainer state":
        data = ckpt.read_bytes()
        ckpt.write_bytes(data[:len(data) // 2])
    else:
        state = torch.load(ckpt, weights_only=False)
        del state["model"]
        torch.save(state, ckpt)
    with pytest.raises(SystemExit) as e:
        topr.main(["--resume", str(run)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(run) in err.strip().splitlines()[-1]


def test_missing_sft_model_gives_status_2(tmp_path, monkeypatch, capsys):
    """`--model sft` asks for an existing sft.py run (left out, one is trained first:
    tests/test_common.py)."""
    monkeypatch.chdir(tmp_path)  # no runs/ here
    with pytest.raises(SystemExit) as e:
        topr.main(["--model", "sft"])
    assert e.value.code == 2
    assert "no finished sft.py run" in capsys.readouterr().err


# Every flag with each kind of bad value. Either exit status 2 with one error line and no traceback,
# or the run would start (the model load is replaced by a stop: parsing and validation only).
FUZZ_VALUES = ["abc", "-1", "0", "nan", "inf", "", "/nonexistent/x"]
FUZZ_FLAGS = [o for a in topr.parse_args([])[0]._actions for o in a.option_strings
              if o.startswith("--") and o != "--help"]


class _WouldRun(Exception):
    pass


@pytest.mark.parametrize("value", FUZZ_VALUES)
@pytest.mark.parametrize("flag", FUZZ_FLAGS)
def test_cli_fuzz_every_flag(flag, value, tiny_path, tmp_path, monkeypatch, capsys):
    def stop(*a, **kw):
        raise _WouldRun
    monkeypatch.setattr(common, "load_model", stop)
    monkeypatch.chdir(tmp_path)
    argv = ["--model", tiny_path, "--out", str(tmp_path / "run"), "--train-size", "5",
            "--eval-size", "2", flag, value]
    try:
        topr.main(argv)
    except SystemExit as e:
        err = capsys.readouterr().err
        assert e.code == 2 and "Traceback" not in err
        assert "error:" in err.strip().splitlines()[-1]
    except _WouldRun:  # accepted: then every number it holds is finite and in range
        args = topr.parse_args(argv)[1]
        for name in ("c", "lr", "temperature", "top_p", "clip", "time_limit"):
            v = getattr(args, name)
            assert v is None or math.isfinite(v)
        assert args.seed >= 0 and args.keep >= 0 and args.eval_every >= 0
    assert not os.path.exists(tmp_path / "run")


def test_a_bad_data_file_is_refused_before_any_model_is_loaded_or_trained(no_sft_run, capsys):
    """On a clone with no sft.py run, --model defaults to training one first (minutes): a bad
    --data file is found before that, in one line with exit status 2."""
    (no_sft_run / "bad.jsonl").write_text('{"problem": {"nums": [1, 2], "target": 3}}\n')
    with pytest.raises(SystemExit) as e:
        topr.main(["--data", str(no_sft_run / "bad.jsonl"), "--train-size", "10"])
    assert e.value.code == 2
    assert "bad.jsonl:1: needs a `problem` object and a `completion`" in capsys.readouterr().err
