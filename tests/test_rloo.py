"""rloo.py: the leave-one-out estimator, its unbiasedness on a bandit, learning, and the vLLM sync."""
import json
import os

import pytest
import torch

import rloo
from conftest import FOUR, SUMS, sampled, write_jsonl


def test_advantages_on_hand_computed_rewards():
    a = rloo.rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(a, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    assert a.sum().item() == 0.0
    r = torch.rand(5, 6, dtype=torch.float64)
    loo = r - (r.sum(-1, keepdim=True) - r) / 5  # the definition, written out
    assert torch.allclose(rloo.rloo_advantages(r), loo, atol=1e-12)
    assert torch.equal(rloo.rloo_advantages(torch.full((2, 3), 0.7)), torch.zeros(2, 3))  # no signal
    with pytest.raises(ValueError, match="k >= 2"):
        rloo.rloo_advantages(torch.tensor([[1.0]]))


def test_loss_on_hand_computed_tensors():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    assert rloo.rloo_loss(logprobs, mask, adv, "seq").item() == pytest.approx(-(1 * -3 + -1 * -3) / 2)
    assert rloo.rloo_loss(logprobs, mask, adv, "seq/len").item() == pytest.approx(-(-3 / 2 + 3 / 1) / 2)
    assert rloo.rloo_loss(logprobs, mask, adv, "token").item() == pytest.approx(-(-1 - 2 + 3) / 3)
    rloo.rloo_loss(logprobs, mask, adv, "seq").backward()
    assert logprobs.grad.tolist() == [[-0.5, -0.5, 0.0], [0.5, 0.0, 0.0]]  # padding gets no gradient


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_estimator_is_unbiased_on_a_bandit(beta):
    """6 arms, softmax policy, known rewards, k=4: the mean RLOO estimate over 2e5 batches matches the exact
    policy gradient pi * (R - pi.R) within 4 standard errors (ALGORITHMS.md §6), R = r - beta log(pi/pi_ref)."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=g, dtype=torch.float64)
    ref = torch.randn(6, generator=g, dtype=torch.float64)
    r = torch.rand(6, generator=g, dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    R = r - beta * (torch.log_softmax(theta, 0) - torch.log_softmax(ref, 0))  # regularised reward per arm
    exact = pi * (R - (pi * R).sum())

    M, k = 200_000, 4
    arms = torch.multinomial(pi, M * k, replacement=True, generator=g).view(M, k)
    adv = rloo.rloo_advantages(R[arms])  # [M, k]
    # per-batch estimate (1/k) sum_i A_i grad log pi(a_i), with grad log pi(a) = onehot(a) - pi
    onehot = torch.nn.functional.one_hot(arms, 6).double()
    per_batch = (adv[..., None] * (onehot - pi)).mean(1)  # [M, 6]
    mean, se = per_batch.mean(0), per_batch.std(0) / M ** 0.5
    assert ((mean - exact).abs() / se).max() < 4.0

    # and the loss function's autograd gradient is exactly that mean estimate
    th = theta.clone().requires_grad_(True)
    lp = torch.log_softmax(th, 0)[arms.view(-1)][:, None]  # [M*k, 1]: one-"token" sequences
    rloo.rloo_loss(lp, torch.ones_like(lp), adv.view(-1), "seq").backward()
    assert torch.allclose(-th.grad, mean, atol=1e-12)


def _mean_reward(path, problems, samples=64):
    return sampled(path, problems, samples)["sampled/reward"]


def _problem_file(tmp_path, problems):
    return write_jsonl(tmp_path / "problems.jsonl", problems)


RUN = ["--max-new-tokens", "32", "--eval-every", "1000", "--eval-size", "4", "--eval-k", "1",
       "--num-numbers", "3", "--eval-numbers", "3", "--threads", "1", "--seed", "0", "--no-resample-uniform"]


def test_short_run_learns_an_easy_puzzle_set(weak_sft, tmp_path):
    """Four 2-number sums, 16 samples each, 30 steps: the mean reward (256 fresh samples) rises by a margin.
    Seen with seed 0: 0.137 -> 0.348 (seeds 1 and 2: +0.11, +0.10)."""
    out = rloo.main(RUN + ["--model", weak_sft, "--problems", _problem_file(tmp_path, FOUR), "--prompts", "4",
                           "--k", "16", "--lr", "5e-4", "--steps", "30", "--engine", "hf",
                           "--out", str(tmp_path / "run")])
    before, after = _mean_reward(weak_sft, FOUR), _mean_reward(os.path.join(out, "final"), FOUR)
    assert after > before + 0.08, (before, after)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][1:]
    assert all(r["logprob_gap"] < 1e-4 for r in rows)  # HF generate samples from the trained model itself


def test_vllm_engine_stays_in_sync_during_training(weak_sft, tmp_path):
    out = rloo.main(RUN + ["--model", weak_sft, "--problems", _problem_file(tmp_path, SUMS), "--prompts", "8",
                           "--k", "4", "--lr", "5e-4", "--steps", "4", "--engine", "vllm",
                           "--out", str(tmp_path / "run")])
    first, *rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert len(rows) == 4
    assert all(r["logprob_gap"] < 1e-3 for r in rows)  # every step samples from the weights just trained
    assert first["kl_to_ref"] == 0.0 and rows[-1]["kl_to_ref"] > 0.0  # the policy has moved away from the reference


def test_beta_puts_the_kl_to_the_reference_in_the_reward_and_logs_it(weak_sft, tmp_path):
    out = rloo.main(RUN + ["--model", weak_sft, "--problems", _problem_file(tmp_path, SUMS), "--prompts", "4",
                           "--k", "4", "--lr", "5e-4", "--warmup", "0", "--steps", "2", "--beta", "0.1",
                           "--engine", "hf", "--out", str(tmp_path / "run")])
    _, first, second = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert first["kl"] == 0.0  # step 1 trains on samples of the reference weights themselves: h = 0 exactly
    assert second["kl"] != 0.0


def test_time_limit_stops_training_then_evaluates_and_saves(weak_sft, tmp_path):
    out = rloo.main(RUN + ["--model", weak_sft, "--problems", _problem_file(tmp_path, SUMS), "--prompts", "2",
                           "--k", "2", "--steps", "1000", "--time-limit", "0.001", "--engine", "hf",
                           "--out", str(tmp_path / "run")])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1]  # the budget (0.06 s) ran out during the first step
    assert "eval3/sampled/accuracy" in rows[-1]
    assert os.path.isdir(os.path.join(out, "final"))


@pytest.mark.parametrize("args,message", [
    (["--k", "1"], "--k must be at least 2"),
    (["--reward", "C"], "unknown --reward"),
    (["--prompts", "-3"], "positive integer"),
    (["--model", "sft"], "no finished sft.py run"),
])
def test_bad_input_gives_one_line_and_status_2(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no runs/ here
    with pytest.raises(SystemExit) as e:
        rloo.main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
