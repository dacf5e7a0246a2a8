"""bench/update_alone.py: the workload's reference pass and update alone, in one process, on the tiny workload."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.update_alone import main  # noqa: E402


def test_the_tiny_workload_runs_its_passes_and_writes_their_times(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = main(["--tiny", "--workdir", str(tmp_path / "w"), "--out", str(out), "--steps", "2",
                   "--micro-batch-tokens", "48", "--trace", str(tmp_path / "trace")])
    assert json.loads(out.read_text()) == result
    assert len(result["ref_s"]) == len(result["update_s"]) == 2
    assert result["mean_after_first"]["update_s"] == result["update_s"][1]
    # the tiny model (vocabulary 512) at its first step: entropy near log(512), a finite gradient
    assert math.isfinite(result["metrics"]["grad_norm"]) and result["metrics"]["grad_norm"] > 0
    assert abs(result["metrics"]["entropy"] - math.log(512)) < 0.5
    assert (tmp_path / "trace" / "update.trace.json").stat().st_size > 0


def test_transformers_attention_gives_the_packed_layouts_update(tmp_path: Path) -> None:
    """The A/B switch: transformers' own attention forward (the packed layout undone) computes the same update."""
    args = ["--tiny", "--workdir", str(tmp_path / "w"), "--steps", "2", "--micro-batch-tokens", "48"]
    packed = main([*args, "--out", str(tmp_path / "p.json")])
    own = main([*args, "--out", str(tmp_path / "t.json"), "--attention", "transformers"])
    assert (packed["attention"], own["attention"]) == (["PackedQwen2Attention"], ["Qwen2Attention"])
    assert own["metrics"] == packed["metrics"]


def test_the_chunked_log_prob_kernels_are_what_a_cpu_runs_either_way(tmp_path: Path) -> None:
    """`--logprob-kernels chunks` (the Triton pair's A/B on a GPU) records the kernels that ran: on a CPU the chunks,
    as by default."""
    args = ["--tiny", "--workdir", str(tmp_path / "w"), "--steps", "1", "--micro-batch-tokens", "48"]
    default = main([*args, "--out", str(tmp_path / "d.json")])
    chunks = main([*args, "--out", str(tmp_path / "c.json"), "--logprob-kernels", "chunks"])
    assert (default["logprob_kernels"], chunks["logprob_kernels"]) == ("chunks", "chunks")
    assert chunks["metrics"] == default["metrics"]


def test_the_attention_kernels_graph_break_switch_computes_the_same_update_and_is_undone(tmp_path: Path) -> None:
    """`--attention-kernel break` (the A/B of the kernel inside each compiled layer's graph) keeps the attention out of
    compiled graphs for its run only, and the update's numbers are the same."""
    from rlkit.core.train import packed_attention

    attend = packed_attention.attend
    args = ["--tiny", "--workdir", str(tmp_path / "w"), "--steps", "1", "--micro-batch-tokens", "48"]
    default = main([*args, "--out", str(tmp_path / "d.json")])
    broken = main([*args, "--out", str(tmp_path / "b.json"), "--attention-kernel", "break"])
    assert broken["metrics"] == default["metrics"]
    assert packed_attention.attend is attend
