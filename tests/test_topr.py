"""topr.py: the taper, the truncated ratio in log space, the loss against SFT, p~, the tabular collapse of
naive REINFORCE (Prop. 3.2), an end-to-end run with its data file, --data reuse, resume and bad input."""
import json
import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import common
import topr
from conftest import run_until_killed

LIMIT_SETS = [topr.LIMITS[name] for name in ("topr", "naive", "tis", "is", "sft")] + [(0.5, 2.0, 0.2, 3.0)]


# ---------------------------------------------------------------------------------------------------
# The taper rho (Eq. 11) and the truncated ratio
# ---------------------------------------------------------------------------------------------------
def test_taper_values_at_and_around_its_limits():
    a, b = 0.5, 2.0
    u = torch.tensor([a, b, 1.0, a * math.exp(-1), b * math.e, a - 1e-9, a + 1e-9, b - 1e-9, b + 1e-9],
                     dtype=torch.float64)
    rho = topr.taper(u, a, b)
    assert rho[:3].tolist() == [a, b, 1.0]                    # identity inside [a, b]
    assert rho[3].item() == pytest.approx(0.0, abs=1e-12)     # a (1 + ln(1/e)) = 0
    assert rho[4].item() == pytest.approx(2 * b)              # b (1 + ln e) = 2b
    assert torch.allclose(rho[5:], u[5:], atol=1e-8)          # continuous at both limits
    assert topr.taper(torch.tensor([1e-30, 0.3]), 0.0, 1.0).tolist() == pytest.approx([1e-30, 0.3])  # a = 0
    assert topr.taper(torch.tensor([1e6]), 0.0, math.inf).item() == 1e6                           # b = inf
    # canonical positives (a = b = 1): 1 + ln u <= u, so J_TOPR <= J for R >= 0
    u = torch.logspace(-5, 5, 101, dtype=torch.float64)
    assert torch.all(topr.taper(u, 1.0, 1.0) <= u + 1e-12)


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (0.0, 1.0), (0.0, math.inf), (0.5, 2.0), (0.0, 0.0)])
def test_u_times_taper_derivative_is_the_clamp(a, b):
    u = torch.logspace(-3, 3, 61, dtype=torch.float64).requires_grad_(True)
    if b == 0.0:  # rho(u; 0, 0) = 0 * (...) is the constant 0: the "dropped negatives" of SFT
        assert torch.all(topr.taper(u.detach(), 0.0, 0.0) == 0)
        return
    (grad,) = torch.autograd.grad(topr.taper(u, a, b).sum(), u)
    assert torch.allclose(u.detach() * grad, u.detach().clamp(a, b), atol=1e-12)


def test_ratio_on_hand_computed_cases():
    neg, pos = torch.tensor([False]), torch.tensor([True])
    alpha = topr.truncated_ratio(torch.tensor([-1.0], dtype=torch.float64), neg, *topr.LIMITS["topr"])
    assert alpha.item() == pytest.approx(math.exp(-1), abs=1e-12)      # 0.3679 (ALGORITHMS.md §6)
    assert topr.truncated_ratio(torch.tensor([-1.0]), pos, *topr.LIMITS["topr"]).item() == 1.0  # positives: SFT
    assert topr.truncated_ratio(torch.tensor([0.7]), neg, *topr.LIMITS["topr"]).item() == 1.0   # capped at b- = 1
    assert topr.truncated_ratio(torch.tensor([0.7]), neg, *topr.LIMITS["is"]).item() == pytest.approx(math.exp(0.7))
    assert topr.truncated_ratio(torch.tensor([0.7]), neg, *topr.LIMITS["sft"]).item() == 0.0  # negatives dropped
    assert topr.truncated_ratio(torch.tensor([-50.0]), neg, *topr.LIMITS["naive"]).item() == 1.0


def test_log_space_ratio_is_finite_for_1000_token_sequences():
    """LP = -6000 (1,000 tokens of -6), LP_mu = -6001: pi/mu = e, so alpha = 1 for a negative; exp(LP) would
    be 0/0 in linear space."""
    logprobs = torch.full((2, 1000), -6.0, requires_grad=True)
    mask = torch.ones(2, 1000)
    lp_mu = torch.tensor([-6001.0, -5000.0])
    rewards = torch.tensor([-1.0, -1.0])
    lw = (logprobs.detach() * mask).sum(-1) - lp_mu
    alpha = topr.truncated_ratio(lw, rewards >= 0, *topr.LIMITS["topr"])
    assert alpha[0].item() == 1.0 and alpha[1].item() == 0.0  # e^-1000 underflows to 0, not NaN
    loss = topr.topr_loss(logprobs, mask, lp_mu, rewards)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    assert loss.item() == pytest.approx(-(1.0 * -1 * -6.0) / 2)  # seq/len: LP/T = -6; the second term is 0


# ---------------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------------
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


def test_all_positive_data_is_reward_weighted_sft_in_value_and_gradient():
    """a+ = b+ = 1 and R >= 0: loss and gradient equal -mean_i R_i LP_i / T_i, whatever LP_mu."""
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


def test_loss_normalisations_and_split_on_hand_computed_tensors():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    lp_mu = torch.tensor([-3.0, -2.0])  # lw = [0, -1]
    r = torch.tensor([1.0, -1.0])
    e = math.exp(-1)
    assert topr.topr_loss(logprobs, mask, lp_mu, r, norm="seq").item() == pytest.approx(-(-3 + e * 3) / 2)
    assert topr.topr_loss(logprobs, mask, lp_mu, r, norm="seq/len").item() == pytest.approx(-(-1.5 + e * 3) / 2)
    assert topr.topr_loss(logprobs, mask, lp_mu, r, norm="token").item() == pytest.approx(-(-3 + e * 3) / 3)
    # baseline c = 0.5: R - c = [0.5, -1.5]; split 1 ([CR] Eq. 4): R = 0.5 < 1 is truncated, R = 1 is not
    assert topr.topr_loss(logprobs, mask, lp_mu, r, c=0.5, norm="seq").item() == pytest.approx(
        -(0.5 * -3 + e * -1.5 * -3) / 2)
    r01 = torch.tensor([1.0, 0.1])
    assert topr.topr_loss(logprobs, mask, lp_mu, r01, norm="seq", split=1.0).item() == pytest.approx(
        -(1.0 * -3 + e * 0.1 * -3) / 2)
    assert topr.topr_loss(logprobs, mask, lp_mu, r01, norm="seq", split=0.0).item() == pytest.approx(
        -(1.0 * -3 + 0.1 * -3) / 2)
    # right-padding changes nothing
    pad = torch.cat([logprobs, torch.zeros(2, 4)], 1), torch.cat([mask, torch.zeros(2, 4)], 1)
    for norm in ("seq", "seq/len", "token"):
        assert topr.topr_loss(*pad, lp_mu, r, norm=norm).item() == pytest.approx(
            topr.topr_loss(logprobs, mask, lp_mu, r, norm=norm).item(), abs=1e-7)


def test_split_is_by_r_minus_c_not_by_r():
    """c = 0.5, R = [1, 0.1]: R - c = [0.5, -0.4] puts the second sample in T- (truncated, alpha = e^-1);
    a split by R alone (R >= 0) would give it alpha = 1. With split 1 and R = [1, 1.4], R - c = [0.5, 0.9]:
    both are in T-, though R >= 1 for both."""
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    lp_mu = torch.tensor([-2.0, -3.0], dtype=torch.float64)  # lw = [-1, -1]
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


def test_task_rewards_default_to_the_reports_eq4():
    """[CR] Eq. 4: grad = E_{R=1}[R grad log pi] + E_{R<1}[[pi/mu]_0^1 R grad log pi], no baseline. The
    default (c, split) for the task's rewards gives exactly that loss, and leaves negatives, where the pm1
    default c = -0.8 (split 0) would put every sample of reward A in T+ (reward-weighted SFT)."""
    assert topr.default_baseline("pm1") == (-0.8, 0.0)
    for variant in ("original", "A", "B", "A+B"):
        assert topr.default_baseline(variant) == (0.0, 1.0)
    c, split = topr.default_baseline("A")
    logits, ids, mask, lp_mu = _batch(seed=3)
    rewards = torch.tensor([1.0, 0.1, 0.1, -0.006, 1.0, -0.0003], dtype=torch.float64)  # reward A levels
    lp = _token_logprobs(logits, ids, mask)
    seq = lp.sum(-1)
    ratio = torch.exp(seq.detach() - lp_mu).clamp(0, 1)
    eq4 = -(torch.where(rewards == 1, rewards, ratio * rewards) * seq / mask.sum(-1)).mean()
    loss = topr.topr_loss(lp, mask, lp_mu, rewards, c=c, split=split)
    (g1,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(eq4, logits)
    assert loss.item() == pytest.approx(eq4.item(), abs=1e-12) and torch.allclose(g1, g2, atol=1e-12)
    assert topr.negative_share(rewards.tolist(), -0.8, 0.0) == 0.0     # the old default: no negatives
    assert topr.negative_share(rewards.tolist(), c, split) == pytest.approx(4 / 6)


@pytest.mark.parametrize("limits", LIMIT_SETS)
def test_taper_objective_gradient_is_eq7_and_the_loss_gives_it(limits):
    """Tabular: the autograd gradient of J = sum_y mu rho(pi/mu) R (Eq. 11) equals Eq. 7,
    sum_y mu [pi/mu]_a^b R grad log pi, and so does topr_loss on the full 'dataset' weighted by mu."""
    a_pos, b_pos, a_neg, b_neg = limits
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True)
    mu = torch.softmax(torch.randn(8, generator=g, dtype=torch.float64), 0)
    R = torch.tensor([1.0, -1.0, 0.5, -0.3, 1.0, -1.0, 0.2, -2.0], dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    u = pi / mu
    J = sum(mu[i] * topr.taper(u[i:i + 1], *((a_pos, b_pos) if R[i] >= 0 else (a_neg, b_neg))) * R[i]
            for i in range(8))
    (g_rho,) = torch.autograd.grad(J.sum(), theta)
    logpi = torch.log_softmax(theta, 0)
    clamp = torch.stack([u[i].detach().clamp(*((a_pos, b_pos) if R[i] >= 0 else (a_neg, b_neg))) for i in range(8)])
    (g_eq7,) = torch.autograd.grad((mu * clamp * R * logpi).sum(), theta)
    assert torch.allclose(g_rho, g_eq7, atol=1e-8)
    # the minibatch loss on one-token "sequences", rewards scaled by 8 mu (> 0, so no sign changes)
    loss = topr.topr_loss(torch.log_softmax(theta, 0)[:, None], torch.ones(8, 1, dtype=torch.float64), torch.log(mu), 8 * mu * R,
                          *limits, norm="seq")
    (g_loss,) = torch.autograd.grad(loss, theta)
    assert torch.allclose(-g_loss, g_eq7, atol=1e-8)


def test_effective_positive_share_values():
    """ALGORITHMS.md §6: p = 0.1: c = 0 -> 0.1, c = -1 -> 1, c = 0.5 -> 0.0357; p = 0.5, c = 0.7 -> 0.15."""
    assert topr.p_tilde_pm1(0.1, 0.0) == pytest.approx(0.1)
    assert topr.p_tilde_pm1(0.1, -1.0) == pytest.approx(1.0)
    assert topr.p_tilde_pm1(0.1, 0.5) == pytest.approx(0.0357, abs=5e-5)
    assert topr.p_tilde_pm1(0.5, 0.7) == pytest.approx(0.15)
    rewards = [1.0] * 10 + [-1.0] * 90  # p = 0.1: the multi-level formula is Eq. 12 on +1/-1 data
    for c in (-0.5, 0.0, 0.3, 0.5, 0.9):
        assert topr.effective_positive_share(rewards, c) == pytest.approx(topr.p_tilde_pm1(0.1, c))
        assert topr.c_for_p_tilde(0.1, topr.p_tilde_pm1(0.1, c)) == pytest.approx(c)
    # two levels r+ > c > r-: p (r+ - c) / (p (r+ - c) + (1-p)(c - r-))
    rewards = [1.0] * 3 + [0.1] * 7
    assert topr.effective_positive_share(rewards, 0.5) == pytest.approx(0.3 * 0.5 / (0.3 * 0.5 + 0.7 * 0.4))


# ---------------------------------------------------------------------------------------------------
# Proposition 3.2 on a tabular problem: naive REINFORCE collapses, TOPR stays bounded
# ---------------------------------------------------------------------------------------------------
def _tabular_run(limits, steps, seed=0, lr=0.1):
    """5 arms, mu = softmax(N(0,1)), R = [1,-1,-1,1,-1], pi starts at mu; exact full-batch gradient ascent
    of Eq. 7 computed through topr_loss (ALGORITHMS.md §6 "collapse test")."""
    g = torch.Generator().manual_seed(seed)
    mu_logits = torch.randn(5, generator=g, dtype=torch.float64)
    mu = torch.softmax(mu_logits, 0)
    R = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    theta = mu_logits.clone().requires_grad_(True)
    ones = torch.ones(5, 1, dtype=torch.float64)
    for _ in range(steps):
        loss = topr.topr_loss(torch.log_softmax(theta, 0)[:, None], ones, torch.log(mu), 5 * mu * R, *limits,
                              norm="seq")
        (grad,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * grad
    pi = torch.softmax(theta.detach(), 0)
    naive_objective = (mu * R * torch.log(pi)).sum().item()  # Eq. 4
    u = pi / mu
    j_topr = sum((mu[i] * topr.taper(u[i:i + 1], *(limits[:2] if R[i] >= 0 else limits[2:])) * R[i]).item()
                 for i in range(5))  # Eq. 11
    return theta.detach(), pi, mu, grad.norm().item(), naive_objective, j_topr


def test_naive_reinforce_collapses_and_topr_stays_bounded():
    """Seed 2 draws mu with more mass on negatives (0.71) than on positives. Seen: naive logit range 110 at
    1k steps, 560 at 5k, |g| = 0.83 throughout; TOPR range 7.2, |g| = 2.4e-3, negatives at 7e-4."""
    theta_1k = _tabular_run(topr.LIMITS["naive"], 1000, seed=2)[0]
    theta, pi, mu, gnorm, naive_obj, _ = _tabular_run(topr.LIMITS["naive"], 5000, seed=2)
    spread_1k, spread = (theta_1k.max() - theta_1k.min()).item(), (theta.max() - theta.min()).item()
    assert spread > 300 and spread > 4 * spread_1k  # logits run away, linearly in the number of steps
    assert gnorm > 0.5                          # and the gradient never vanishes: it keeps pushing
    assert pi[[1, 2, 4]].max() < 1e-100         # every negative arm's probability is driven to 0 ...
    assert pi[3] < 1e-100                       # ... and even the less likely positive arm dies
    assert naive_obj > 100                      # Eq. 4 grows without bound

    theta, pi, mu, gnorm, _, j_topr = _tabular_run(topr.LIMITS["topr"], 5000, seed=2)
    assert (theta.max() - theta.min()).item() < 10 and gnorm < 1e-2
    assert pi[[1, 2, 4]].max() < 2e-3           # negatives are unlearned, but gently
    ratio_pi, ratio_mu = (pi[0] / pi[3]).item(), (mu[0] / mu[3]).item()
    assert ratio_pi == pytest.approx(ratio_mu, rel=0.05)  # positives keep mu's proportions (SFT on T+)
    # Prop. 3.2: J_TOPR <= sum_{T+} mu (1 + ln(pi/mu)) <= sum_{T+} mu (1 + ln(1/mu)) whatever pi
    assert j_topr <= (mu[[0, 3]] * (1 - torch.log(mu[[0, 3]]))).sum().item()


# ---------------------------------------------------------------------------------------------------
# End to end on the tiny model: the data file, --data reuse, lp_mu recomputation, resume, bad input
# ---------------------------------------------------------------------------------------------------
RUN = ["--engine", "hf", "--threads", "1", "--seed", "0", "--num-numbers", "3", "--eval-numbers", "3", "--prompts", "6", "--n", "4",
       "--train-size", "50",
       "--max-new-tokens", "12", "--batch-size", "8", "--eval-size", "3", "--eval-k", "2", "--lr", "1e-3",
       "--reward", "original", "--c", "0.05"]


def _weights(run_dir):
    return AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "final")).state_dict()


def _same(a, b, atol=1e-6):
    return all(torch.allclose(a[k], b[k], atol=atol) for k in a)


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_run_writes_its_data_and_data_reuse_trains_identically(tiny_path, tmp_path):
    out = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2", "--out", str(tmp_path / "a")])
    rows = _rows(os.path.join(out, "data-0.jsonl"))
    assert len(rows) == 6 * 4
    assert {"problem", "prompt_ids", "completion_ids", "completion", "reward", "grade", "lp_mu"} <= set(rows[0])
    # the stored behaviour log-probs are the sampled model's own (T = 1): recomputing them agrees
    model, tok = common.load_model(tiny_path)
    lp, mask = common.completion_logprobs(model, [r["prompt_ids"] for r in rows], [r["completion_ids"] for r in rows],
                                          tok.pad_token_id)
    assert torch.allclose((lp * mask).sum(-1), torch.tensor([r["lp_mu"] for r in rows]), atol=1e-3)
    metrics = _rows(os.path.join(out, "metrics.jsonl"))
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4, 5, 6]
    assert abs(metrics[1]["log_ratio"]) < 1e-4           # pi = mu at the first step: every ratio is 1
    assert "eval3/sampled/accuracy" in metrics[-1]
    assert not _same(_weights(out), AutoModelForCausalLM.from_pretrained(tiny_path).state_dict())  # it trained

    data = os.path.join(out, "data-0.jsonl")
    again = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2", "--data", data,
                             "--out", str(tmp_path / "b")])
    assert _same(_weights(out), _weights(again))
    # a file from elsewhere without behaviour log-probs (nor rewards or grades): mu is taken as the starting
    # model at T = 1, which is what sampled these data, so training is the same again. (Token ids are kept:
    # the random tiny model emits ids that do not survive a decode/encode round trip.)
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: r[k] for k in ("problem", "completion", "prompt_ids", "completion_ids")})
                            + "\n" for r in rows))
    third = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2", "--data", str(bare),
                             "--out", str(tmp_path / "c")])
    assert _same(_weights(out), _weights(third), atol=1e-4)  # seen: 2e-5


def test_interrupted_then_resumed_run_equals_an_uninterrupted_one(tiny_path, tmp_path, monkeypatch):
    args = RUN + ["--model", tiny_path, "--iterations", "2", "--save-every", "2", "--sampling", "anna-karenina"]
    straight = topr.main(args + ["--out", str(tmp_path / "a")])

    # killed in the second iteration, after its data were written
    run_until_killed(topr.main, args + ["--out", str(tmp_path / "b")], monkeypatch, step=5)
    resumed = topr.main(["--resume", str(tmp_path / "b")])
    assert _same(_weights(straight), _weights(resumed))
    assert _rows(os.path.join(straight, "data-1.jsonl")) == _rows(os.path.join(resumed, "data-1.jsonl"))
    assert [m["step"] for m in _rows(os.path.join(resumed, "metrics.jsonl"))] == \
        [m["step"] for m in _rows(os.path.join(straight, "metrics.jsonl"))]


def test_task_reward_run_logs_its_negative_share_and_uses_eq4(tiny_path, tmp_path):
    """--reward A without --c/--split: c = 0, split 1, and every sample that is not fully correct is in T-
    (the old default c = -0.8 put none there)."""
    args = [a for a in RUN if a not in ("--c", "0.05")]
    args[args.index("original")] = "A"
    out = topr.main(args + ["--model", tiny_path, "--iterations", "1", "--out", str(tmp_path / "a")])
    config = json.load(open(os.path.join(out, "config.json")))
    assert (config["c"], config["split"]) == (0.0, 1.0)
    data = _rows(os.path.join(out, "data-0.jsonl"))
    share = sum(r["grade"] != "correct" for r in data) / len(data)
    steps = [m for m in _rows(os.path.join(out, "metrics.jsonl")) if m["step"] > 0]
    assert share > 0 and all(m["negative_share"] == pytest.approx(share) for m in steps)


def test_resume_with_data_lacking_lp_mu_takes_mu_from_the_start_model(tiny_path, tmp_path, monkeypatch):
    """A --data file without lp_mu: mu is the starting model, also when the run resumes in iteration 0
    from a checkpoint (whose weights are not mu)."""
    first = topr.main(RUN + ["--model", tiny_path, "--iterations", "1", "--out", str(tmp_path / "gen")])
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: r[k] for k in ("problem", "completion", "prompt_ids",
                                                          "completion_ids")}) + "\n"
                            for r in _rows(os.path.join(first, "data-0.jsonl"))))
    args = RUN + ["--model", tiny_path, "--iterations", "1", "--epochs", "2", "--save-every", "2",
                  "--data", str(bare)]
    straight = topr.main(args + ["--out", str(tmp_path / "a")])
    run_until_killed(topr.main, args + ["--out", str(tmp_path / "b")], monkeypatch, step=5)
    resumed = topr.main(["--resume", str(tmp_path / "b")])
    assert _same(_weights(straight), _weights(resumed))


def test_time_limit_stops_training_then_evaluates_and_saves(tiny_path, tmp_path):
    out = topr.main(RUN + ["--model", tiny_path, "--iterations", "3", "--epochs", "2", "--time-limit", "0.001",
                           "--out", str(tmp_path / "run")])
    rows = _rows(os.path.join(out, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1]  # the budget (0.06 s) ran out before the end of the first step
    assert "eval3/sampled/accuracy" in rows[-1] and rows[-1]["samples"] == 8
    assert os.path.isdir(os.path.join(out, "final")) and not os.path.exists(os.path.join(out, "data-1.jsonl"))


def test_anna_karenina_keeps_the_first_positive_of_each_prompt():
    rows = [{"prompt_index": i // 4, "grade": g} for i, g in
            enumerate(["correct", "wrong", "correct", "no_answer", "wrong", "wrong", "wrong", "wrong"])]
    import numpy as np
    kept = topr.select(rows, "anna-karenina", 0, np.random.default_rng(0))
    assert [r["grade"] for r in kept] == ["correct", "wrong", "no_answer", "wrong", "wrong", "wrong", "wrong"]
    assert kept[0] is rows[0]
    kept = topr.select(rows, "anna-karenina", 3, np.random.default_rng(0))
    assert len(kept) == 3 and kept[0] is rows[0] and all(r["grade"] != "correct" for r in kept[1:])
    assert len(topr.select(rows, "uniform", 5, np.random.default_rng(0))) == 5


@pytest.mark.parametrize("args,content,message", [
    (["--reward", "C"], None, "unknown --reward"),
    (["--n", "0"], None, "positive integer"),
    (["--top-p", "1.5"], None, "--top-p"),
    (["--data", "/nonexistent.jsonl"], None, "no such file"),
    ([], "not json\n", ":1: not valid JSON"),
    ([], '{"completion": "x"}\n', "needs a `problem` object"),
    ([], '{"problem": {"nums": [1, 2]}, "completion": "x"}\n', "is not a countdown problem"),
    ([], '{"problem": {"nums": [1, 2], "target": 3}, "completion": "x", "lp_mu": "a"}\n', "lp_mu must be"),
    ([], "\n", "holds no samples"),
    (["--resume", "/nonexistent/run"], None, "config.json"),
])
def test_bad_input_gives_one_line_and_status_2(args, content, message, tiny_path, tmp_path, capsys):
    if content is not None:
        (tmp_path / "d.jsonl").write_text(content)
        args = args + ["--data", str(tmp_path / "d.jsonl")]
    with pytest.raises(SystemExit) as e:
        topr.main(["--model", tiny_path, "--out", str(tmp_path / "run"), "--engine", "hf", "--train-size", "10",
                   "--eval-size", "2"] + args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "run")


def test_missing_sft_model_gives_status_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no runs/ here
    with pytest.raises(SystemExit) as e:
        topr.main([])
    assert e.value.code == 2
    assert "no finished sft.py run" in capsys.readouterr().err
