"""`rlkit export`: a trained run becomes a Hugging Face directory that transformers and vLLM load,
and it computes the trainer's logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

from rlkit.core.controller.run_dir import RunDir, resolve_model_path
from rlkit.core.state.export import EXPORT_INFO, export_hf
from rlkit.errors import UserError
from rlkit.recipes.loader import load_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Token ids of the tiny tokenizer: "<|im_start|>echo 7<|im_end|><|im_start|>7"
PROBE = [1, 26, 24, 29, 36, 21, 10, 2, 1, 10]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as patch:  # the tiny model is built in the test cache, workers included
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        yield train_and_export(tmp_path_factory.mktemp("export"))


def train_and_export(root: Path) -> dict:
    """Two GRPO steps at a high learning rate, a checkpoint, and the trainer's logits on PROBE."""
    from rlkit.core.controller.controller import Controller

    config = load_config("grpo-demo", ["rollout.name=hf", "trainer.total_steps=2", "trainer.logger=[jsonl]",
                                       f"trainer.runs_dir={root / 'runs'}"])
    run = RunDir.create(config, "exported")
    controller = Controller(config, run)
    try:
        for step in (1, 2):
            controller.step(step)
            controller.completed_steps = step
        controller.save_checkpoint("final")
        logits = controller.workers.call("policy_logits", torch.tensor([PROBE]))[0]
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


def test_vllm_loads_the_export(trained) -> None:
    """vLLM (in a fresh process, as `vllm serve` would) scores PROBE like the trainer does."""
    script = (
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        "from vllm.inputs import TokensPrompt\n"
        "llm = LLM(model=sys.argv[1], dtype='float32', enforce_eager=True, max_model_len=64, seed=0,\n"
        "          gpu_memory_utilization=0.2)\n"
        "params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)\n"
        "out = llm.generate([TokensPrompt(prompt_token_ids=json.loads(sys.argv[2]))], params, use_tqdm=False)[0]\n"
        "ids = json.loads(sys.argv[2])\n"
        "print('LOGPROBS', json.dumps([e[t].logprob for e, t in zip(out.prompt_logprobs[1:], ids[1:])]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run([sys.executable, "-c", script, str(trained["out"]), json.dumps(PROBE)], env=env,
                          capture_output=True, text=True, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("LOGPROBS ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-4000:]
    vllm_logprobs = torch.tensor(json.loads(line.removeprefix("LOGPROBS ")))
    trainer = trained["logits"][0, :-1].log_softmax(-1).gather(-1, torch.tensor(PROBE[1:]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(vllm_logprobs, trainer, rtol=0, atol=1e-4)


def test_export_refuses_a_non_empty_directory_and_a_missing_step(trained) -> None:
    run = RunDir.open("exported", trained["root"] / "runs")
    with pytest.raises(UserError, match="not empty"):
        export_hf(run, trained["out"])
    with pytest.raises(UserError, match=r"no checkpoint of step 7 .*checkpoints: 2\)"):
        export_hf(run, trained["root"] / "other", step=7)
