"""Test helpers for the agent loop: a scripted engine, rows, a ChatML tokenizer with every byte."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt


class ScriptedEngine(RolloutEngine):
    """Answers each context with `policy(context) -> (token ids, finished)`; records every call.

    Log-prob of the k-th token of a sample: -(k + 1) / 10 - index / 1000, so a test can tell
    which call and sample a number came from.
    """

    def __init__(self, policy: Callable[[list[int]], tuple[list[int], bool]]) -> None:
        self.policy = policy
        self.calls: list[tuple[list[list[int]], Sampling]] = []
        self.token_limits: list[list[int]] = []  # each call's limit per prompt

    def generate(self, prompts: list[list[int]], sampling: Sampling, token_limits=None) -> list[RolloutSample]:
        self.calls.append(([list(p) for p in prompts], sampling))
        self.token_limits.append(limits_per_prompt(prompts, sampling, token_limits))
        samples = []
        for i, prompt in enumerate(prompts):
            tokens, finished = self.policy(prompt)
            cut = tokens[:self.token_limits[-1][i]]
            log_probs = [-(k + 1) / 10 - i / 1000 for k in range(len(cut))] if sampling.log_probs else []
            samples.append(RolloutSample(i, cut, log_probs, finished and len(cut) == len(tokens)))
        return samples

    def load_weights(self, named_tensors) -> None:
        raise NotImplementedError

    def score(self, sequences, prompt_len):
        raise NotImplementedError


def rows(tokenizer, contents: list[str], answers: list[str], data_source: str = "synthetic/lookup") -> list[PromptRow]:
    return [PromptRow(index=i, prompt_token_ids=tokenizer.apply_chat_template(
        [{"role": "user", "content": c}], add_generation_prompt=True, tokenize=True, return_dict=False),
        data_source=data_source, ground_truth=a, extra_info={"index": 100 + i},
        prompt=[{"role": "user", "content": c}])
        for i, (c, a) in enumerate(zip(contents, answers))]


# A ChatML template with roles and Hermes tools, in the shape of Qwen2.5's (written for these tests).
CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou may call these tools:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def chatml_tokenizer(out_dir: Path):
    """Byte-level BPE with every byte and a few merges, ChatML special tokens, Hermes tool tags."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from rlkit.core.tiny import _bytes_to_unicode

    symbols = list(_bytes_to_unicode().values())
    merges = [("t", "o"), ("to", "o"), ("too", "l"), ("Ġ", "t")]
    vocab = {s: i for i, s in enumerate(symbols + ["to", "too", "tool", "Ġt"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)
