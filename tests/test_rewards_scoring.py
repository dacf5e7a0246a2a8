"""RewardScorer: rules by data_source, custom functions, and every way a reward call can fail."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.core.rewards import scoring, worker_pool
from rlkit.core.rewards.scoring import RewardError, RewardScorer
from rlkit.errors import UserError
from rlkit.recipes.reward_schema import RewardConfig

# One custom function whose behaviour the response picks, so one scorer covers every failure.
CUSTOM = '''
import os, re, time

def behave(data_source, response, ground_truth, extra_info):
    if response == "raise":
        raise RuntimeError("kaboom")
    if response == "nan":
        return float("nan")
    if response == "text":
        return "1.0"
    if response == "no-score":
        return {"value": 1.0}
    if response == "sleep":
        time.sleep(60)
    if response == "stamp":  # note when the call started (in the file named by ground_truth), then hang
        with open(ground_truth, "a") as f:
            f.write(f"{time.time()}\\n")
        time.sleep(60)
    if response == "regex":  # catastrophic backtracking: stuck inside C code, deaf to signals
        re.match(r"(a+)+$", "a" * 40 + "b")
    if response == "exit":
        os._exit(3)
    if response.startswith("value:"):  # a score the response controls: "value:nan", "value:1e300", ...
        return eval(response[len("value:"):])
    if response == "detail-nan":
        return {"score": 1.0, "ratio": float("nan")}
    return {"score": float(response == ground_truth), "pid": os.getpid(), "length": len(response)}


def ranged(data_source, response, ground_truth, extra_info):
    return float(response)


ranged.score_range = (0.0, 1.0)


def badly_ranged(data_source, response, ground_truth, extra_info):
    return 0.0


badly_ranged.score_range = (1.0, 0.0)

not_a_function = 3
'''


@pytest.fixture(scope="module")
def custom_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(CUSTOM)
    return path


@pytest.fixture(scope="module")
def pooled(custom_file: Path):
    """One persistent pool for the whole module: every test after a failure also checks recovery."""
    with RewardScorer(RewardConfig(function=f"{custom_file}:behave", num_workers=2, timeout_s=0.5,
                                   on_error="zero")) as scorer:
        yield scorer


def run(scorer: RewardScorer, responses: list[str], truth: str = "ok"):
    n = len(responses)
    return scorer.score(responses, ["my/data"] * n, [truth] * n, [{"index": 100 + i} for i in range(n)])


def test_rules_are_picked_by_data_source() -> None:
    with RewardScorer(RewardConfig(num_workers=1, gsm8k_method="flexible", format_score=0.1)) as scorer:
        scored = scorer.score(
            ["#### 72", "it is 71", r"\boxed{\frac12}", "3", "4"],
            ["openai/gsm8k", "gsm8k", "lighteval/MATH", "synthetic/echo", "synthetic/add"],
            ["72", "72", "0.5", "3", "5"], [{}] * 5)
    assert scored.scores == [1.0, 0.1, 1.0, 1.0, 0.0]  # flexible extraction and format_score reach the rule
    assert scored.metrics["reward/answer_found"] == 1.0 and scored.metrics["reward/errors"] == 0.0


def test_unknown_data_source_names_the_row_and_the_fix() -> None:
    with RewardScorer(RewardConfig(num_workers=1)) as scorer:
        with pytest.raises(RewardError, match=r"row 1: unknown reward function for data_source 'gsm9k'.*"
                                              r"did you mean 'gsm8k'.*reward.function="):
            scorer.score(["a", "b"], ["gsm8k", "gsm9k"], ["1", "1"], [{}, {}])


def test_custom_function_dict_keys_become_metrics(pooled: RewardScorer) -> None:
    scored = run(pooled, ["ok", "no", "okay"])
    assert scored.scores == [1.0, 0.0, 0.0]
    assert scored.metrics["reward/length"] == pytest.approx(8 / 3)
    assert [d["length"] for d in scored.details] == [2.0, 2.0, 4.0]
    assert scored.metrics["reward/call_seconds_max"] < 0.5


def test_the_pool_persists_across_calls(pooled: RewardScorer) -> None:
    """Calls run in the pool's processes, which stay. (Which of the two scores a row is up to timing: one may take
    all eight rows while the other is still starting.)"""
    workers = {worker.process.pid for worker in pooled._pool.workers}
    for _ in range(2):
        assert {d["pid"] for d in run(pooled, ["ok"] * 8).details} <= workers
    assert {worker.process.pid for worker in pooled._pool.workers} == workers


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("response, error", [
    ("raise", r"RuntimeError: kaboom \(at .*my_reward.py:\d+ in behave\)"),
    ("no-score", "without a 'score' key"),  # the function's own shape: a bug, not a value the policy chose
])
def test_a_failing_call_stops_with_row_data_source_function_and_error(
        custom_file: Path, num_workers: int, response: str, error: str) -> None:
    config = RewardConfig(function=f"{custom_file}:behave", num_workers=num_workers)
    with RewardScorer(config) as scorer, pytest.raises(RewardError) as caught:
        run(scorer, ["ok", response])
    message = str(caught.value)
    assert "reward failed on row 1 (data_source 'my/data', dataset index 101, function " in message
    assert f"{custom_file}:behave" in message and "reward.on_error=zero" in message
    assert re.search(error, message), message


def test_on_error_zero_scores_zero_and_counts(pooled: RewardScorer) -> None:
    scored = run(pooled, ["ok", "raise", "no-score", "ok"])
    assert scored.scores == [1.0, 0.0, 0.0, 1.0]
    assert scored.metrics["reward/errors"] == 2.0 and scored.metrics["reward/invalid"] == 0.0
    assert "row 1" in scored.errors[0] and "kaboom" in scored.errors[0] and "row 2" in scored.errors[1]


INVALID = [
    ("value:float('nan')", "the return value is nan, not a finite number"),
    ("value:float('inf')", "the return value is inf, not a finite number"),
    ("value:{'score': float('-inf')}", "'score' is -inf, not a finite number"),
    ("text", r"the return value is '1.0' \(str\), not a number"),
    ("value:None", r"the return value is None \(NoneType\), not a number"),
    ("value:1e300", r"the return value is 1e\+300, beyond \+-1e\+06"),
    ("value:{'score': -2e6}", r"'score' is -2e\+06, beyond \+-1e\+06"),
    ("value:10 ** 400", "the return value is not a float \\(OverflowError: int too large to convert to float\\)"),
    ("detail-nan", "key 'ratio' is nan, not a finite number"),
]


@pytest.mark.parametrize("response, reason", INVALID)
def test_an_invalid_score_is_zero_with_its_reason_and_never_stops_the_run(custom_file: Path, response: str,
                                                                          reason: str) -> None:
    config = RewardConfig(function=f"{custom_file}:behave", num_workers=1)  # on_error=raise, the default
    with RewardScorer(config) as scorer:
        scored = run(scorer, ["ok", response, "value:0.25", "value:1e6"])
    assert scored.scores == [1.0, 0.0, 0.25, 1e6] and scored.errors == []
    assert scored.metrics["reward/invalid"] == 1.0 and scored.metrics["reward/errors"] == 0.0
    assert len(scored.invalid) == 1 and scored.details[1] == {}
    assert re.fullmatch(rf"invalid score on row 1 \(data_source 'my/data', dataset index 101, function "
                        rf"{re.escape(str(custom_file))}:behave\): {reason}; scored 0", scored.invalid[0])


def test_invalid_rows_and_failed_rows_are_counted_apart(pooled: RewardScorer) -> None:
    scored = run(pooled, ["value:float('nan')", "raise", "text", "ok"])
    assert scored.scores == [0.0, 0.0, 0.0, 1.0]
    assert scored.metrics["reward/invalid"] == 2.0 and scored.metrics["reward/errors"] == 1.0
    assert [m.split(" (")[0] for m in scored.invalid] == ["invalid score on row 0", "invalid score on row 2"]


def test_a_declared_range_clamps_and_no_range_does_not(custom_file: Path, pooled: RewardScorer) -> None:
    with RewardScorer(RewardConfig(function=f"{custom_file}:ranged", num_workers=1)) as scorer:
        scored = run(scorer, ["5", "-3", "0.5", "nan"])
    assert scored.scores == [1.0, 0.0, 0.5, 0.0] and scored.metrics["reward/invalid"] == 1.0
    assert run(pooled, ["value:5.0", "value:-3"]).scores == [5.0, -3.0]


def test_a_malformed_declared_range_is_a_user_error(custom_file: Path) -> None:
    with pytest.raises(UserError, match=r"badly_ranged.score_range=\(1.0, 0.0\): expected \(low, high\) with low <="):
        RewardScorer(RewardConfig(function=f"{custom_file}:badly_ranged", num_workers=1))


@pytest.mark.parametrize("hang", ["sleep", "regex"])
def test_a_hung_call_is_killed_and_the_next_call_works(pooled: RewardScorer, hang: str) -> None:
    start = time.monotonic()
    scored = run(pooled, ["ok", hang, "ok", "ok"])
    assert time.monotonic() - start < 5
    assert scored.scores == [1.0, 0.0, 1.0, 1.0]
    assert scored.metrics["reward/errors"] == 1.0
    assert "row 1" in scored.errors[0] and "timed out after 0.5 s (reward.timeout_s)" in scored.errors[0]
    assert run(pooled, ["ok", "ok"]).scores == [1.0, 1.0]


def test_a_hung_call_stops_the_run_by_default(custom_file: Path) -> None:
    with RewardScorer(RewardConfig(function=f"{custom_file}:behave", num_workers=1, timeout_s=0.5)) as scorer:
        with pytest.raises(RewardError, match="row 0 .* timed out after 0.5 s"):
            run(scorer, ["sleep"])
        assert run(scorer, ["ok"]).scores == [1.0]


def test_a_hung_reward_stops_the_batch_at_its_first_timeout(custom_file: Path) -> None:
    """A reward that hangs on every row: the run stops after one timeout, not rows x timeout_s,
    with the row, the function and the timeout named (before: 32 s for these 128 rows)."""
    config = RewardConfig(function=f"{custom_file}:behave", num_workers=2, timeout_s=0.5)
    with RewardScorer(config) as scorer:
        start = time.monotonic()
        with pytest.raises(RewardError) as caught:
            run(scorer, ["sleep"] * 128)
        assert time.monotonic() - start < 5
    message = str(caught.value)
    assert re.search(r"reward failed on row [01] \(data_source 'my/data', dataset index 10[01], function "
                     rf"{re.escape(str(custom_file))}:behave\): timed out after 0.5 s \(reward.timeout_s\)", message)
    assert "num_workers" not in message


def test_hung_rows_time_out_together(custom_file: Path, tmp_path: Path) -> None:
    """Four hung rows on four workers: all four calls run at once (each notes when it started), so
    they time out together rather than one after another."""
    config = RewardConfig(function=f"{custom_file}:behave", num_workers=4, timeout_s=1.0, on_error="zero")
    stamps = tmp_path / "stamps"
    with RewardScorer(config) as scorer:
        run(scorer, ["ok"] * 4)  # every worker is up
        scored = scorer.score(["stamp"] * 4, ["my/data"] * 4, [str(stamps)] * 4, [{}] * 4)
    assert scored.metrics["reward/errors"] == 4.0
    started = [float(line) for line in stamps.read_text().split()]
    assert len(started) == 4 and max(started) - min(started) < 1.0  # each call lives >= 1 s: they overlapped


def test_a_worker_started_late_in_a_batch_gets_its_own_start_up_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacements started late in a long batch are not a failed start (the deadline was once per batch)."""
    pool = object.__new__(worker_pool.WorkerPool)
    pool.timeout_s = 1.0
    now = 1000.0
    monkeypatch.setattr(worker_pool.time, "monotonic", lambda: now)
    replacement = SimpleNamespace(ready=False, row=None, spawned=now - 1.0, process=SimpleNamespace(pid=7))
    pool.workers = [replacement]
    pool._enforce_deadlines([None])  # the batch may have run for minutes: this worker started 1 s ago
    replacement.spawned = now - worker_pool.STARTUP_TIMEOUT_S - 1.0
    with pytest.raises(RewardError, match=r"a reward worker process \(pid 7\) did not start within 120 s"):
        pool._enforce_deadlines([None])


def test_scoring_in_the_controller_process_is_refused() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        RewardConfig(num_workers=0)


def test_a_dying_worker_fails_its_row_only(pooled: RewardScorer) -> None:
    scored = run(pooled, ["exit", "ok"])
    assert scored.scores == [0.0, 1.0]
    assert "reward worker process died (exit code 3)" in scored.errors[0]


def test_the_default_pool_is_reused_across_calls() -> None:
    """One pool for the whole run (its cost is measured in RewardConfig.num_workers' doc, not here)."""
    with RewardScorer(RewardConfig()) as scorer:  # the default pool
        args = (["3"] * 128, ["synthetic/echo"] * 128, ["3"] * 128, [{}] * 128)
        pids = [worker.process.pid for worker in scorer._pool.workers]
        for _ in range(3):
            assert scorer.score(*args).scores == [1.0] * 128
        assert [worker.process.pid for worker in scorer._pool.workers] == pids


@pytest.mark.parametrize("spec, message", [
    ("my_reward.py", "must look like 'path/to/file.py:function_name'"),
    ("missing.py:fn", "does not exist"),
    ("{file}:nope", r"'nope' is not defined there; functions in my_reward.py: \['badly_ranged', 'behave', 'ranged'\]"),
    ("{file}:not_a_function", "'not_a_function' is not callable"),
])
def test_a_bad_function_spec_is_a_user_error(custom_file: Path, spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        RewardScorer(RewardConfig(function=spec.format(file=custom_file), num_workers=1))


def test_a_custom_file_that_fails_to_import_names_the_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(UserError, match="importing .*broken.py failed: ModuleNotFoundError"):
        RewardScorer(RewardConfig(function=f"{tmp_path}/broken.py:fn", num_workers=1))


def test_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="timeout"):
        RewardConfig(timeout=3)


def test_a_scorer_left_open_at_interpreter_exit_stops_quietly():
    """A script that drops its scorer without closing it exits without 'Exception ignored in RewardScorer.__del__'
    (at interpreter exit the modules its clean-up used, contextlib, were already gone), its workers stopped."""
    import subprocess
    import sys

    script = (  # the controller's imports: with them contextlib goes before the scorer at exit
        "import rlkit.core.controller.controller\n"
        "from rlkit.core.rewards.scoring import RewardScorer\n"
        "from rlkit.recipes.reward_schema import RewardConfig\n"
        "scorer = RewardScorer(RewardConfig(num_workers=1))\n"
        "print(scorer.score(['#### 3'], ['openai/gsm8k'], ['3'], [{}]).scores)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1.0]"
    assert "Exception ignored" not in done.stderr
