"""The trainer's compile warm-up: its compiled passes run once on a two-sequence batch while the run sets up.

With model.compile each decoder layer's forward and the log-prob kernels are compiled (or loaded from the
compile caches) where a pass first calls them, in each mode: the no-grad passes (the reference's and the old
log-probs'), and the update's forward and backward. Left to step 1, that took 15-20 s of it from warm caches and
~65 s from cold ones on an H100 (docs/startup.md), while the rollout engine's start, just before, keeps the
device's CPU busy and its GPU mostly idle. `warm_up_passes` runs those passes on a batch of two short sequences
so the compiles happen then; the rollout engine runs it beside its start where it can (rlkit.core.rollout.engines:
make_engine's `beside_start`), and a trainer whose engine lives on other devices runs it while they start theirs.

The compiled code is kept by torch in the process and guarded on what it was traced for: dynamic shapes
(`torch.compile(dynamic=True)`) cover every batch's lengths, so the first real pass reuses it. The sizes below are
chosen not to equal each other or a model's dimensions (dynamo would assume the equality and compile again when a
real batch breaks it). The update's gradient clip and optimizer step run too, on zero gradients at learning rate 0.
Nothing of the run changes: no weight moves, the gradients and the optimizer's state are dropped, the RNG streams
are restored and the module's train/eval mode put back. What the passes held stays in torch's caching allocator
until the caller empties it (beside a measuring engine start it must not go back to the device mid-profile).
"""

from __future__ import annotations

import torch

from rlkit.core.batch import Batch
from rlkit.core.train import fsdp, logprobs, packing
from rlkit.core.train.model import TrainableModel

# Two sequences: (prompt, response) lengths.
SEQUENCES = ((7, 16), (9, 21))
# The log-prob kernels' chunks during the warm-up: the 37 response tokens as 12 + 12 + 12 + 1, so that the kernels
# are traced on chunks shorter than the logits they are cut from (as a real batch's are: 441 tokens a chunk of a
# 152k vocabulary) and on a chunk of one token, a size dynamo compiles apart (a batch of 441 n + 1 tokens ends so).
# On CUDA the kernels are Triton's (rlkit.core.train.logprob_triton), given the whole logits as one chunk (the fused
# head's chunks as they come); the warm-up's first calls compile them for the real vocabulary and row stride.
CHUNK_ROWS = 12
# Memory the compile's own work may hold at once beyond the passes' tensors (autotuning, workspaces).
COMPILE_HEADROOM_BYTES = 1 << 30


def dummy_batch(vocab_size: int) -> Batch:
    """The warm-up's batch in the rollout layout (prompts left-padded, responses right-padded), tokens fixed."""
    prompt_width = max(p for p, _ in SEQUENCES)
    response_width = max(r for _, r in SEQUENCES)
    rows = len(SEQUENCES)
    ids = torch.zeros(rows, prompt_width + response_width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response_mask = torch.zeros(rows, response_width, dtype=torch.long)
    tokens = torch.arange(ids.numel()).view_as(ids) * 7919 % max(vocab_size - 1, 1) + 1
    for row, (prompt, response) in enumerate(SEQUENCES):
        span = slice(prompt_width - prompt, prompt_width + response)
        ids[row, span] = tokens[row, span]
        attention[row, span] = 1
        response_mask[row, :response] = 1
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "responses": ids[:, prompt_width:],
            "response_mask": response_mask,
        }
    )


def warm_up_passes(
    model: TrainableModel,
    device: torch.device,
    *,
    temperature: float,
    fused_head: bool,
    old_log_probs: bool,
    reference: bool,
    entropy_grad: bool,
) -> None:
    """Run each pass a step runs, once, on `dummy_batch`: the actor's no-grad log-probs (with entropy) when the
    run has an old-log-prob pass (`old_log_probs`: not Algorithm.old_log_probs_from_update), the reference's when
    it has one (`reference`: Algorithm.reference), and the update's forward and backward (its entropy
    differentiated when `entropy_grad`: an entropy term in the loss). A pass the run never makes is not warmed:
    each compiles graphs of its own (no-grad, and the reference's frozen weights, are guarded apart), which beside
    the engine's start can be what the start waits for. Collective under FSDP: every rank calls it."""
    module = model.module
    packed = packing.pack(dummy_batch(module.config.get_text_config().vocab_size)).to(device)
    was_training = module.training
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), logprobs.chunk_rows(CHUNK_ROWS):
        module.eval()
        with torch.no_grad():
            if old_log_probs:
                fsdp.packed_log_probs(module, packed, temperature=temperature, with_entropy=True, fused_head=fused_head)
            if reference:
                with model.reference() as base:
                    fsdp.packed_log_probs(
                        base, packed, temperature=temperature, with_entropy=False, fused_head=fused_head
                    )
        module.train()
        log_probs, entropy = fsdp.packed_log_probs(
            module, packed, temperature=temperature, with_entropy=True, fused_head=fused_head, entropy_grad=entropy_grad
        )
        # Weighted as the update's loss weighs tokens: the gradients reach the log-prob kernels' backward as dense
        # tensors. A plain sum's is one value broadcast (stride 0), which dynamo guards apart: the first real update
        # compiled that backward again (seen on a CPU with dynamo's eager backend).
        loss = (log_probs * torch.ones_like(log_probs)).sum() + (entropy * torch.ones_like(entropy)).sum()
        loss.backward()  # a detached entropy adds nothing to the backward
        _still_optimizer_step(model)
    module.train(was_training)


def _still_optimizer_step(model: TrainableModel) -> None:
    """The update's gradient clip and optimizer step, once, moving nothing. Their first calls cost on their own:
    DTensor's sharding rules worked out for each parameter's operations, the optimizer's state allocated (a
    24-layer model's first clip took 0.73 s on a CPU, 0.01 s after; step 1's update ran 3.7 s over the next on an
    H100 with the passes warmed). The gradients are zeroed and the learning rate set to 0, so AdamW adds 0 to
    each weight and multiplies it by exactly 1 (its weight decay); the state it made is then dropped, and the
    next step makes it afresh, as a first step does. The learning rate goes back as it was (the schedule is not
    stepped)."""
    optimizer = model.optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for param in params:
        param.grad = torch.zeros_like(param)
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    if hasattr(norm, "full_tensor"):  # as the update reads it (rlkit.core.train.learner.optimize)
        norm.full_tensor()
    rates = [group["lr"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        optimizer.step()
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        optimizer.state.clear()
        optimizer.zero_grad(set_to_none=True)


def warm_up_bytes(
    trainable_shard_bytes: int, full_elements: int, *, activation_bytes_per_token: int, compute_dtype_bytes: int
) -> int:
    """Device memory `warm_up_passes` may hold at its peak: the trainable parameters' gradients and AdamW's two
    moments of them (3 x `trainable_shard_bytes`, this rank's shard), every layer's gathered compute-dtype copy
    (`full_elements`, all parameters), the batch's activations and the compile's headroom."""
    tokens = sum(p + r for p, r in SEQUENCES)
    return (
        3 * trainable_shard_bytes
        + full_elements * compute_dtype_bytes
        + tokens * activation_bytes_per_token
        + COMPILE_HEADROOM_BYTES
    )


def meta_config(model_path: str):
    """The transformers config of the model at `model_path`."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)


def meta_numels(model_path: str) -> dict[str, int]:
    """Elements of each parameter of the causal LM at `model_path`, built on the meta device: no memory, no
    weights read (tied weights counted once, as the loaded model holds them)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(meta_config(model_path))
    return {name: p.numel() for name, p in model.named_parameters()}
