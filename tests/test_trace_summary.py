"""bench/trace_summary.py: a profiled phase's device time traced back to the host op families that launched it."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.trace_summary import family, report, summarize  # noqa: E402


def _op(name, ts, dur, tid=1):
    return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid, "ph": "X"}


def _launch(ts, correlation, tid=1):
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "tid": tid,
            "args": {"correlation": correlation}}


def _device(cat, name, dur, correlation):
    return {"cat": cat, "name": name, "ts": 1000 + correlation, "dur": dur, "tid": 7,
            "args": {"correlation": correlation}}


TRACE = [
    # the head's forward: an aten matmul under no autograd node (its own op is the family)
    _op("aten::linear", 0, 40), _op("aten::mm", 5, 30), _launch(10, 1),
    # a compiled layer's backward: a GEMM and an inductor kernel under the autograd node, inside inductor's calls
    _op("autograd::engine::evaluate_function: CompiledFunctionBackward", 100, 100),
    _op("CompiledFunctionBackward", 101, 98), _op("## Call CompiledFxGraph fabc ##", 102, 90),
    _op("aten::mm", 103, 10), _launch(105, 2), _op("triton_poi_fused_mul_silu_0", 120, 10), _launch(122, 3),
    # FSDP's gradient hook of layer 12 on another thread: a copy
    _op("FSDP::post_backward_reduce (model.layers.12)", 300, 50, tid=2), _op("aten::copy_", 310, 5, tid=2),
    _launch(312, 4, tid=2),
    # flash attention's kernel (its name holds "cutlass": not a matmul) and a kernel whose launch was not traced
    _op("torch_attn::_varlen_attn_backward", 400, 20), _launch(405, 5),
    _device("kernel", "nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN", 50, 1),
    _device("kernel", "nvjet_sm90_tst_128x256_64x4_1x1_h_bz_coopA_NNN", 20, 2),
    _device("kernel", "triton_poi_fused_mul_silu_0", 30, 3),
    _device("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 7, 4),
    _device("kernel", "void pytorch_flash::flash_bwd_kernel<cutlass::bfloat16_t>", 11, 5),
    _device("gpu_memset", "Memset (Device)", 1, 99),
]


def test_each_device_interval_counts_under_the_host_op_family_that_launched_it():
    families, kernels, total = summarize(TRACE)
    assert total == 119
    assert {name: row for name, row in families.items()} == {
        "aten::mm": [50.0, 0.0, 1],  # only aten's ops open: the innermost one
        "CompiledFunctionBackward": [20.0, 30.0, 2],  # past inductor's graph call and kernel ops
        "FSDP::post_backward_reduce (model.layers.N)": [0.0, 7.0, 1],
        "torch_attn::_varlen_attn_backward": [0.0, 11.0, 1],
        "(no host op)": [0.0, 1.0, 1],
    }
    assert kernels["triton_poi_fused_mul_silu_0"] == [30.0, 1]


def test_family_folds_layer_numbers_and_skips_the_ops_that_say_how():
    assert family(["FSDP::pre_forward (model.layers.3)", "aten::copy_"]) == "FSDP::pre_forward (model.layers.N)"
    assert family(["CompiledFunction", "## Call CompiledFxGraph f ##", "triton_poi_x"]) == "CompiledFunction"
    assert family([]) == "(no host op)"


def test_report_reads_a_gzipped_trace(tmp_path):
    path = tmp_path / "rank0-update_actor.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": TRACE}, handle)
    text = report(path, top=3)
    assert text.splitlines()[0] == (f"{path.name}: device time 0.1 ms, of it matrix multiplies 0.1 ms (58.8%)")
    assert "CompiledFunctionBackward" in text and "nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN" in text
