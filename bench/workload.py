"""The benchmark workload: a Qwen2.5-0.5B-shaped model with random weights, fixed-shape prompts.

GRPO with fixed shapes: 64 prompts x 8 samples, prompts of exactly 256 tokens, responses
forced to 512 tokens (EOS ignored). The tokenizer encodes one token per character, so a
prompt of 256 letters is exactly 256 tokens for rlkit, vLLM and TRL alike. `--tiny` shrinks everything to run on a CPU.
Larger shapes (`SHAPES`: Qwen2.5-1.5B, -3B and -7B) measure what fits on one device (LoRA vs full fine-tuning).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

# bf16 dense matrix-multiply rate of one H200 measured here (device KINDS.md, 2026-10-28/11-04);
# the benchmark measures it again in its own run and uses that when it can.
H200_BF16_PEAK_FLOPS = 790e12
H200_DATASHEET_BF16_FLOPS = 989e12


@dataclass(frozen=True)
class Workload:
    prompts: int = 64
    samples: int = 8
    prompt_tokens: int = 256
    response_tokens: int = 512
    hidden: int = 896
    intermediate: int = 4864
    layers: int = 24
    heads: int = 14
    kv_heads: int = 2
    vocab: int = 151936
    max_positions: int = 32768
    tied: bool = True  # input embedding and output head share one matrix (0.5B, 1.5B, 3B; not 7B)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    def forward_flops_per_sequence(self) -> float:
        """Matrix-multiply FLOPs of one forward over one sequence, as rlkit computes it.

        Linear layers: 2 x params x every token. Vocabulary head: 2 x hidden x vocab at each
        position that predicts a response token (rlkit and TRL both skip it on the prompt).
        Causal attention: QK^T and AV over the lower triangle, 2 x 2 x L^2/2 x hidden per layer.
        """
        h, kv = self.hidden, self.kv_heads * self.head_dim
        per_layer = h * h * 2 + h * kv * 2 + 3 * h * self.intermediate
        length = self.prompt_tokens + self.response_tokens
        linear = 2 * per_layer * self.layers * length
        head = 2 * h * self.vocab * self.response_tokens
        attention = 2 * length * length * h * self.layers
        return float(linear + head + attention)

    def phase_flops(self) -> dict[str, float]:
        """Model FLOPs of each training phase over the whole step (backward = 2 x forward; recompute not counted)."""
        forward = self.forward_flops_per_sequence() * self.sequences
        return {"old_log_prob": forward, "ref": forward, "update_actor": 3 * forward}


FULL = Workload()
TINY = Workload(prompts=4, samples=4, prompt_tokens=16, response_tokens=8, hidden=128, intermediate=256,
                layers=2, heads=2, kv_heads=2, vocab=512, max_positions=256)
# Model shapes of Qwen2.5 (config.json of each), same batch as FULL.
SHAPES = {
    "0.5b": FULL,
    "1.5b": Workload(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2),
    "3b": Workload(hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2),
    "7b": Workload(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152064, tied=False),
}


def prepared(workdir: str | Path, tiny: bool, shape: str = "0.5b") -> tuple[Workload, Path]:
    """The workload (TINY, or the model shape named) and its folder, built there on first use and shared by later runs."""
    workload, folder = (TINY if tiny else SHAPES[shape]), Path(workdir)
    if not (folder / "workload.json").exists():
        build(workload, folder)
    elif Workload(**json.loads((folder / "workload.json").read_text())) != workload:
        raise SystemExit(f"{folder} holds another workload ({folder / 'workload.json'}); use a new --workdir")
    return workload, folder


def bench_tokenizer(vocab_size: int):
    """The workload's tokenizer. transformers 5 loads any Qwen2 model's tokenizer as byte-level BPE, so the vocabulary
    is byte-level too (as rlkit.core.tiny does): the 256 byte symbols, one token per character when encoding (no
    merges), then filler entries up to the model's vocabulary so every sampled id decodes, then the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlkit.core.tiny import _bytes_to_unicode

    byte_symbols = list(_bytes_to_unicode().values())
    filler = vocab_size - len(byte_symbols) - 3
    vocab = {s: i for i, s in enumerate(byte_symbols + [f"w{i}" for i in range(filler)])}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab.update({s: len(vocab) + k for k, s in enumerate(specials)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])


def build(workload: Workload, out_dir: str | Path, seed: int = 0, prompt_rows: int | None = None) -> dict[str, str]:
    """Write the model, its tokenizer and a prompt parquet under out_dir; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    model_dir = out / "model"
    tokenizer = bench_tokenizer(workload.vocab)
    vocab = tokenizer.get_vocab()
    tokenizer.save_pretrained(model_dir)
    config = Qwen2Config(
        vocab_size=workload.vocab, hidden_size=workload.hidden, intermediate_size=workload.intermediate,
        num_hidden_layers=workload.layers, num_attention_heads=workload.heads,
        num_key_value_heads=workload.kv_heads, head_dim=workload.head_dim,
        max_position_embeddings=workload.max_positions, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=workload.tied, use_sliding_window=False, bos_token_id=None,
        pad_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"], torch_dtype="bfloat16")
    torch.manual_seed(seed)
    # A larger shape is drawn on the GPU in bf16 (seconds, where the 7B drawn in fp32 on the host is 30 GB of work); the 0.5B
    # stays drawn on the host, so its weights are the ones every earlier figure used.
    on_gpu = torch.cuda.is_available() and workload not in (FULL, TINY)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = Qwen2ForCausalLM._from_config(config, dtype=torch.bfloat16 if on_gpu else torch.float32)
    model = model.to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    model.generation_config.save_pretrained(model_dir)
    del model
    if on_gpu:  # run_all.py builds in the parent process: its lanes need the card's memory back
        torch.cuda.empty_cache()

    rng = random.Random(seed)
    rows = prompt_rows or workload.prompts * 8
    letters = "abcdefghijklmnopqrstuvwxyz "  # one token each
    prompts = ["".join(rng.choice(letters) for _ in range(workload.prompt_tokens)) for _ in range(rows)]
    data = out / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "bench", "prompt": p, "reward_model": {"ground_truth": ""}} for p in prompts]), data)
    (out / "workload.json").write_text(json.dumps(asdict(workload)))
    return {"model": str(model_dir), "data": str(data)}
