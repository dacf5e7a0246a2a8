"""`rlkit export`: a trained run becomes a Hugging Face directory that transformers and vLLM load,
and it computes the trainer's logits; a LoRA run's export is the merged model and the peft adapter,
which peft and vLLM's LoRA support load."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest
import torch
from conftest import release_vllm

from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.core.state.run_dir import RunDir, resolve_model_path
from rlkit.core.train.export import ADAPTER_DIR, EXPORT_INFO, export_hf
from rlkit.errors import UserError
from rlkit.recipes.loader import load_config

pytestmark = [pytest.mark.slow]

# Token ids of the tiny tokenizer: "<|im_start|>echo 7<|im_end|><|im_start|>7"
PROBE = [1, 26, 24, 29, 36, 21, 10, 2, 1, 10]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as patch:  # the tiny model is built in the test cache, workers included
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        yield train_and_export(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def trained_lora(tmp_path_factory) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        yield train_and_export(tmp_path_factory.mktemp("export-lora"),
                               ["model.lora.rank=4", "model.lora.alpha=8", "actor.lr=1e-2"])


def train_and_export(root: Path, overrides: list[str] = ()) -> dict:
    """Two GRPO steps at a high learning rate, a checkpoint, and the trainer's logits on PROBE (the worker is an
    object in this process: trainer.workers=in_process)."""
    from rlkit.core.controller.controller import Controller

    config = load_config("grpo-demo", ["rollout.name=hf", "trainer.total_steps=2", "trainer.logger=[jsonl]",
                                       "trainer.workers=in_process", "trainer.device=cpu",
                                       f"trainer.runs_dir={root / 'runs'}", *overrides])
    run = RunDir.create(config, "exported")
    controller = Controller(config, run)
    try:
        for step in (1, 2):
            controller.step(step)
            controller.completed_steps = step
        controller.save_checkpoint("final")
        logits = controller.workers.call(PolicyWorker.policy_logits, torch.tensor([PROBE]))[0]
    finally:
        controller.close()
    out = export_hf(RunDir.open("exported", root / "runs"), root / "hf")
    return {"root": root, "run": run, "out": out, "logits": logits, "base": resolve_model_path(config.model.path)}


def test_transformers_loads_the_export_and_gives_the_trainers_logits(trained) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out: Path = trained["out"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(os.listdir(out))
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROBE])).logits
        base_logits = AutoModelForCausalLM.from_pretrained(trained["base"])(input_ids=torch.tensor([PROBE])).logits
    # Same fp32 weights; FSDP2's forward may order a few float ops differently.
    torch.testing.assert_close(logits, trained["logits"], rtol=0, atol=1e-5)
    assert (logits - base_logits).abs().max() > 1e-3  # the export holds the trained policy, not the base
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("echo 7")["input_ids"] == AutoTokenizer.from_pretrained(trained["base"])("echo 7")["input_ids"]
    assert json.loads((out / EXPORT_INFO).read_text())["step"] == 2


def vllm_log_probs(model: Path | str, adapter: Path | None = None) -> torch.Tensor:
    """vLLM's log-probs of PROBE, the model (or the base and the adapter) loaded from its directory as `vllm serve`
    would load it; the engine runs in this process and is released after (conftest.release_vllm)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=64, seed=0,
              gpu_memory_utilization=0.2, enable_lora=adapter is not None, max_lora_rank=8)
    try:
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        lora = LoRARequest("policy", 1, str(adapter)) if adapter else None
        out = llm.generate([TokensPrompt(prompt_token_ids=PROBE)], params, use_tqdm=False, lora_request=lora)[0]
    finally:
        del llm
        release_vllm()
    return torch.tensor([entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], PROBE[1:])])


def trainer_log_probs(trained: dict) -> torch.Tensor:
    return trained["logits"][0, :-1].log_softmax(-1).gather(-1, torch.tensor(PROBE[1:]).unsqueeze(-1)).squeeze(-1)


def test_vllm_loads_the_export(trained) -> None:
    torch.testing.assert_close(vllm_log_probs(trained["out"]), trainer_log_probs(trained), rtol=0, atol=1e-4)


def test_a_lora_export_is_the_merged_model_and_the_peft_adapter(trained_lora) -> None:
    """Both give the trainer's logits: the merged model in transformers, the adapter on the base in peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out: Path = trained_lora["out"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out / ADAPTER_DIR))
    probe = torch.tensor([PROBE])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=probe).logits
        base = AutoModelForCausalLM.from_pretrained(trained_lora["base"]).eval()
        base_logits = base(input_ids=probe).logits
        adapted = PeftModel.from_pretrained(base, out / ADAPTER_DIR).eval()(input_ids=probe).logits
    torch.testing.assert_close(merged, trained_lora["logits"], rtol=0, atol=1e-5)
    torch.testing.assert_close(adapted, trained_lora["logits"], rtol=0, atol=1e-5)
    assert (merged - base_logits).abs().max() > 1e-3  # the adapters were trained and exported
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["lora"]["format"] == "both" and info["lora"]["rank"] == 4
    # The adapter names its base by an absolute path: peft finds it from any folder (AutoPeftModelForCausalLM).
    adapter_config = json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(Path(trained_lora["base"]).resolve())


def test_vllm_loads_the_lora_export_merged_and_as_an_adapter(trained_lora) -> None:
    trainer = trainer_log_probs(trained_lora)
    torch.testing.assert_close(vllm_log_probs(trained_lora["out"]), trainer, rtol=0, atol=1e-4)
    adapter = trained_lora["out"] / ADAPTER_DIR
    torch.testing.assert_close(vllm_log_probs(trained_lora["base"], adapter), trainer, rtol=0, atol=1e-4)


def test_lora_format_is_for_lora_runs_and_adapter_alone_is_small(trained, trained_lora) -> None:
    with pytest.raises(UserError, match="trained every weight"):
        export_hf(RunDir.open("exported", trained["root"] / "runs"), trained["root"] / "x", lora_format="adapter")
    out = export_hf(RunDir.open("exported", trained_lora["root"] / "runs"), trained_lora["root"] / "adapter-only",
                    lora_format="adapter")
    assert "adapter_model.safetensors" in os.listdir(out) and "model.safetensors" not in os.listdir(out)


def test_export_refuses_a_non_empty_directory_and_a_missing_step(trained) -> None:
    run = RunDir.open("exported", trained["root"] / "runs")
    with pytest.raises(UserError, match="not empty"):
        export_hf(run, trained["out"])
    with pytest.raises(UserError, match=r"no checkpoint of step 7 .*checkpoints: 2\)"):
        export_hf(run, trained["root"] / "other", step=7)
