"""Step-1 invariants: each fires when broken on purpose, stays quiet on a correct step, and
trainer.invariants turns a violation into a warning or skips the checks.

The KL and log-prob gap are measured by a real policy worker (one, in a fresh process, without
Ray): once as loaded, once with its reference perturbed, once with the engine's log-probs shifted.
"""

from __future__ import annotations

import logging
import multiprocessing

import pytest
import torch
import torch.distributed as dist

from rlkit.core.batch import Batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.controller import invariants
from rlkit.core.controller.invariants import InvariantViolation
from rlkit.core.data.builders import make_row
from rlkit.core.data.dataset import PromptRow, PromptSampler, tokenize_rows
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.loader import load_config

KL = ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.1"]


def config(*overrides: str):
    return load_config("grpo-demo", [*KL, *overrides])


def test_the_kl_invariant_fires_above_the_tolerance_at_step_1_only() -> None:
    invariants.check_step(config(), 1, {"actor/kl_ref": 0.0, "rollout/log_prob_diff": 1e-7})
    invariants.check_step(config(), 1, {"actor/kl_ref": -0.049})
    invariants.check_step(config(), 2, {"actor/kl_ref": 0.3})  # later steps may move away from the reference
    with pytest.raises(InvariantViolation, match=r"step-1 invariant 'KL to the reference is 0 at step 1' broken: "
                                                 r"actor/kl_ref=0\.3 at step 1.*trainer\.invariants=warn"):
        invariants.check_step(config(), 1, {"actor/kl_ref": 0.3})
    with pytest.raises(InvariantViolation, match="kl_ref=-0.06"):
        invariants.check_step(config(), 1, {"actor/kl_ref": -0.06})
    invariants.check_step(config("trainer.invariant_tolerance=0.5"), 1, {"actor/kl_ref": 0.3})
    invariants.check_step(config("trainer.invariants=off"), 1, {"actor/kl_ref": 0.3})


def test_the_log_prob_gap_invariant_fires_unless_sampling_is_truncated_by_design() -> None:
    with pytest.raises(InvariantViolation, match=r"'rollout-vs-trainer log-prob gap at step 1' broken: "
                                                 r"rollout/log_prob_diff=0\.2 nats per token"):
        invariants.check_step(config(), 1, {"rollout/log_prob_diff": 0.2})
    invariants.check_step(config("rollout.top_p=0.9"), 1, {"rollout/log_prob_diff": 0.2})
    invariants.check_step(config("rollout.top_k=5"), 1, {"rollout/log_prob_diff": 0.2})


def test_warn_logs_the_violation_and_goes_on(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        invariants.check_step(config("trainer.invariants=warn"), 1, {"rollout/log_prob_diff": 0.2})
    assert "step-1 invariant 'rollout-vs-trainer log-prob gap at step 1' broken" in caplog.text
    assert "trainer.invariants=warn: going on" in caplog.text


def test_step_1_is_a_log_prob_check_step_unless_the_invariants_are_off() -> None:
    assert config("rollout.log_prob_check_freq=10").log_prob_check_step(1)
    assert not config("rollout.log_prob_check_freq=10", "trainer.invariants=off").log_prob_check_step(1)
    assert [config("rollout.log_prob_check_freq=0").log_prob_check_step(s) for s in (1, 2, 10)] == [True, False, False]


def merging_tokenizer():
    """A BPE where 'a' 'b' merge into 'ab': the ids [a, b] decode to 'ab', which encodes as [ab]."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "c": 3}, merges=[("a", "b")]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_a_prompt_that_does_not_round_trip_fires_naming_its_row() -> None:
    tokenizer = merging_tokenizer()
    rows = [PromptRow(0, [2, 3], "x", "1"), PromptRow(1, [0, 1, 3], "x", "2"), PromptRow(2, [3], "x", "3")]
    assert invariants.round_trip_problem(tokenizer, [2, 3]) is None
    assert invariants.round_trip_problem(tokenizer, [0, 1, 3]) == (
        "re-encodes to other token ids: 3 tokens became 2, first difference at token 0: [0, 1, 3] -> [2, 3] "
        "(text 'abc')")
    sampler = PromptSampler(3, 2, seed=0, shuffle=False)
    with pytest.raises(InvariantViolation, match=r"'prompts survive a tokenizer round trip' broken: the prompt of "
                                                 r"row 1 re-encodes"):
        invariants.check_prompts(config(), tokenizer, rows, sampler)
    assert sampler.state_dict() == {"epoch": 0, "position": 0}  # peeking at the first batch consumed nothing
    invariants.check_prompts(config(), tokenizer, rows[:1] + rows[2:], PromptSampler(2, 2, seed=0, shuffle=False))
    invariants.check_prompts(config("trainer.invariants=off"), tokenizer, rows, sampler)


def lossy_tokenizer():
    """Lower-case letters, space and '?' one token each, anything else the unknown token '[UNK]' (a
    special token, so its text encodes back to it): 'café 😀' and 'cafe' survive the ids round trip."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ?")}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def byte_level_tokenizer():
    """Every byte one token (GPT-2's byte-level symbols): any text encodes without loss."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


PROMPTS = ["what is a cafe", "un café au lait ? 😀", "naïve"]


def loaded(tokenizer):
    rows = [make_row("synthetic/echo", "", "1", split="train", index=i) | {"prompt": p} for i, p in enumerate(PROMPTS)]
    return tokenize_rows([("train.parquet", rows)], tokenizer, max_prompt_length=64)


def test_characters_the_tokenizer_loses_stop_the_run_naming_the_row_and_the_characters(caplog) -> None:
    tokenizer = lossy_tokenizer()
    rows = loaded(tokenizer)
    assert rows[1].prompt_text == PROMPTS[1]
    assert tokenizer.decode(rows[1].prompt_token_ids) == "un caf[UNK] au lait ? [UNK]"
    assert invariants.round_trip_problem(tokenizer, rows[1].prompt_token_ids) is None  # the ids lost them already
    assert invariants.lost_text_problem(tokenizer, PROMPTS[0], rows[0].prompt_token_ids) is None
    assert invariants.lost_text_problem(tokenizer, PROMPTS[1], rows[1].prompt_token_ids) == (
        "has characters that its token ids lost: 'é😀' (the first at character 6 of its rendered text "
        "'un café au lait ', where the ids decode as '[UNK]'), so the policy never sees them")
    with pytest.raises(InvariantViolation, match=r"'prompts survive a tokenizer round trip' broken: the prompt of row "
                                                 r"1 has characters that its token ids lost: 'é😀' .*clean those "
                                                 r"characters out .*trainer\.invariants=warn"):
        invariants.check_prompts(config(), tokenizer, rows, PromptSampler(3, 2, seed=0, shuffle=False))
    invariants.check_prompts(config(), tokenizer, rows[:1], PromptSampler(1, 1, seed=0, shuffle=False))
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        invariants.check_prompts(config("trainer.invariants=warn"), tokenizer, rows[2:],
                                 PromptSampler(1, 1, seed=0, shuffle=False))
    assert "the prompt of row 2 has characters that its token ids lost: 'ï'" in caplog.text


def test_a_tokenizer_that_keeps_every_character_passes() -> None:
    tokenizer = byte_level_tokenizer()
    rows = loaded(tokenizer)
    assert [tokenizer.decode(r.prompt_token_ids) for r in rows] == PROMPTS
    invariants.check_prompts(config(), tokenizer, rows, PromptSampler(3, 3, seed=0, shuffle=False))
    # what a tokenizer may legitimately change is forgiven: a space added by the decoder, NFKC ('ﬁ' is 'fi')
    ids = tokenizer("fine", add_special_tokens=False)["input_ids"]
    assert invariants.lost_text_problem(tokenizer, "ﬁne ", ids) is None


def _measure(folder: str) -> None:
    """Real update metrics at step 1: as loaded, with a perturbed reference, with shifted engine log-probs."""
    from test_old_log_probs import FROM_UPDATE, _batch, _update

    cfg = load_config("grpo-demo", ["rollout.name=hf", *KL, "data.train_batch_size=4", "actor.mini_batch_size=4",
                                    "rollout.n=2", "actor.micro_batch_tokens=32"])
    worker = PolicyWorker(cfg, str(resolve_model_path("rlkit:tiny-qwen2")), 0, 1)
    worker.setup("127.0.0.1", free_port())
    try:
        batch = _batch()
        batch["rollout_log_probs"] = worker.actor_log_probs(batch)["log_probs"]  # an exact engine
        batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
        worker.save_checkpoint(f"{folder}/start")
        keys = FROM_UPDATE  # the update's own old log-probs, measured against the engine's
        correct = _update(worker, batch, keys)
        worker.load_checkpoint(f"{folder}/start")
        shifted = Batch({**batch.tensors, "rollout_log_probs": (batch["rollout_log_probs"] - 0.3)
                         * batch["response_mask"]})
        engine_off = _update(worker, shifted, keys)
        worker.load_checkpoint(f"{folder}/start")
        # A check step's share: every other row has the engine's (shifted) log-probs, the others none (zeros)
        rows = torch.arange(len(batch)) % 2 == 0
        share = Batch({**shifted.tensors, "rollout_log_prob_rows": rows,
                       "rollout_log_probs": shifted["rollout_log_probs"] * rows.unsqueeze(-1)})
        engine_off_share = _update(worker, share, keys)
        worker.load_checkpoint(f"{folder}/start")
        with torch.no_grad():  # a reference that is not the initial policy
            generator = torch.Generator().manual_seed(1)
            for param in worker.actor.model.base.parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                local.add_(torch.randn(local.shape, generator=generator) * 0.5)
        batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
        other_reference = _update(worker, batch, keys)
    finally:
        dist.destroy_process_group()
    torch.save(dict(correct=correct, engine_off=engine_off, engine_off_share=engine_off_share,
                    other_reference=other_reference), f"{folder}/out.pt")


def test_the_invariants_fire_on_a_real_update_broken_on_purpose(tmp_path) -> None:
    process = multiprocessing.get_context("spawn").Process(target=_measure, args=(str(tmp_path),))
    process.start()
    process.join(timeout=300)
    assert process.exitcode == 0
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    assert out["correct"]["actor/kl_ref"] == 0.0 and out["correct"]["rollout/log_prob_diff"] < 1e-6
    invariants.check_step(config(), 1, out["correct"])
    assert abs(out["engine_off"]["rollout/log_prob_diff"] - 0.3) < 1e-5
    # measured on the rows that have the engine's log-probs only (the zeros of the others would count ~4 nats)
    assert abs(out["engine_off_share"]["rollout/log_prob_diff"] - 0.3) < 1e-5
    assert "rollout/log_prob_checked_tokens" not in out["engine_off_share"]
    with pytest.raises(InvariantViolation, match="rollout-vs-trainer log-prob gap"):
        invariants.check_step(config(), 1, out["engine_off"])
    assert abs(out["other_reference"]["actor/kl_ref"]) > 0.05
    with pytest.raises(InvariantViolation, match="KL to the reference is 0 at step 1"):
        invariants.check_step(config(), 1, out["other_reference"])
