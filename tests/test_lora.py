"""LoRA on the policy (model.lora.rank > 0): only adapters train, the reference is the base with
adapters off, the engine gets merged weights under the base model's names, checkpoints hold
the adapters and resume exactly, and a weight sync that never reaches the engine is caught.

One policy worker runs in this process (a world of one, gloo, the HF engine), without Ray.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from test_old_log_probs import OWN_OLD, _batch, _update

from rlkit.core.batch import Batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.rollout.base import Sampling
from rlkit.core.rollout.sync_check import (
    FIRST_CHANGE_KEY,
    WeightSyncError,
    check_weight_sync,
)
from rlkit.core.state.shards import SHARDS_DIR
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.loader import load_config

LORA = ["rollout.name=hf", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1", "data.train_batch_size=4",
        "actor.mini_batch_size=4", "rollout.n=2", "actor.micro_batch_tokens=32", "actor.lr=1e-2",
        "model.lora.rank=4", "model.lora.alpha=8"]


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PolicyWorker]:
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    policy = PolicyWorker(load_config("grpo-demo", LORA), str(resolve_model_path("rlkit:tiny-qwen2")), 0, 1)
    policy.setup("127.0.0.1", free_port())
    yield policy
    dist.destroy_process_group()


def full(param: torch.Tensor) -> torch.Tensor:
    return (param.full_tensor() if hasattr(param, "full_tensor") else param).detach().clone()


def base_weights_hash(worker: PolicyWorker) -> str:
    digest = hashlib.sha256()
    for name, param in worker.actor.model.module.named_parameters():
        if ".lora_" not in name:
            digest.update(name.encode() + full(param).numpy().tobytes())
    return digest.hexdigest()


def adapters(worker: PolicyWorker) -> dict[str, torch.Tensor]:
    return {n: full(p) for n, p in worker.actor.model.module.named_parameters() if ".lora_" in n}


def with_reference(worker: PolicyWorker) -> Batch:
    batch = _batch()
    batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
    return batch


def test_adapters_are_added_inside_the_matrix_product_as_peft_would_add_them() -> None:
    """Each LoRA layer adds s (x A^T) B^T into its base output in place (addmm_) instead of peft's three-tensor sum:
    the same logits and the same adapter gradients as peft's own forward; adapters off still give the base model."""
    from transformers import AutoModelForCausalLM

    from rlkit.core.train.adapters import adapters_off, add_lora, lora_layers
    from rlkit.recipes.schema import LoraSettings

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("rlkit:tiny-qwen2"), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    base_logits = model(ids).logits.detach()
    model = add_lora(model, LoraSettings(rank=4, alpha=8), seed=0)
    layers = lora_layers(model)
    with torch.no_grad():
        for layer in layers.values():
            layer.lora_B["default"].weight.normal_(std=0.5)  # peft starts B at zero: give the adapters a product

    def logits_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logits = model(ids).logits
        logits.square().mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    q_proj = next(layer for name, layer in layers.items() if name.endswith("layers.0.self_attn.q_proj"))
    added = q_proj(torch.randn(2, 3, q_proj.in_features)).grad_fn
    assert type(added).__name__ == "ViewBackward0" and type(added.next_functions[0][0]).__name__ == "AddmmBackward0"
    fused_logits, fused_grads = logits_and_grads()
    for layer in layers.values():
        del layer.forward  # peft's own forward again
    peft_logits, peft_grads = logits_and_grads()
    assert torch.allclose(fused_logits, peft_logits, atol=1e-6) and not torch.allclose(fused_logits, base_logits)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 2 * len(layers)
    for name, grad in fused_grads.items():
        assert torch.allclose(grad, peft_grads[name], rtol=1e-5, atol=1e-7), name
    model = add_lora(AutoModelForCausalLM.from_pretrained(resolve_model_path("rlkit:tiny-qwen2"), dtype=torch.float32),
                     LoraSettings(rank=4, alpha=8), seed=0)
    for layer in lora_layers(model).values():
        torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.5)
    with adapters_off(model), torch.no_grad():
        assert torch.equal(model(ids).logits, base_logits)


def test_an_update_changes_only_the_adapters(worker: PolicyWorker) -> None:
    module = worker.actor.model.module
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    # 2 layers x 7 linear modules x (A, B), and nothing else in the optimizer.
    assert len(trainable) == 28 and all(".lora_" in n for n in trainable)
    assert sum(len(g["params"]) for g in worker.actor.model.optimizer.param_groups) == 28
    base_before, adapters_before = base_weights_hash(worker), adapters(worker)
    batch = with_reference(worker)  # a reference pass (adapters off) before each update
    for _ in range(2):
        _update(worker, batch, OWN_OLD)
        batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
    assert base_weights_hash(worker) == base_before
    after = adapters(worker)
    assert all(not torch.equal(after[n], adapters_before[n]) for n in after)  # every A and B moved


def test_the_reference_is_the_base_model_with_adapters_off(worker: PolicyWorker) -> None:
    from transformers import AutoModelForCausalLM

    batch = with_reference(worker)
    # B starts at zero: before training, the policy is the base model exactly.
    assert torch.equal(worker.actor_log_probs(batch)["log_probs"], batch["ref_log_probs"])
    _update(worker, batch, OWN_OLD)
    assert not torch.equal(worker.actor_log_probs(batch)["log_probs"], batch["ref_log_probs"])
    assert torch.equal(worker.reference_log_probs(batch)["log_probs"], batch["ref_log_probs"])
    base = AutoModelForCausalLM.from_pretrained(worker.model_path, dtype=torch.float32).eval()
    row, mask = batch["attention_mask"][0].bool(), batch["response_mask"][0].bool()
    ids = batch["input_ids"][0][row]
    with torch.no_grad():
        log_probs = base(input_ids=ids[None]).logits[0, :-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]
    torch.testing.assert_close(batch["ref_log_probs"][0][mask], log_probs[-int(mask.sum()):], rtol=0, atol=1e-5)


def test_the_engine_gets_merged_weights_under_the_base_models_names(worker: PolicyWorker) -> None:
    samples = worker.generate([[1, 26, 24, 29]], Sampling(n=1, max_tokens=3, seed=1))
    assert FIRST_CHANGE_KEY not in worker.sync_weights()  # B = 0: the base model's weights, unchanged
    batch = with_reference(worker)
    _update(worker, batch, OWN_OLD)
    synced = worker.sync_weights()
    assert synced[FIRST_CHANGE_KEY] > 0  # the first sync of changed weights changed the engine
    names = [name for name, _ in worker.actor.model.engine_weights()]
    assert names == [n for n, _ in worker.generation.engine.model.named_parameters()]  # HF names, same order, no peft parts
    trainer = worker.actor_log_probs(batch)["log_probs"]
    for row in range(len(batch)):
        mask = batch["response_mask"][row].bool()
        sequence = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        engine = worker.generation.engine.score([sequence], len(sequence) - int(mask.sum()))[0]
        torch.testing.assert_close(torch.tensor(engine), trainer[row][mask], rtol=0, atol=1e-5)
    assert samples  # the probe came from this rollout


def test_a_sync_that_never_reaches_the_engine_is_caught(worker: PolicyWorker, monkeypatch) -> None:
    monkeypatch.setattr(worker.generation.engine, "load_weights", lambda tensors: None)  # a broken sync
    worker.generate([[1, 26, 24, 29]], Sampling(n=1, max_tokens=3, seed=1))
    worker.sync_weights()
    _update(worker, with_reference(worker), OWN_OLD)
    metrics = worker.sync_weights()
    assert metrics[FIRST_CHANGE_KEY] == 0.0
    with pytest.raises(WeightSyncError, match="not receiving the trained weights"):
        check_weight_sync(metrics, worker.config.rollout, step=1)


def test_checkpoints_hold_the_adapters_and_resume_exactly(worker: PolicyWorker, tmp_path: Path) -> None:
    batch = with_reference(worker)
    _update(worker, batch, OWN_OLD)  # optimizer moments and the schedule are not fresh
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    saved = dcp.FileSystemReader(str(tmp_path / "ckpt" / SHARDS_DIR)).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert len(model_keys) == 28 and all(".lora_" in k for k in model_keys)
    assert all(".lora_" in k for k in saved if k.startswith("optim.state."))
    first = _update(worker, batch, OWN_OLD), adapters(worker)
    worker.load_checkpoint(str(tmp_path / "ckpt"))
    again = _update(worker, batch, OWN_OLD), adapters(worker)
    assert first[0] == again[0]
    assert all(torch.equal(first[1][n], again[1][n]) for n in first[1])
