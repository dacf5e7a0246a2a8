"""A tiny offline world: a character tokenizer and a small Qwen2 model, built without a hub.

The model is saved with `save_pretrained`, so it loads through exactly the path a hub
model takes (`--model PATH` -> AutoTokenizer/AutoModelForCausalLM, and vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# One token per character keeps prompts and answers unambiguous for a model this small.
SPECIAL_TOKENS = ["<pad>", "<|im_start|>", "<|im_end|>"]
CHARACTERS = list("0123456789+-*=?:#. abcdefghijklmnopqrstuvwxyz")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% endif %}"
)
# The tool-calling demo's one call (`rlkit train grpo-agent-demo`), spelled as ONE token: the
# vocabulary has no braces or quotes, and a 0.3M-parameter model starting from random weights
# finds one token by sampling (1/64 a try), never a 45-character JSON string. Decoded, it is the
# Hermes/Qwen2.5 call text, parsed like any model's (rlkit.core.agents.tools).
TOOL_CALL_TOKEN = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
# Bumped when the tiny world changes, so a cached copy (rlkit.core.state.run_dir) is rebuilt.
VERSION = 2


def build_tokenizer(out_dir: Path):
    """A byte-level BPE with no merges: one token per character, like Qwen2's own pipeline.

    transformers 5 rebuilds a Qwen2 model's tokenizer with Qwen2's byte-level pre-tokenizer
    and decoder whatever class was saved, so the vocabulary uses byte-level symbols
    (space is 'Ġ') and both load paths (ours, AutoTokenizer, vLLM) tokenize identically.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_symbol = {chr(b): s for b, s in _bytes_to_unicode().items()}
    symbols = SPECIAL_TOKENS + [byte_symbol[c] for c in CHARACTERS]
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.add_tokens([AddedToken(TOOL_CALL_TOKEN, special=False, normalized=False)])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def is_current(out_dir: Path) -> bool:
    """A tiny model built by this version of rlkit sits in out_dir."""
    try:
        return json.loads((Path(out_dir) / "rlkit_tiny.json").read_text()).get("version") == VERSION
    except (OSError, ValueError):
        return False


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table (what byte-level BPE uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tiny_qwen2(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised Qwen2 (head_dim 64: vLLM's CPU attention needs >= 32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    config = Qwen2Config(
        # Rounded up like real vocabularies; transformers 5 adds '<|endoftext|>' on reload.
        vocab_size=64,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    provenance = {"seed": seed, "params": model.num_parameters(), "version": VERSION}
    (out / "rlkit_tiny.json").write_text(json.dumps(provenance))
    return out
