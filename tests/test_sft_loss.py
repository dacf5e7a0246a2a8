"""SFT's loss: hand-computed token means, the worker's micro-step against a plain transformers
forward, and masked tokens that get no gradient.

The policy worker runs in this process (a one-rank gloo group), without Ray, on the tiny Qwen2.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from rlkit.core.algos.sft import sft_loss
from rlkit.core.batch import Batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.sft import SFTExample, sft_batch
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.loader import load_config

# Two sequences: 2 and 1 trained tokens; the -9s sit under loss mask 0 and must count for nothing.
LOG_PROBS = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_token_mean_of_a_two_sequence_batch_by_hand() -> None:
    assert sft_loss(LOG_PROBS, MASK).item() == pytest.approx((1 + 2 + 3) / 3)
    # Each sequence the same weight instead: (mean(1, 2) + 3) / 2.
    assert sft_loss(LOG_PROBS, MASK, "seq-mean-token-mean").item() == pytest.approx((1.5 + 3) / 2)


def test_micro_batches_normalised_by_the_mini_batch_add_up_to_its_loss() -> None:
    parts = [sft_loss(LOG_PROBS[i:i + 1], MASK[i:i + 1], global_num_tokens=3.0, global_num_seqs=2.0) for i in (0, 1)]
    assert [p.item() for p in parts] == pytest.approx([3 / 3, 3 / 3])
    assert sum(parts).item() == pytest.approx(sft_loss(LOG_PROBS, MASK).item())


@pytest.fixture
def worker() -> Iterator[PolicyWorker]:
    config = load_config("sft", ["model.path=rlkit:tiny-qwen2", "data.train_files=[unused.parquet]",
                                 "data.max_prompt_length=16", "data.max_response_length=16", "trainer.device=cpu",
                                 "actor.lr=1e-2", "actor.warmup_steps=0", "actor.lr_schedule=constant"])
    worker = PolicyWorker(config, resolve_model_path(config.model.path), rank=0, world_size=1)
    worker.setup("127.0.0.1", free_port(), False)
    yield worker
    dist.destroy_process_group()


def two_sequences() -> Batch:
    """Prompts of 3 and 2 tokens; responses of 2 and 4 tokens, the second with two context tokens
    (loss mask 0, as a user turn inside a chat)."""
    return sft_batch([SFTExample(0, [5, 6, 7], [20, 2], [1, 1]),
                      SFTExample(1, [8, 9], [21, 2, 1, 22], [1, 0, 0, 1])], pad_id=0)


def reference_loss(model_path: str, batch: Batch, *, train_prompt: bool = False) -> tuple[torch.Tensor, torch.nn.Module]:
    """transformers' own causal-LM loss (labels -100 where nothing is trained), summed over tokens and
    divided by the trained-token count: the token mean, computed with nothing of rlkit's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    total, count = torch.zeros(()), 0
    width_r = batch["responses"].shape[1]
    for ids, attention, mask in zip(batch["input_ids"], batch["attention_mask"], batch["response_mask"]):
        real = attention.bool()
        labels = ids.clone()  # transformers shifts them: position t's output is scored against labels[t + 1]
        if not train_prompt:
            labels[:-width_r] = -100
        labels[-width_r:][mask == 0] = -100
        sequence, labels = ids[real][None], labels[real][None]
        out = model(input_ids=sequence, labels=labels)
        n = int((labels[0, 1:] != -100).sum())
        total, count = total + out.loss * n, count + n
    return total / count, model


def worker_loss(worker: PolicyWorker, batch: Batch) -> torch.Tensor:
    mask = batch["response_mask"]
    worker.actor.model.module.zero_grad(set_to_none=True)
    loss, _ = worker.actor._sft_micro_step(batch, {"num_tokens": float(mask.sum()), "num_seqs": float(len(batch))})
    loss.backward()
    return loss.detach()


def embedding_grad(module: torch.nn.Module) -> torch.Tensor:
    grad = module.get_input_embeddings().weight.grad
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def test_the_micro_step_is_transformers_loss_with_the_prompt_ignored(worker: PolicyWorker) -> None:
    batch = two_sequences()
    loss = worker_loss(worker, batch)
    reference, model = reference_loss(worker.model_path, batch)
    reference.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    torch.testing.assert_close(embedding_grad(worker.actor.model.module), embedding_grad(model), rtol=1e-4, atol=1e-6)
    # Had the prompt been trained, the loss would differ: the prompt tokens are really left out.
    with_prompt, _ = reference_loss(worker.model_path, batch, train_prompt=True)
    assert abs(with_prompt.item() - loss.item()) > 1e-2


def test_masked_targets_get_no_gradient(worker: PolicyWorker) -> None:
    batch = two_sequences()
    loss = worker_loss(worker, batch)
    grads = [p.grad.full_tensor().clone() for p in worker.actor.model.module.parameters()]
    # Change the targets under loss mask 0 (not the input tokens): nothing may move.
    perturbed = Batch(dict(batch.tensors), batch.meta)
    perturbed["responses"] = batch["responses"].clone()
    perturbed["responses"][1, 1:3] = torch.tensor([30, 31])
    assert worker_loss(worker, perturbed).item() == loss.item()
    for before, param in zip(grads, worker.actor.model.module.parameters()):
        assert torch.equal(param.grad.full_tensor(), before)
    # A trained target does count.
    perturbed["responses"][1, 3] = 30
    assert worker_loss(worker, perturbed).item() != loss.item()


def test_updates_lower_the_loss_and_validation_measures_the_same_loss(worker: PolicyWorker) -> None:
    batch = two_sequences()
    mask = batch["response_mask"]
    norm = {"num_tokens": float(mask.sum()), "num_seqs": float(len(batch))}
    before = worker.evaluate_offline(batch, norm)
    assert before["loss"] == pytest.approx(worker_loss(worker, batch).item(), rel=1e-6)
    losses = [worker.update_offline([batch], [norm])["actor/loss"] for _ in range(5)]
    assert losses[0] == pytest.approx(before["loss"], rel=1e-6)  # the first update's loss is the starting policy's
    after = worker.evaluate_offline(batch, norm)
    assert after["loss"] < 0.5 * before["loss"]
    assert 0.0 <= after["token_accuracy"] <= 1.0 and after["token_accuracy"] >= before["token_accuracy"]


def test_a_held_out_set_is_padded_to_the_ranks_with_rows_that_count_for_nothing() -> None:
    from rlkit.core.batch import pad_to_ranks

    batch = Batch(dict(two_sequences().tensors))
    assert pad_to_ranks(batch, 2) is batch
    padded = pad_to_ranks(batch, 4)  # 2 rows over 4 ranks: two copies of row 0 and row 1, loss mask 0
    assert torch.equal(padded["input_ids"], torch.cat([batch["input_ids"], batch["input_ids"]]))
    assert torch.equal(padded["response_mask"][2:], torch.zeros_like(batch["response_mask"]))
    assert padded["response_mask"].sum() == batch["response_mask"].sum() == 4  # 2 + 2 trained tokens
