"""Tool and environment tokens get no gradient: a two-turn trajectory built by hand, one update on a
real policy worker (a world of one, gloo, no Ray), the parameters' gradients compared.

Changing the advantages on the tool's tokens must leave every gradient exactly as it was;
changing them on the policy's tokens must not. The tool's tokens still sit in the context
the policy's second turn attends to, which the same gradients show (they differ from a
trajectory whose tool answer differs).
"""

from __future__ import annotations

import multiprocessing

import torch
import torch.distributed as dist

from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch, build_batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.loader import load_config

PROMPT = [1, 40, 26, 24, 39, 26, 41, 17, 2, 1]          # "<|im_start|>secret?<|im_end|><|im_start|>"
# turn 1 (the call) | end of turn, tool message "7", next turn (the tool's) | turn 2 "7" and its end
RESPONSE, MASK = [48, 2, 1, 10, 2, 1, 10, 2], [1, 0, 0, 0, 0, 0, 1, 1]
TOOL = slice(1, 6)  # the tool's tokens in RESPONSE
def _batch(tool_digit: int = 10) -> Batch:
    response = [tool_digit if i == 3 else t for i, t in enumerate(RESPONSE)]
    trajectories = [Trajectory(PromptRow(0, PROMPT, "synthetic/lookup", "7"), 0, response, MASK, finish_reason="stop"),
                    Trajectory(PromptRow(0, PROMPT, "synthetic/lookup", "7"), 0, response[:6] + [11, 2], MASK,
                               finish_reason="stop")]
    batch = build_batch(trajectories, pad_id=0)
    batch["advantages"] = torch.tensor([[1.0] * 8, [-1.0] * 8]) * batch["response_mask"]
    return batch


def _gradients(worker: PolicyWorker, batch: Batch, folder: str) -> dict[str, torch.Tensor]:
    """The gradients of one update from the saved start, by parameter name."""
    worker.load_checkpoint(folder)
    mask = batch["response_mask"]
    inputs = UpdateInputs(old_log_probs_from_update=True, rollout_log_probs=False, rollout_correction=None,
                          reference=False)
    worker.update_actor([Batch({k: batch[k] for k in inputs.keys()})],
                        [{"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum())}], inputs)
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for name, p in worker.actor.model.module.named_parameters()}


def _run(folder: str) -> None:
    """In a fresh process (a process group of its own): the gradients of four batches."""
    config = load_config("grpo-demo", ["rollout.name=hf", "data.train_batch_size=1", "actor.mini_batch_size=1",
                                       "rollout.n=2", "actor.grad_clip=1e9"])
    worker = PolicyWorker(config, str(resolve_model_path("rlkit:tiny-qwen2")), 0, 1)
    worker.setup("127.0.0.1", free_port())
    try:
        worker.save_checkpoint(f"{folder}/start")
        base = _batch()
        tool_advantages = Batch(dict(base.tensors))
        tool_advantages["advantages"] = base["advantages"].clone()
        tool_advantages["advantages"][:, TOOL] = torch.randn(2, TOOL.stop - TOOL.start) * 100
        policy_advantages = Batch(dict(base.tensors))
        policy_advantages["advantages"] = base["advantages"] * 3
        out = {name: _gradients(worker, batch, f"{folder}/start") for name, batch in (
            ("base", base), ("tool", tool_advantages), ("policy", policy_advantages), ("other_answer", _batch(11)))}
    finally:
        dist.destroy_process_group()
    torch.save({"grads": out, "tool_advantages": tool_advantages["advantages"]}, f"{folder}/out.pt")


def test_tool_tokens_get_no_gradient(tmp_path):
    process = multiprocessing.get_context("spawn").Process(target=_run, args=(str(tmp_path),))
    process.start()
    process.join(timeout=300)
    assert process.exitcode == 0
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    grads, tool_advantages = out["grads"], out["tool_advantages"]
    assert tool_advantages[:, TOOL].abs().min() > 0  # the tool's tokens really got (large) advantages
    assert any(g.abs().sum() > 0 for g in grads["base"].values())
    for name, grad in grads["base"].items():
        assert torch.equal(grads["tool"][name], grad), name  # bit for bit
    assert any(not torch.allclose(grads["policy"][n], g) for n, g in grads["base"].items())
    # The tool's answer is context: with another digit there, the policy's gradients differ.
    assert any(not torch.allclose(grads["other_answer"][n], g) for n, g in grads["base"].items())
