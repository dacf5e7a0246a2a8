"""actor.old_log_probs=auto: with one optimizer step per RL step, the update takes its own
log-probs (detached) as the old ones instead of a separate forward pass. That must be the
same update, and report the same metrics, as recomputing them first.

One policy worker runs in this process (a world of one, gloo), without Ray.
"""

from __future__ import annotations

import math
import multiprocessing

import torch
import torch.distributed as dist

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.rollout_correction import CorrectionOptions, RejectionRule
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch, build_batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.controller.controller import masked_mean
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import RolloutSample
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.loader import load_config

# What each update reads (rlkit.core.algos.update_inputs): with the pass's old log-probs; with its own (and
# the engine's, to measure the gap); its own with importance weights against an engine (cap 3).
WITH_PASS = UpdateInputs(old_log_probs_from_update=False, rollout_log_probs=False, rollout_correction=None,
                         reference=True)
FROM_UPDATE = UpdateInputs(old_log_probs_from_update=True, rollout_log_probs=True, rollout_correction=None,
                           reference=True, keep_log_probs=True)  # and hand them back for the step's record
OWN_OLD = UpdateInputs(old_log_probs_from_update=True, rollout_log_probs=False, rollout_correction=None,
                       reference=True)  # the update's own old log-probs, a KL loss (tests/test_lora.py)
WEIGHTED = UpdateInputs(old_log_probs_from_update=True, rollout_log_probs=True, rollout_correction=("token", 3.0),
                        reference=True)
# The same weights divided by their batch mean (2): 1 again; rejection by token_k1 in [1/1.5, 1.5], which an
# engine at half the trainer's probability (pi_rollout / pi_old = 0.5) leaves no token of (docs/algorithms.md).
NORMALISED = UpdateInputs(True, True, ("token", 3.0), True, rollout_is_weight_mean=2.0,
                          rollout_correction_options=CorrectionOptions(batch_normalize=True))
REJECTED = UpdateInputs(True, True, None, True,
                        rollout_correction_options=CorrectionOptions(rs=(RejectionRule("token_k1", 1.5),)))
# Bypass (actor.old_log_probs=rollout): the engine's log-probs are the old ones, and the same rejection compares
# the policy being updated (twice the engine's probability on every token, ratio 2 > 1.5) with them: all rejected.
# Without the bypass flag the old (= the engine's) log-probs would be compared with themselves: none rejected.
BYPASS = UpdateInputs(False, True, None, True, old_log_probs_from_rollout=True,
                      rollout_correction_options=CorrectionOptions(rs=(RejectionRule("token_k1", 1.5),)))


def _batch() -> Batch:
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(4):
        prompt = torch.randint(3, 64, (3 + i,), generator=generator).tolist()
        for j in range(2):
            response = torch.randint(3, 64, (1 + (i + j) % 3,), generator=generator).tolist()
            samples.append(Trajectory.single_turn(PromptRow(i, prompt, "synthetic/echo", "x"), i,
                                                  RolloutSample(i, response, [-4.0] * len(response), finished=False)))
    batch = build_batch(samples, pad_id=0)
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=generator) * batch["response_mask"]
    return batch


def _parameters(worker: PolicyWorker) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in worker.actor.model.module.named_parameters()}


def _update(worker: PolicyWorker, batch: Batch, inputs: UpdateInputs) -> dict[str, float]:
    mask = batch["response_mask"]
    norms = {"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum())}
    return worker.update_actor([Batch({k: batch[k] for k in inputs.keys()})], [norms], inputs)


def _host_reads(worker: PolicyWorker, update) -> tuple[int, dict]:
    """`update()`, counting the tensors read back to the host (`Tensor.cpu`, `Tensor.item`) from the start of each
    micro-step to the optimizer's step: on a GPU each waits for the device's queue to drain, which then idles while
    the host packs and launches the next micro-batch."""
    counting = [False]
    reads = [0]
    real_step, real_optimizer_step = worker.actor._micro_step, worker.actor.model.optimizer.step
    real_cpu, real_item = torch.Tensor.cpu, torch.Tensor.item

    def micro_step(*args, **kwargs):
        counting[0] = True
        return real_step(*args, **kwargs)

    def optimizer_step(*args, **kwargs):
        counting[0] = False
        return real_optimizer_step(*args, **kwargs)

    def cpu(self, *args, **kwargs):
        reads[0] += counting[0]
        return real_cpu(self, *args, **kwargs)

    def item(self):
        reads[0] += counting[0]
        return real_item(self)

    worker.actor._micro_step, worker.actor.model.optimizer.step = micro_step, optimizer_step
    torch.Tensor.cpu, torch.Tensor.item = cpu, item
    try:
        return reads[0], update()
    finally:
        torch.Tensor.cpu, torch.Tensor.item = real_cpu, real_item
        del worker.actor._micro_step, worker.actor.model.optimizer.step


def _update_both_ways(folder: str) -> None:
    """In a fresh process (vLLM tests may have left this one a process group): save what both updates give."""
    config = load_config("grpo-demo", ["rollout.name=hf", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1",
                                       "actor.entropy_coeff=0.01", "data.train_batch_size=4",
                                       "actor.mini_batch_size=4", "rollout.n=2", "actor.micro_batch_tokens=32"])
    assert Algorithm.from_config(config).old_log_probs_from_update
    worker = PolicyWorker(config, str(resolve_model_path("rlkit:tiny-qwen2")), 0, 1)
    worker.setup("127.0.0.1", free_port())
    try:
        batch = _batch()
        batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
        worker.save_checkpoint(f"{folder}/start")
        before = _parameters(worker)

        recomputed = worker.actor_log_probs(batch)
        batch["old_log_probs"] = recomputed["log_probs"]
        with_pass = _update(worker, batch, WITH_PASS)
        after_pass = _parameters(worker)

        worker.load_checkpoint(f"{folder}/start")
        from_update_reads, from_update = _host_reads(worker, lambda: _update(worker, batch, FROM_UPDATE))
        after_update = _parameters(worker)

        # TIS with an engine at half the trainer's probability on every token: weights of 2 (cap 3).
        worker.load_checkpoint(f"{folder}/start")
        halved = Batch({**batch.tensors, "rollout_log_probs": (recomputed["log_probs"] - math.log(2))
                        * batch["response_mask"]})
        weighted_reads, weighted = _host_reads(worker, lambda: _update(worker, halved, WEIGHTED))
        worker.load_checkpoint(f"{folder}/start")
        normalised = _update(worker, halved, NORMALISED)
        worker.load_checkpoint(f"{folder}/start")
        rejected = _update(worker, halved, REJECTED)
        worker.load_checkpoint(f"{folder}/start")
        bypass = _update(worker, Batch({**halved.tensors, "old_log_probs": halved["rollout_log_probs"]}), BYPASS)
    finally:
        dist.destroy_process_group()
    torch.save(dict(batch=batch.tensors, recomputed=recomputed, before=before, after_pass=after_pass,
                    after_update=after_update, with_pass=with_pass, from_update=from_update, weighted=weighted,
                    normalised=normalised, rejected=rejected, bypass=bypass,
                    host_reads=(from_update_reads, weighted_reads)),
               f"{folder}/out.pt")


def test_update_with_its_own_old_log_probs_equals_recomputing_them(tmp_path):
    process = multiprocessing.get_context("spawn").Process(target=_update_both_ways, args=(str(tmp_path),))
    process.start()
    process.join(timeout=300)
    assert process.exitcode == 0
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    batch, recomputed, before = Batch(out["batch"]), out["recomputed"], out["before"]
    after_pass, after_update, with_pass, from_update = (out[k] for k in ("after_pass", "after_update", "with_pass",
                                                                         "from_update"))
    assert any(not torch.equal(before[name], value) for name, value in after_pass.items())
    for name, value in after_pass.items():
        assert torch.allclose(after_update[name], value, atol=1e-6), name
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/pg_clipfrac"):
        assert abs(from_update[key] - with_pass[key]) < 1e-5, key
    # The metrics the skipped pass would have given, now measured by the update.
    mask = batch["response_mask"]
    assert abs(from_update["actor/entropy"] - masked_mean(recomputed["entropy"], mask)) < 1e-5
    gap = masked_mean((batch["rollout_log_probs"] - recomputed["log_probs"]).abs(), mask)
    assert abs(from_update["rollout/log_prob_diff"] - gap) < 1e-5
    assert abs(from_update["actor/kl_ref"] - masked_mean(recomputed["log_probs"] - batch["ref_log_probs"], mask)) < 1e-6
    assert "actor/entropy" not in with_pass
    # The log-probs the update handed back (for the record) are the skipped pass's, row by row, though the update
    # split the 8 rows into micro-batches of at most 32 tokens; an update not asked for them hands back none.
    torch.testing.assert_close(from_update["trainer_log_probs"], recomputed["log_probs"], rtol=0, atol=1e-6)
    assert "trainer_log_probs" not in with_pass and "trainer_log_probs" not in out["weighted"]
    # Importance weights of 2 on every token double the policy-gradient loss (token-mean).
    assert abs(out["weighted"]["actor/rollout_is_weight"] - 2.0) < 1e-5
    assert abs(out["weighted"]["actor/pg_loss"] - 2 * from_update["actor/pg_loss"]) < 1e-5
    # Its diagnostics, summed over the micro-batches (rlkit.core.algos.rollout_correction): equal weights are a
    # full sample (ESS 1); chi2_token = E[r^2] - 1 = 4 - 1; the responses have 1, 2, 2, 3, 3, 1, 1, 2 tokens, so
    # chi2_seq = mean(4^length) - 1 = (4 + 16 + 16 + 64 + 64 + 4 + 4 + 16) / 8 - 1 = 22.5.
    weighted = out["weighted"]
    assert abs(weighted["rollout_corr/rollout_is_eff_sample_size"] - 1.0) < 1e-5
    assert abs(weighted["rollout_corr/chi2_token"] - 3.0) < 1e-4
    assert abs(weighted["rollout_corr/chi2_seq"] - 22.5) < 1e-3
    assert not any(k.startswith("rollout_corr") for k in from_update)  # no correction, no diagnostics
    normalised, rejected = out["normalised"], out["rejected"]
    assert abs(normalised["actor/rollout_is_weight"] - 1.0) < 1e-5
    assert abs(normalised["actor/pg_loss"] - from_update["actor/pg_loss"]) < 1e-5
    assert normalised["rollout_corr/rollout_is_batch_norm_factor"] == 2.0
    assert rejected["actor/pg_loss"] == 0.0 and rejected["actor/rollout_is_weight"] == 0.0
    assert rejected["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert rejected["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    assert out["bypass"]["actor/pg_loss"] == 0.0 and out["bypass"]["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    # Over its micro-batches (32 tokens each) the update read nothing back to the host, its metrics, the kept
    # log-probs and the correction's sums included: they are read once, after the last optimizer step.
    assert out["host_reads"] == (0, 0)
