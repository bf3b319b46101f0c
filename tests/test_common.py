"""common.py: the tiny model, log-probs, the engines, bad input; tasks/scoring.py's metrics."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import common
from tasks import countdown, scoring
from conftest import ROOT, SUMS


def test_tiny_model_round_trips_through_auto_classes(tiny_path):
    tok = AutoTokenizer.from_pretrained(tiny_path)
    text = "12 3 45=7:45-12=33,33+3=36 <answer>(45-12)+3</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, spaces included
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert 0.8e6 < common.count_parameters(model) < 1.5e6
    assert model.config.prompt_style == "compact"


def test_log_probs_match_a_loop_over_prefixes(tiny):
    model, tok = tiny
    prompts = [[20, 21, 3, 22], [23, 3, 24, 25, 26, 27]]
    completions = [[30, 31, 32, 1], [33, 34]]
    lp, mask = common.completion_logprobs(model, prompts, completions, tok.pad_token_id)
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]  # from lengths; the EOS (id 1) counts
    with torch.no_grad():
        for i, (p, c) in enumerate(zip(prompts, completions)):
            for t in range(len(c)):
                logits = model(torch.tensor([p + c[:t]])).logits[0, -1]
                assert abs(torch.log_softmax(logits, -1)[c[t]].item() - lp[i, t].item()) < 1e-4


def test_log_probs_ignore_padding_and_prompt_tokens_never_enter_the_mask(tiny):
    model, tok = tiny
    p, c = [[20, 21, 22]], [[30, 31]]
    lp, mask = common.completion_logprobs(model, p, c, tok.pad_token_id)
    # a longer neighbour pads this row on both sides
    lp2, mask2 = common.completion_logprobs(model, p + [[5] * 9], c + [[6] * 7], tok.pad_token_id)
    assert torch.allclose(lp[0, :2], lp2[0, :2], atol=1e-6)
    assert mask2[0].tolist() == [1, 1, 0, 0, 0, 0, 0]
    _, mask3 = common.completion_logprobs(model, [[40, 41, 42, 43, 44]], c, tok.pad_token_id)
    assert mask3.tolist() == mask.tolist()


def nucleus_logprobs(model, samples, temperature: float, top_p: float) -> list[list[float]]:
    """Behaviour log-probs computed by hand: at every step, the distribution softmax(logits / T),
    its nucleus (the most probable tokens, in order, until their mass reaches top_p),
    renormalised."""
    out = []
    with torch.no_grad():
        for s in samples:
            logits = model(torch.tensor([s.prompt_ids + s.ids])).logits[0].float()
            lps = []
            for t, token in enumerate(s.ids):
                probs = torch.softmax(logits[len(s.prompt_ids) + t - 1] / temperature, -1)
                kept, mass = set(), 0.0
                for p, i in sorted(zip(probs.tolist(), range(len(probs))), reverse=True):
                    if mass >= top_p:
                        break
                    kept.add(i)
                    mass += p
                assert token in kept, "a token outside the nucleus was sampled"
                lps.append(math.log(probs[token].item() / mass))
            out.append(lps)
    return out


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.7), (0.7, 0.8)])
def test_hf_engine_log_probs_equal_teacher_forced_recomputation(tiny, temperature, top_p):
    """lp_mu is the log-prob under the distribution sampled from: tempered, and renormalised over
    the top-p nucleus (not the untruncated policy's: it differs by log(nucleus mass) at top-p < 1).
    """
    model, tok = tiny
    engine = common.HFEngine(model, tok)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ["45 12 3=36:", "1 2=3:"]]
    sc = common.SamplingConfig(n=4, max_new_tokens=24, temperature=temperature, top_p=top_p)
    flat = [s for g in engine.generate(prompts, sc) for s in g]
    assert len(flat) == 8 and all(len(s.logprobs) == len(s.ids) for s in flat)
    with torch.no_grad():
        lp, mask = common.completion_logprobs(model, [s.prompt_ids for s in flat],
                                              [s.ids for s in flat], tok.pad_token_id,
                                              temperature=temperature)
    by_hand = nucleus_logprobs(model, flat, temperature, top_p)
    for i, s in enumerate(flat):
        assert torch.allclose(torch.tensor(by_hand[i]), torch.tensor(s.logprobs), atol=1e-4)
        if top_p == 1.0:
            assert torch.allclose(lp[i, :len(s.ids)], torch.tensor(s.logprobs), atol=1e-4)
        assert s.finished == (tok.eos_token_id in s.ids)
        if s.finished:
            assert s.ids[-1] == tok.eos_token_id  # the EOS is the last token of the completion
    untruncated_gap = max((lp[i, :len(s.ids)] - torch.tensor(s.logprobs)).abs().max().item()
                          for i, s in enumerate(flat))
    assert untruncated_gap > 0.05 if top_p < 1 else untruncated_gap < 1e-4


def test_hf_engine_keeps_one_steps_scores_not_every_steps(tmp_path, monkeypatch):
    """The behaviour log-probs come without generate's output_scores, whose [B, T, V] stack took
    ~80 GB at Qwen's vocabulary: no tensor as wide as the vocabulary has more rows than the batch
    (one step's), and they are still the trainer's teacher-forced log-probs."""
    from torch.overrides import TorchFunctionMode
    small = common.TinyConfig(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=96)
    model, tok = common.load_model(common.build_tiny_model(str(tmp_path / "m"), cfg=small))
    V = model.config.vocab_size
    assert V not in (small.hidden_size, small.intermediate_size)  # only scores are V wide
    scores_asked, generate = [], model.generate

    def spy(**kwargs):
        scores_asked.append(kwargs.get("output_scores", False))
        return generate(**kwargs)
    monkeypatch.setattr(model, "generate", spy)

    class WidestScores(TorchFunctionMode):  # sees every torch call's result
        rows = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dim() and out.shape[-1] == V:
                self.rows = max(self.rows, out.numel() // V)
            return out

    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ["45 12 3=36:", "1 2=3:"]]
    sc = common.SamplingConfig(n=4, max_new_tokens=24, temperature=0.7, seed=3)
    with WidestScores() as widest:
        flat = [s for g in common.HFEngine(model, tok).generate(prompts, sc) for s in g]
    assert scores_asked and not any(scores_asked)
    assert 0 < widest.rows <= len(flat)  # old code: len(flat) * 24 rows
    with torch.no_grad():
        lp, _ = common.completion_logprobs(model, [s.prompt_ids for s in flat],
                                           [s.ids for s in flat], tok.pad_token_id,
                                           temperature=0.7)
    for i, s in enumerate(flat):
        assert len(s.logprobs) == len(s.ids) > 0
        assert torch.allclose(lp[i, :len(s.ids)], torch.tensor(s.logprobs), atol=1e-4)


def test_same_seed_same_samples(tiny):
    model, tok = tiny
    engine = common.HFEngine(model, tok)
    prompt = [tok("7 8 9=15:", add_special_tokens=False)["input_ids"]]
    common.setup(3)
    a = engine.generate(prompt, common.SamplingConfig(n=3, max_new_tokens=16))
    common.setup(3)
    b = engine.generate(prompt, common.SamplingConfig(n=3, max_new_tokens=16))
    assert [s.ids for s in a[0]] == [s.ids for s in b[0]]


def test_a_seeded_sampling_config_repeats_itself_and_leaves_the_global_rng_alone(tiny):
    model, tok = tiny
    engine = common.HFEngine(model, tok)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ["7 8 9=15:", "1 2=3:"]]
    seeded = common.SamplingConfig(n=4, max_new_tokens=16, seed=5)
    common.setup(3)
    a = engine.generate(prompts, seeded)
    after_a = torch.rand(1)
    common.setup(4)
    b = engine.generate(prompts, seeded)
    assert [s.ids for g in a for s in g] == [s.ids for g in b for s in g]
    common.setup(3)
    assert torch.equal(torch.rand(1), after_a)  # as if the seeded call had not happened
    other = engine.generate(prompts, common.SamplingConfig(n=4, max_new_tokens=16, seed=6))
    assert [s.ids for g in a for s in g] != [s.ids for g in other for s in g]


def test_pass_at_k_is_the_unbiased_estimator():
    assert scoring.pass_at_k(8, 0, 8) == 0.0
    assert scoring.pass_at_k(8, 8, 1) == 1.0
    assert scoring.pass_at_k(8, 1, 1) == pytest.approx(0.125)
    assert scoring.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert scoring.pass_at_k(8, 1, 8) == 1.0


CONFIGS = {"greedy": common.SamplingConfig(1, 64, 0.0),
           "sampled": common.SamplingConfig(4, 64, seed=0)}


class FixedEngine:
    """Returns given texts, so that evaluate() can be checked by hand."""
    def __init__(self, greedy, sampled):
        self.texts = {0.0: greedy, 1.0: sampled}

    def generate(self, prompts, sc):
        return [[common.Sample(p, [0] * len(t), t, [0.0] * len(t), True)
                 for t in self.texts[sc.temperature][i]] for i, p in enumerate(prompts)]


def test_evaluate_counts_accuracy_format_pass_and_majority():
    problems = [{"nums": [3, 5, 7], "target": 22}, {"nums": [2, 4], "target": 8}]
    ok, wrong, none = "<answer>3*5+7</answer>", "<answer>3+5</answer>", "no idea"
    engine = FixedEngine(greedy=[[ok], [none]],
                         sampled=[[ok, ok, wrong, none],
                                  [wrong.replace("3+5", "2+4")] * 3 + ["<answer>2*4</answer>"]])
    m = scoring.evaluate(engine, countdown, problems, [[1], [2]], CONFIGS, "original")
    assert m["greedy/accuracy"] == 0.5
    assert m["greedy/format_rate"] == 0.5
    assert m["greedy/reward"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["sampled/accuracy"] == pytest.approx(3 / 8)
    assert m["sampled/format_rate"] == pytest.approx(7 / 8)
    assert m["pass@4"] == 1.0
    assert m["maj@4"] == 0.5  # problem 1: "3*5+7" is the most frequent; problem 2: "2+4" (wrong) is
    assert "greedy/reward_B" not in m
    m = scoring.evaluate(engine, countdown, problems, [[1], [2]], CONFIGS, "A", all_rewards=True)
    assert m["greedy/reward"] == m["greedy/reward_A"] == pytest.approx((1.0 - 0.0003 * 2) / 2)
    assert m["greedy/reward_original"] == pytest.approx(0.5)
    assert m["greedy/reward_B"] == pytest.approx((1.0 - 0.2) / 2)
    assert m["sampled/reward_B"] == pytest.approx((3 * 1.0 + 4 * 0.0 - 0.2) / 8)


def test_bad_model_paths_are_usage_errors(tmp_path):
    with pytest.raises(common.UsageError, match="no such model folder"):
        common.resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(common.UsageError, match="no config.json"):
        common.resolve_model_path(str(tmp_path))
    assert common.resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_the_default_model_trains_an_sft_run_first_where_there_is_none(tmp_path, monkeypatch,
                                                                        capsys):
    """--model left out on a fresh clone: one line, then `python sft.py --task T` in its own run
    folder, then its final model; `--model sft` explicitly still stops with the one-line error."""
    import subprocess
    monkeypatch.chdir(tmp_path)  # no runs/ here
    calls = []

    def fake_sft(argv, *a, **k):  # stands in for sft.py: leaves a finished run behind
        calls.append(argv[1:])
        final = tmp_path / "runs" / "sft-countdown-1" / "final"
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        (final.parent / "config.json").write_text(json.dumps({"task": "countdown"}))
        return subprocess.CompletedProcess(argv, 0)
    monkeypatch.setattr(common.subprocess, "run", fake_sft)
    with pytest.raises(common.UsageError, match="no finished sft.py run"):
        common.resolve_model_path("sft", task="countdown")
    assert calls == []
    path = common.resolve_model_path(None, task="countdown")
    assert path == os.path.join("runs", "sft-countdown-1", "final")
    assert calls == [[os.path.join(os.path.dirname(common.__file__), "sft.py"), "--task",
                      "countdown"]]
    assert "training one first with `python sft.py --task countdown`" in capsys.readouterr().out
    assert common.resolve_model_path(None, task="countdown") == path and len(calls) == 1


def test_a_copied_out_script_without_sft_py_says_what_to_copy(tmp_path):
    """topr.py, common.py and tasks/ copied into an empty folder (as a course assignment does): with
    no --model and no sft.py beside it, one line says to copy sft.py or pass --model."""
    import shutil
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("topr.py", "common.py"):
        shutil.copy(os.path.join(root, name), tmp_path)
    shutil.copytree(os.path.join(root, "tasks"), tmp_path / "tasks")
    proc = subprocess.run([sys.executable, "topr.py", "--task", "countdown", "--train-size", "10",
                           "--eval-size", "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "no finished sft.py run of task countdown under runs/: copy sft.py here first, or pass "
        "--model")


def test_prompts_use_the_compact_form_for_the_tiny_model(tiny):
    model, tok = tiny
    style = common.prompt_style(model, tok)
    ids = common.encode_prompts(countdown, [{"nums": [45, 12, 3], "target": 36}], tok, style)
    assert tok.decode(ids[0]) == "45 12 3=36:"


def test_auto_engine_picks_by_device(tiny, monkeypatch):
    """auto: vLLM on a GPU when it is installed, else HF generate there (2.6x our loop's tokens/s
    on an H200); on a CPU our KV loop for the model types it is tested with, HF generate for the
    others; no measurement, no cache."""
    model, tok = tiny

    class FakeVLLM(common.HFEngine):
        name = "vllm"

        def __init__(self, path, tokenizer, **kw):
            super().__init__(model, tokenizer)

    monkeypatch.setattr(common, "VLLMEngine", FakeVLLM)
    monkeypatch.setattr(common, "vllm_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.make_engine("auto", model, tok, "unused").name == "kv"
    assert common.make_engine("vllm", model, tok, "unused").name == "vllm"
    assert common.make_engine("hf", model, tok, "unused").name == "hf"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert common.make_engine("auto", model, tok, "unused").name == "vllm"
    monkeypatch.setattr(common, "vllm_available", lambda: False)
    assert common.make_engine("auto", model, tok, "unused").name == "hf"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(model.config, "model_type", "gpt_neox")
    assert common.make_engine("auto", model, tok, "unused").name == "hf"
    with pytest.raises(common.UsageError, match="unknown engine"):
        common.make_engine("fast", model, tok, "unused")


# ---- the KV engine: HF generate's samples, token for token
KV_CONFIGS = [common.SamplingConfig(4, 40, 1.0, seed=3), common.SamplingConfig(1, 40, 0.0),
              common.SamplingConfig(4, 40, 0.7, 0.9, 30, seed=5),
              common.SamplingConfig(3, 12, 1.0, seed=7)]  # 12: many rows cut, none finished


@pytest.fixture(scope="module")
def weak_model(weak_sft):
    """A model that ends most completions early, so that rows leave the batch at different steps;
    prompts of different lengths (sizes 2 to 4), so that left padding differs by row."""
    from tasks import countdown
    common.setup(0, 1)
    model, tok = common.load_model(weak_sft)
    problems = SUMS[::13] + [p for n in (3, 4) for p in countdown.get_problems("test", 6, size=n)]
    return model, tok, common.encode_prompts(countdown, problems, tok, "compact")


@pytest.mark.parametrize("sc", KV_CONFIGS, ids=["T1", "greedy", "T0.7-top-p-top-k", "cut"])
def test_kv_engine_draws_the_samples_hf_generate_draws_under_the_same_seed(weak_model, sc):
    """Same model, same warpers, one multinomial over the whole batch a token: the same ids, texts,
    ends and behaviour log-probs as HF generate, even as finished rows leave the KV batch."""
    model, tok, prompts = weak_model
    hf = [s for g in common.HFEngine(model, tok).generate(prompts, sc) for s in g]
    kv = [s for g in common.KVEngine(model, tok).generate(prompts, sc) for s in g]
    lengths = {len(s.ids) for s in hf}
    if sc.temperature == 1 and sc.max_new_tokens > 12:
        assert len(lengths) > 3  # rows did finish at different steps
    assert [(s.prompt_ids, s.ids, s.text, s.finished) for s in kv] == \
        [(s.prompt_ids, s.ids, s.text, s.finished) for s in hf]
    for a, b in zip(kv, hf):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_kv_engine_keeps_its_cache_memory_and_nothing_left_in_it_reaches_a_sample(weak_model):
    """The arena keeps the cache's memory from call to call (no new allocation for a batch no
    larger than the last); whatever an earlier batch left there, NaN even, changes no sample: a
    reused engine draws what HF generate draws."""
    model, tok, prompts = weak_model
    engine = common.KVEngine(model, tok)
    engine.generate(prompts, common.SamplingConfig(4, 40, 1.0, seed=1))  # fills the arena
    for flat in engine.arena.values():
        flat.fill_(float("nan"))
    memory = {key: flat.data_ptr() for key, flat in engine.arena.items()}
    sc, fewer = common.SamplingConfig(2, 30, 1.0, seed=9), prompts[::3]
    reused = [s for g in engine.generate(fewer, sc) for s in g]
    hf = [s for g in common.HFEngine(model, tok).generate(fewer, sc) for s in g]
    assert [(s.ids, s.finished) for s in reused] == [(s.ids, s.finished) for s in hf]
    for a, b in zip(reused, hf):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert {key: flat.data_ptr() for key, flat in engine.arena.items()} == memory


def test_kv_engine_log_probs_are_the_trainers_and_it_leaves_the_model_as_it_was(weak_model):
    model, tok, prompts = weak_model
    attention = model.config._attn_implementation
    model.train()
    flat = [s for g in common.KVEngine(model, tok).generate(prompts, common.SamplingConfig(4, 40))
            for s in g]
    assert model.training and model.config._attn_implementation == attention
    with torch.no_grad():
        lp, mask = common.completion_logprobs(model, [s.prompt_ids for s in flat],
                                              [s.ids for s in flat], tok.pad_token_id)
    model.eval()
    gap = max((lp[i, :len(s.ids)] - torch.tensor(s.logprobs)).abs().max().item()
              for i, s in enumerate(flat))
    assert gap < 1e-4 and any(s.finished for s in flat) and any(len(s.ids) > 5 for s in flat)


def test_minutes_list_refuses_zero():  # scripts/time_to_accuracy.py --minutes
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts"))
    import time_to_accuracy
    assert time_to_accuracy.minutes_list("5,1,2") == [1.0, 2.0, 5.0]
    with pytest.raises(ValueError):
        time_to_accuracy.minutes_list("1,0")


def _full_vocabulary_logprobs(model, prompts, completions, pad_id, temperature):
    """The unchunked reference: log_softmax over the whole [B, C, V] logits, then the token's."""
    ids, attn, pos, mask, P = common.pad_batch(prompts, completions, pad_id)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(-1, ids[:, P:, None]).squeeze(-1) * mask


@pytest.mark.parametrize("chunk_bytes", [2**28, 4 * 128 * 3])  # one chunk; 3 rows a chunk
def test_chunked_output_layer_gives_the_full_log_softmax_and_its_gradient(tiny, chunk_bytes,
                                                                          monkeypatch):
    """completion_logprobs runs the output layer on chunks of completion tokens, recomputed in
    backward: the values and the gradient equal the [B, C, V] log-softmax's, temperature included
    (a chunk scored without the temperature, or a token misaligned by one, fails here)."""
    model, tok = tiny
    defaults = common.token_logprobs.__defaults__
    monkeypatch.setattr(common.token_logprobs, "__defaults__", (defaults[0], chunk_bytes))
    prompts = [[5, 6, 7, 8], [9, 10]]
    completions = [[11, 12, 13, 14, 15], [16, 17]]
    model.train()
    for temperature in (1.0, 0.7):
        lp, mask = common.completion_logprobs(model, prompts, completions, tok.pad_token_id,
                                              temperature=temperature)
        (lp.sum() * 0.5).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        ref = _full_vocabulary_logprobs(model, prompts, completions, tok.pad_token_id, temperature)
        (ref.sum() * 0.5).backward()
        assert torch.allclose(lp, ref, atol=1e-5)
        assert lp[1, 2:].abs().sum() == 0  # padding scores 0
        for g, p in zip(grads, model.parameters()):
            assert torch.allclose(g, p.grad, atol=1e-5)
        model.zero_grad()


def test_bf16_and_gradient_checkpointing_flags_keep_the_log_probs(tiny, tiny_path):
    """--bf16: the transformer under bf16 autocast, log-probs still fp32 and within bf16's rounding
    of the fp32 ones; --grad-checkpoint: the same values and gradients, recomputed in backward."""
    model, tok = tiny
    prompts, completions = [[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [16, 17]]
    model.train()
    lp, _ = common.completion_logprobs(model, prompts, completions, tok.pad_token_id)
    lp.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    half, _ = common.completion_logprobs(model, prompts, completions, tok.pad_token_id, bf16=True)
    assert half.dtype == torch.float32
    assert 0 < (half - lp).abs().max() < 0.1
    recomputed = common.load_model(tiny_path, grad_checkpoint=True)[0].train()
    assert recomputed.is_gradient_checkpointing and not model.is_gradient_checkpointing
    again, _ = common.completion_logprobs(recomputed, prompts, completions, tok.pad_token_id)
    again.sum().backward()
    assert torch.allclose(again, lp, atol=1e-6)
    for g, p in zip(grads, recomputed.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)


def test_setup_leaves_numpy_quiet_after_flushing_denormals():
    """With denormals flushed, numpy's first np.finfo warns twice a type ("smallest subnormal ...
    is zero"): eight lines at the start of every run, unless setup asked before flushing."""
    code = ("import common, numpy as np; common.setup(0, 1); "
            "np.finfo(np.float32); np.finfo(np.float64)")
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
