"""Nothing assumes a CPU: each script's training step, and both engines, with the model on another
device (tests/fake_gpu.py: "gpu", real values computed on the CPU, an error wherever a CPU tensor
meets a gpu one, as on CUDA), give what they give on the CPU.

A tensor made without `device=` in a step (rewards, Q0, the sampler's log-probs) meets the model's
log-probs and fails here as it failed on an H200."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import agro
import common
import fake_gpu
import rloo
import sft
import spo
import topr
from conftest import FOUR
from tasks import countdown

K = 4  # completions a prompt
REWARDS = [1.0, 0.0, 0.0, 1.0]  # every group has a reward signal, so every loss runs


def _samples(tiny_path):
    """K completions of each of FOUR's prompts by the tiny model on the CPU, seeded."""
    common.setup(0, 1)
    model, tok = common.load_model(tiny_path)
    prompts = common.encode_prompts(countdown, FOUR, tok, "compact")
    groups = common.KVEngine(model, tok).generate(prompts, common.SamplingConfig(K, 12, seed=0))
    return groups, tok


def _step(name: str, tiny_path, device) -> tuple[dict, dict]:
    """One optimizer step of script `name` with its model (and pi_ref) on `device`; its metrics and
    the updated weights (on the CPU)."""
    groups, tok = _samples(tiny_path)
    common.setup(0, 1)
    model = common.load_model(tiny_path, device=device)[0]
    ref = common.load_model(tiny_path, device=device)[0].requires_grad_(False)
    # SGD: Adam's first update, ~lr sign(g), would turn rounding in a gradient near 0 into lr
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    pad = tok.pad_token_id
    flat = [s for g in groups for s in g]
    if name == "sft":
        args = sft.parse_args(["--grad-accum", "2"])[1]
        batch = [sft.Example(s.prompt_ids, s.ids) for s in flat]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        row = sft.sft_step(model, optimizer, scheduler, batch, args, pad, 0)
    elif name == "rloo":
        args = rloo.parse_args(["--beta", "0.1", "--micro-batch", "2", "--lr", "6e-5"])[1]
        batch = [rloo.Group(p, g, REWARDS) for p, g in zip(FOUR, groups)]
        row = rloo.rloo_step(model, ref, optimizer, batch, args, pad, 0)
    elif name == "topr":
        args = topr.parse_args(["--micro-batch", "6"])[1]
        rows = [{"prompt_ids": s.prompt_ids, "completion_ids": s.ids, "grade": "wrong",
                 "lp_mu": float(sum(s.logprobs))} for s in flat]
        row = topr.topr_step(model, optimizer, rows, REWARDS * len(FOUR), args, pad, 0)
    elif name.startswith("agro"):  # on-policy and offline groups; klpg: the per-token KL too
        loss = name.split()[1]
        args = agro.parse_args(["--mode", "offpolicy", "--group-size", str(K), "--micro-batch", "2",
                                "--loss", loss, "--lr", "6e-5"])[1]
        batch = [agro.Group(g[0].prompt_ids, [s.ids for s in g], REWARDS, ["wrong"] * K,
                            [s.logprobs for s in g] if i % 2 else None, bool(i % 2))
                 for i, g in enumerate(groups)]
        row = agro.agro_step(model, ref, optimizer, batch, args, 0, pad)
    elif name == "spo":
        args = spo.parse_args(["--micro-batch", "5"])[1]
        batch = [spo.Trajectory(s.prompt_ids, s.ids, r - 1.0, i, True)
                 for i, g in enumerate(groups) for s, r in zip(g, REWARDS)]
        q0 = torch.tensor([-0.5, -0.2, -0.9, -0.4])  # Q0_hat of each prompt, on the CPU as main()'s
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        row = spo.spo_step(model, ref, optimizer, schedule, batch, q0, args, 0, pad)
    weights = {k: fake_gpu.on_cpu(v) for k, v in model.state_dict().items()}
    return row, weights


STEPS = ["sft", "rloo", "topr", "agro agro", "agro klpg", "spo"]


@pytest.mark.parametrize("name", STEPS)
def test_a_training_step_on_another_device_gives_the_cpus_step(name, tiny_path):
    with sdpa_kernel(SDPBackend.MATH):  # the attention kernel the fake device runs
        cpu_row, cpu_weights = _step(name, tiny_path, "cpu")
    with fake_gpu.on() as gpu:
        row, weights = _step(name, tiny_path, gpu)
    assert row.keys() == cpu_row.keys()
    for key, value in cpu_row.items():
        if value is None:  # a metric of an empty set (topr: no negatives) is None on both
            assert row[key] is None, key
        else:
            assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    moved = max((weights[k] - w).abs().max().item() for k, w in cpu_weights.items())
    assert moved < 1e-6
    assert cpu_row["grad_norm"] > 0  # a real update, not a step with nothing to learn


def test_the_fake_device_refuses_a_cpu_tensor_as_cuda_does(tiny_path):
    """The check the step test relies on: it fails on a step that makes its rewards on the CPU."""
    with fake_gpu.on() as gpu:
        model, tok = common.load_model(tiny_path, device=gpu)
        lp, mask = common.completion_logprobs(model, [[5, 6, 7]], [[8, 9]], tok.pad_token_id)
        assert lp.device == gpu
        with pytest.raises(RuntimeError, match="same device"):
            lp * torch.tensor([[1.0, 2.0]])
        lp * torch.tensor(2.0)  # a 0-dim CPU tensor is a scalar, as on CUDA
        lp * torch.tensor([[1.0, 2.0]], device=gpu)


@pytest.mark.parametrize("kind", ["kv", "hf"])
def test_the_engines_sample_on_another_device_what_they_sample_on_the_cpu(kind, tiny_path):
    def sample(device):
        common.setup(0, 1)
        model, tok = common.load_model(tiny_path, device=device)
        engine = common.make_engine(kind, model, tok, tiny_path)
        prompts = common.encode_prompts(countdown, FOUR, tok, "compact")
        return [(s.ids, s.logprobs) for g in engine.generate(
            prompts, common.SamplingConfig(2, 10, seed=3)) for s in g]
    cpu = sample("cpu")
    with fake_gpu.on() as gpu:
        other = sample(gpu)
    assert [ids for ids, _ in other] == [ids for ids, _ in cpu]
    for (_, lp), (_, cpu_lp) in zip(other, cpu):
        assert lp == pytest.approx(cpu_lp, abs=1e-5)
