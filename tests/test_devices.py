"""Nothing assumes a CPU: each script's training step, and both engines, with the model on another
device (tests/fake_gpu.py: "gpu", real values computed on the CPU, an error wherever a CPU tensor
meets a gpu one, as on CUDA), give what they give on the CPU.

A tensor made without `device=` in a step (rewards, Q0, the sampler's log-probs) meets the model's
log-probs and fails here as it failed on an H200."""
import importlib
import os
import sys
import types

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

K = 4  # completions per prompt
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


# ---- A GPU that torch cannot use, and the GPU's own figures (a fake nvidia-smi, a fake CUDA) ----
def _scripts_module(name: str):
    """scripts/`name`.py as a module."""
    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    return importlib.import_module(name)


H200 = "GPU 0: NVIDIA H200 (UUID: GPU-5d2f1c0e-0000-0000-0000-000000000000)"


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """A fake `nvidia-smi` first on PATH that prints `listing` and exits with `status` (or, given
    `seconds`, hangs that long); torch sees no GPU, as where the driver is older than torch's CUDA
    build."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")

    def install(listing: str, status: int = 0, seconds: float = 0):
        path = tmp_path / "nvidia-smi"
        hang = f"exec sleep {seconds}\n" if seconds else ""
        path.write_text(f"#!/bin/sh\n{hang}echo '{listing}'\nexit {status}\n")
        path.chmod(0o755)
    return install


def test_a_gpu_that_nvidia_smi_sees_and_torch_cannot_use_is_named_in_one_line(nvidia_smi):
    nvidia_smi(H200)
    reason = common.gpu_unusable_reason()
    assert "NVIDIA H200" in reason and "UUID" not in reason and "\n" not in reason
    assert "torch.cuda.is_available() is False" in reason


@pytest.mark.parametrize("listing, status, seconds", [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9, 0),
    ("No devices were found", 6, 0),
    (H200, 0, 5),  # hangs past the timeout
])
def test_no_reason_where_nvidia_smi_lists_no_gpu_or_hangs(nvidia_smi, listing, status, seconds):
    nvidia_smi(listing, status, seconds)
    assert common.gpu_unusable_reason(timeout=1.0) is None


def test_no_reason_without_nvidia_smi_or_where_torch_uses_the_gpu(nvidia_smi, tmp_path,
                                                                   monkeypatch):
    nvidia_smi(H200)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert common.gpu_unusable_reason() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert common.gpu_unusable_reason() is None


@pytest.mark.parametrize("script, argv", [("gpu_smoke", []), ("real_model", []),
                                          ("real_model", ["--preset", "gpu"])])
def test_the_gpu_scripts_stop_in_one_line_on_a_gpu_torch_cannot_use(script, argv, nvidia_smi,
                                                                    monkeypatch, capsys):
    """gpu_smoke.py said "no GPU here" and exited 0; real_model.py ran its gpu preset on the CPU."""
    nvidia_smi(H200)
    def fail(*args, **kwargs):
        pytest.fail("a model was loaded")
    monkeypatch.setattr(common, "load_model", fail)
    assert _scripts_module(script).main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "NVIDIA H200" in captured.err


def test_real_model_preset_cpu_still_runs_where_torch_cannot_use_the_gpu(nvidia_smi, monkeypatch):
    nvidia_smi(H200)
    class Loaded(Exception):
        pass
    def load_model(*args, **kwargs):
        raise Loaded
    monkeypatch.setattr(common, "load_model", load_model)
    with pytest.raises(Loaded):  # past the check, to the model
        _scripts_module("real_model").main(["--preset", "cpu"])


def test_the_kv_engines_cache_is_a_share_of_the_gpu_there_and_512_mib_on_a_cpu(tiny,
                                                                            monkeypatch):
    """On a GPU, KVEngine.gpu_share of the memory other processes leave: a resumed run, which holds
    its checkpoint when its engine starts, gets the batch size (and so the samples) of the run it
    continues."""
    model, tok = tiny
    assert common.KVEngine(model, tok).cache_bytes == common.kv_cache_bytes(
        torch.device("cpu")) == 2**29
    with fake_gpu.on() as gpu:  # another device, not CUDA: the CPU figure
        assert common.kv_cache_bytes(gpu) == 2**29
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 20 * 2**30)
    assert common.kv_cache_bytes(cuda) == int(common.KVEngine.gpu_share * 120 * 2**30) == 30 * 2**30
    # the resumed run: 8 GiB more held by this process (AdamW's state, the checkpoint), as much less
    # free on the device; the same budget
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (92 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 28 * 2**30)
    assert common.kv_cache_bytes(cuda) == 30 * 2**30
    # a KVEngine sizes its batches from it: rows of 4,096 tokens x 4 KiB (the tiny model's keys
    # and values) are 16 MiB, 32 of them in the CPU's 512 MiB, 512 (the most) on the GPU
    monkeypatch.setattr(common.HFEngine, "generate", lambda self, prompts, sc: [])
    sc = common.SamplingConfig(1, 4093)
    engine = common.KVEngine(model, tok)
    engine.generate([[5, 6, 7]], sc)
    assert engine.batch_size == 32
    with monkeypatch.context() as m:  # the model on the GPU as the engine starts
        m.setattr(model, "parameters", lambda: iter([types.SimpleNamespace(device=cuda)]))
        engine = common.KVEngine(model, tok)
    assert engine.cache_bytes == 30 * 2**30
    engine.generate([[5, 6, 7]], sc)
    assert engine.batch_size == common.KVEngine.max_rows == 512


def test_exact_mode_turns_tf32_off_and_deterministic_kernels_on(monkeypatch):
    """gpu_smoke.py's tests line runs with exact_env(): setup() there gives up TF32 and takes
    torch's deterministic kernels, with cuBLAS's deterministic workspace; without it, a run's
    numerics (TF32 on) are unchanged."""
    import torch.utils.deterministic
    env = _scripts_module("gpu_smoke").exact_env()
    assert env[common.EXACT_ENV] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    precision = torch.get_float32_matmul_precision()
    try:
        monkeypatch.delenv(common.EXACT_ENV, raising=False)
        common.setup(0, 1)
        assert torch.backends.cuda.matmul.allow_tf32
        assert not torch.are_deterministic_algorithms_enabled()
        monkeypatch.setenv(common.EXACT_ENV, "1")
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        common.setup(0, 1)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert not torch.utils.deterministic.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True
        torch.set_float32_matmul_precision(precision)
