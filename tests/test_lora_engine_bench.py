"""bench/lora_engine.py end to end on a CPU (--tiny): both ways a LoRA policy reaches vLLM, measured and alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def test_merged_weights_and_the_adapter_path_give_the_same_outputs_and_both_are_measured(tmp_path) -> None:
    out = tmp_path / "lora_engine.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "lora_engine.py"), "--tiny", "--workdir",
                           str(tmp_path / "work"), "--out", str(out), "--syncs", "2", "--loads", "2"],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "ok"
    merged, adapter, comparison = result["merged"], result["adapter"], result["comparison"]
    for path in (merged, adapter):
        # TINY: 4 prompts x 4 samples x 8 response tokens.
        assert path["generated_tokens"] == 128 and path["tokens_per_s"] > 0 and path["engine_start_seconds"] > 0
        assert len(path["greedy_tokens"]) == 4 and all(len(tokens) == 8 for tokens in path["greedy_tokens"])
        assert len(path["sequence_log_probs"]) == 15  # a 16-token prompt scores its last 15 tokens
    assert len(merged["sync_seconds"]) == 2 and len(adapter["save_seconds"]) == 3  # v1, then one per load
    assert len(adapter["generate_new_id_seconds"]) == 2 and adapter["adapter_bytes"] > 0
    # fp32 on a CPU: the two paths compute the same model.
    assert comparison["greedy_identical"] and comparison["log_prob_max_diff"] < 1e-4
    # ... and it is not the base model: the adapter (B drawn non-zero) moves every log-prob check.
    assert comparison["log_prob_max_diff_to_base"] > 0.05
    assert merged["greedy_tokens"] != merged["base"]["greedy_tokens"]
    assert set(result["environment"]) >= {"vllm", "torch", "peft", "gpu"} and result["environment"]["gpu"] is None
