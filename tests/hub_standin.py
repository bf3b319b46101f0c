"""A stand-in with the shape of a hub chat model (Qwen2.5-Instruct), built locally in seconds.

What differs from the built-in tiny model, and is what a hub model brings:
  - the Qwen2 architecture (grouped-query attention, q/k/v biases, tied embeddings), weights
    saved in bfloat16 as hub checkpoints are;
  - a byte-level BPE tokenizer trained with `tokenizers` on Countdown text, with Qwen2's
    pre-tokenizer: words and runs of operators are single tokens (")+", " (", "answer");
  - a ChatML chat template with a default system prompt;
  - two EOS ids, <|im_end|> (the tokenizer's EOS, which ends an assistant turn) and <|endoftext|>
    (also the pad token, as in Qwen), both in generation_config.json;
  - a generation_config.json with its own sampling defaults (temperature 0.7, top-p 0.8, top-k 20,
    repetition penalty 1.1, as Qwen2.5-Instruct ships), which an engine must not apply silently.

Everything is saved with save_pretrained, so that the folder loads like a hub download through
AutoModelForCausalLM, AutoTokenizer and vLLM. Build one from the command line for the scripts:

    python tests/hub_standin.py /tmp/standin      # then: python rloo.py --model /tmp/standin ...
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tasks import countdown  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SYSTEM = "You are a helpful assistant."
# Qwen2.5's template without its tool-calling branches: a system turn is added when none is given.
CHATML = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2.5-0.5B-Instruct's generation_config.json sampling defaults.
HUB_SAMPLING_DEFAULTS = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20,
                             repetition_penalty=1.1)


def countdown_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Chat-formatted Countdown prompts and demonstrations: the text the BPE merges learn from."""
    texts = []
    for size in countdown.SIZES:
        for p in countdown.get_problems("train", n, size=size, seed=seed):
            demo = countdown.demonstration(p, steps=True) or countdown.demonstration(p) or ""
            texts.append(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
                         f"{countdown.prompt(p, 'instruct')}<|im_end|>\n<|im_start|>assistant\n"
                         f"{demo}<|im_end|>\n")
    return texts


def make_bpe_tokenizer(vocab_size: int = 512, pad_token: str = "<|endoftext|>"):
    """A byte-level BPE trained on Countdown text, wrapped for transformers.

    Its pipeline is Qwen2's (NFC, Qwen's split regex, byte level, no word-splitting regex), because
    transformers 5 rebuilds that pipeline for any qwen2-type folder whatever tokenizer.json says:
    with another one, AutoTokenizer and the `tokenizers` file would give different ids. So, as in
    Qwen, digits are single tokens while words and runs of operators merge (")+", "))*", " (").
    Every byte is in the alphabet: any text round-trips.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(countdown_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token=pad_token, chat_template=CHATML,
                                   model_max_length=512)


# Qwen2.5-0.5B's shape, for memory and speed on a GPU: build_standin(path, **QWEN_05B)
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_layers=24, heads=14,
                vocab_size=151936, max_positions=4096)


def build_standin(path: str, seed: int = 0, hidden_size: int = 128, num_layers: int = 4,
                  intermediate_size: int | None = None, heads: int = 4,
                  vocab_size: int | None = None, max_positions: int = 512,
                  pad_token: str = "<|endoftext|>") -> str:
    """Build the stand-in with random weights and save it as a hub-shaped folder at `path`
    (vocab_size: the tokenizer's, else larger: ids past the tokenizer decode to nothing).
    pad_token "<|im_end|>" gives SmolLM2's arrangement: the pad id is the EOS, which the chat
    template puts inside every prompt (after the system turn and after the user's)."""
    import json

    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tokenizer = make_bpe_tokenizer(pad_token=pad_token)
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(vocab_size=vocab_size or len(tokenizer), hidden_size=hidden_size,
                         intermediate_size=intermediate_size or 4 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=heads,
                         num_key_value_heads=2, max_position_embeddings=max_positions,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                         tie_word_embeddings=True, bos_token_id=eot, eos_token_id=im_end,
                         pad_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # peakier than N(0, 0.02) (near uniform), as a trained model's logits are
        model.get_input_embeddings().weight.normal_(0.0, 0.05)
    model.generation_config = GenerationConfig(bos_token_id=eot,
                                               pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=[im_end, eot], **HUB_SAMPLING_DEFAULTS)
    model.to(torch.bfloat16).save_pretrained(path)  # hub weights are bf16; config says so
    tokenizer.save_pretrained(path)
    cfg_file = os.path.join(path, "tokenizer_config.json")
    with open(cfg_file) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "Qwen2Tokenizer"  # as on the hub; transformers 5 picks it anyway
    with open(cfg_file, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/hub_standin.py OUT_DIR")
    print(build_standin(sys.argv[1]))
