"""A real tokenizer and a Qwen2 model built from scratch for a task, offline (no model hub).

`build_tokenizer` trains a byte-level BPE with the `tokenizers` library on the task's texts,
with Qwen2's own pre-tokenizer (its regex isolates every digit, so numbers are spelled digit by
digit, which helps arithmetic) and a Qwen2 chat template; `build_model` writes a randomly
initialised Qwen2 of a named size next to it. Both are saved with `save_pretrained`, so the
directory loads through exactly the path a hub model takes (`--model DIR` -> AutoTokenizer,
AutoModelForCausalLM, vLLM). The pipeline that makes them useful is SFT then RL (docs/learning.md).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterable

# What transformers 5 rebuilds any Qwen2 tokenizer with on load (models/qwen2/tokenization_qwen2.py):
# training with the same pre-tokenizer makes the trained merges and the loaded tokenizer agree.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2's template without the default system message (every token of a prompt costs on a small model), and
# Qwen2.5's tool format: `tools=` (function schemas) as a system turn listing them in <tools>, an assistant's
# `tool_calls` as <tool_call>{"name": ..., "arguments": ...}</tool_call> after its content (what the policy writes
# and rlkit.core.agents.tools parses), consecutive "tool" messages as one user turn of <tool_response> blocks.
# A scratch model then takes the path a Qwen2.5 model takes: SFT rows with tools, rlkit's tool loop, TRL's. A tool
# shows its name, description and parameters only: transformers' schema of a function (TRL's `tools=`) also has
# "return", rlkit's has not, and the prompts a model was trained on must not change with the trainer.
CHAT_TEMPLATE = (
    '{%- if tools %}{{ \'<|im_start|>system\\nTools (call one as <tool_call>{\\"name\\": ..., '
    '\\"arguments\\": {...}}</tool_call>):\\n<tools>\\n\' }}'
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}"
    "{{ {'name': f.name, 'description': f.description, 'parameters': f.parameters} | tojson }}{{ '\\n' }}"
    "{%- endfor %}{{ '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set call = call.function if call.function is defined else call %}"
    "{{ '<tool_call>{\\\"name\\\": ' + (call.name | tojson) + ', \\\"arguments\\\": ' }}"
    "{{- (call.arguments if call.arguments is string else (call.arguments | tojson)) + '}</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2.5's tool tags, one token each where the task has tool calls (added, not special: decoded text keeps them,
# the parser reads them).
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
ROLE_NAMES = ["system\n", "user\n", "assistant\n"]
# Named sizes: hidden, layers, intermediate (heads = hidden / 64: vLLM's CPU attention needs head_dim 64).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (128, 2, 512),  # ~0.6M parameters with a 512-token vocabulary: CPU tests
    "small": (256, 4, 1024),  # ~4.3M: CPU, a few minutes
    "base": (512, 8, 2048),  # ~34M
    "large": (768, 12, 3072),  # ~114M: the GPU benchmark
}


def build_tokenizer(texts: Iterable[str], out_dir: str | Path, *, vocab_size: int = 1024):
    """Train a byte-level BPE of `vocab_size` tokens (specials included) on `texts`; save it to out_dir. Texts with
    tool calls (a tool task's chats) also get Qwen2.5's tool tags as tokens of their own; a task without them keeps
    the vocabulary, hence the model's size and initialisation, that it had before tools existed."""
    texts = list(texts)
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat template's role names, often enough to be merged into whole tokens.
    backend.train_from_iterator(itertools.chain(texts, ROLE_NAMES * 1000), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=IM_END, additional_special_tokens=[IM_START]
    )
    if any(TOOL_TAGS[0] in text for text in texts):
        tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_model(
    out_dir: str | Path, tokenizer, *, size: str = "tiny", max_positions: int = 1024, seed: int = 0
) -> Path:
    """A randomly initialised Qwen2 of a named size (SIZES) for `tokenizer`, saved to out_dir beside it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    hidden, layers, intermediate = SIZES[size]
    out = Path(out_dir)
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,  # rounded up, like real vocabularies
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    (out / "rlkit_scratch.json").write_text(json.dumps({"size": size, "seed": seed, "params": model.num_parameters()}))
    return out


def build_task_model(
    texts: Iterable[str], out_dir: str | Path, *, size: str = "tiny", vocab_size: int = 1024, seed: int = 0
) -> Path:
    """Tokenizer trained on `texts` and a fresh model of `size`, in one directory (a `--model DIR`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return build_model(out, build_tokenizer(texts, out, vocab_size=vocab_size), size=size, seed=seed)
