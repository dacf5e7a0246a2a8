"""Validation without Ray: the Evaluator over a fake engine, seeds, spreading over ranks, RNG isolation,
the schedule, config keys, and what `runs show`, `plot` and `rlkit eval` make of it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rlkit.core.agents.worker import run_episodes
from rlkit.core.cluster.phases import PhaseReporter
from rlkit.core.controller.validation import (
    Evaluator,
    GenerateFn,
    ValSettings,
    discard_generations_after,
    generations_path,
    scorer_score,
    val_seed,
    validation_due,
    workers_episodes,
)
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.base import RolloutSample, Sampling
from rlkit.core.rollout.generator import Generator
from rlkit.errors import ConfigError
from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.loader import load_config
from rlkit.recipes.reward_schema import RewardConfig

DEMO = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"]


class DigitTokenizer:
    """Token t is the digit t."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(str, ids))

    def batch_decode(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids) for ids in batch]


class FakeEngine:
    """Greedy answers the prompt's digit; sample j of prompt i answers (seed + i * n + j) % 10, as a
    seeded engine draws from seed + i * n + j (rlkit.core.rollout.base.Sampling)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], Sampling]] = []

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        self.calls.append((prompts, sampling))
        return [RolloutSample(i, [p[0] if sampling.greedy else (sampling.seed + i * sampling.n + j) % 10], [],
                              finished=True)
                for i, p in enumerate(prompts) for j in range(sampling.n)]


def one_turn(engine: FakeEngine) -> GenerateFn:
    """Single-turn episodes on one engine, as `rlkit eval` runs them (rlkit.core.controller.validation.engine_episodes)."""
    return lambda rows, sampling: run_episodes(engine, None, rows, list(range(len(rows))), sampling)


def echo_rows(digits: list[int]) -> list[PromptRow]:
    return [PromptRow(i, [d], "synthetic/echo", str(d)) for i, d in enumerate(digits)]


def settings(n: int, seed: int = 0) -> ValSettings:
    return ValSettings(n=n, max_tokens=3, temperature=0.7, top_p=0.9, top_k=-1, seed=seed)


def test_val_seeds_are_a_stream_of_their_own() -> None:
    assert val_seed(0, 0) == 2 ** 60
    assert val_seed(3, 5) == 2 ** 60 + (3 * 1_000_003 + 5) * 2 ** 24
    # Training's seeds at a plausible step: (seed * 1_000_003 + step) * 1009 + rank, far below.
    assert (3 * 1_000_003 + 10 ** 6) * 1009 + 7 < val_seed(0, 0)


def test_evaluator_scores_greedy_and_samples_and_writes_every_response(tmp_path: Path) -> None:
    engine = FakeEngine()
    with RewardScorer(RewardConfig(num_workers=1)) as scorer:
        evaluator = Evaluator(echo_rows([6, 3]), DigitTokenizer(), settings(n=2), one_turn(engine),
                              scorer_score(scorer), RewardConfig(), AgentConfig())
        metrics = evaluator.run(0, tmp_path / "step_0.jsonl")
    greedy, sampled = engine.calls
    assert greedy[1].greedy and greedy[1].n == 1 and not greedy[1].log_probs
    assert not sampled[1].greedy and sampled[1].n == 2 and sampled[1].temperature == 0.7
    assert greedy[1].seed == sampled[1].seed == val_seed(0, 0)
    # 2**60 % 10 == 6: prompt 0 ("6") samples 6, 7; prompt 1 ("3") samples 8, 9.
    assert metrics == pytest.approx({
        "val/reward/mean@1": 1.0, "val/reward/mean@2": 0.25, "val/reward/pass@1": 0.25, "val/reward/pass@2": 0.5,
        "val/reward/maj@2": (0.5 + 0.0) / 2, "val/response/length_mean": 1.0, "val/response/clip_frac": 0.0,
        **{k.replace("val/", "val/synthetic/echo/"): v for k, v in {
            "val/reward/mean@1": 1.0, "val/reward/mean@2": 0.25, "val/reward/pass@1": 0.25,
            "val/reward/pass@2": 0.5, "val/reward/maj@2": 0.25, "val/response/length_mean": 1.0,
            "val/response/clip_frac": 0.0}.items()}})
    lines = [json.loads(line) for line in (tmp_path / "step_0.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["row"], r["sample"], r["response"], r["score"]) for r in lines] == [
        ("greedy", 0, 0, "6", 1.0), ("greedy", 1, 0, "3", 1.0),
        ("sample", 0, 0, "6", 1.0), ("sample", 0, 1, "7", 0.0), ("sample", 1, 0, "8", 0.0), ("sample", 1, 1, "9", 0.0)]
    assert lines[3] == {"step": 0, "row": 0, "data_source": "synthetic/echo", "kind": "sample", "sample": 1,
                        "prompt": "6", "response": "7", "ground_truth": "6", "score": 0.0, "answer": "7",
                        "length": 1, "finished": True}


def test_greedy_only_validation_makes_one_generate_call(tmp_path: Path) -> None:
    engine = FakeEngine()
    with RewardScorer(RewardConfig(num_workers=1)) as scorer:
        metrics = Evaluator(echo_rows([1, 2, 3]), DigitTokenizer(), settings(n=0), one_turn(engine),
                            scorer_score(scorer), RewardConfig(), AgentConfig()).run(4)
    assert len(engine.calls) == 1 and metrics["val/reward/mean@1"] == 1.0
    assert not any("@2" in key or "pass" in key for key in metrics)


class FakeGroup:
    def __init__(self, ranks: int) -> None:
        self.size = ranks

    def call(self, method, *, per_rank: list[tuple], phase: str) -> list:
        assert method.__name__ == "validation_episodes"
        return [run_episodes(FakeEngine(), None, rows, groups, sampling) for rows, groups, sampling in per_rank]


@pytest.mark.parametrize(("prompts", "ranks"), [(7, 3), (2, 3), (4, 1)])
def test_spreading_over_ranks_draws_what_one_engine_draws(prompts: int, ranks: int) -> None:
    """Contiguous slices, each seeded so sample j of prompt p keeps seed + p * n + j: `rlkit eval`
    with one engine draws the same samples as a run with several."""
    rows = echo_rows(list(range(prompts)))
    sampling = Sampling(n=3, seed=1234)
    spread = workers_episodes(FakeGroup(ranks))(rows, sampling)
    assert spread == one_turn(FakeEngine())(rows, sampling)
    assert [(e.group, e.response_ids) for e in spread[:4]] == [(0, [(1234 + j) % 10]) for j in range(3)] + [(1, [7])]


def test_validation_episodes_put_the_workers_rng_back() -> None:
    class Engine:
        def generate(self, prompts, sampling):  # as the HF engine does: reseed the process
            torch.manual_seed(sampling.seed)
            random.seed(sampling.seed)
            return [RolloutSample(0, [int(torch.randint(10, ()))], [], True)]

        def sleep(self) -> None:
            pass

        def wake_up(self, weights_only: bool = False) -> None:
            pass

    class Reporter(PhaseReporter):
        rank = 0

    def generator() -> Generator:
        config = load_config("grpo-demo")
        return Generator(Reporter(), config.rollout.agent, config.data, "unused", Engine(), device=torch.device("cpu"),
                         dtype="float32", sleep_mode=False)

    torch.manual_seed(7)
    random.seed(7)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(7)
    random.seed(7)
    assert len(generator().validation_episodes(echo_rows([1]), [0], Sampling(seed=99))) == 1
    assert generator().validation_episodes([], [], Sampling(seed=99)) == []
    got = (torch.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


def test_schedule_every_val_freq_steps_and_after_the_last() -> None:
    trainer = load_config("grpo-demo", ["trainer.total_steps=10", "trainer.val_freq=4"]).trainer
    assert [s for s in range(1, 11) if validation_due(s, trainer)] == [4, 8, 10]
    trainer = load_config("grpo-demo", ["trainer.total_steps=10", "trainer.val_freq=0"]).trainer
    assert [s for s in range(1, 11) if validation_due(s, trainer)] == [10]


def test_resume_discards_the_killed_runs_later_validations(tmp_path: Path) -> None:
    for step in (0, 2, 4, 6):
        path = generations_path(tmp_path, step)
        path.parent.mkdir(exist_ok=True)
        path.write_text("{}\n")
    discard_generations_after(tmp_path, 4)
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == [
        "step_00000000.jsonl", "step_00000002.jsonl", "step_00000004.jsonl"]


def test_config_keys_and_verl_aliases() -> None:
    config = load_config("grpo", DEMO + ["actor_rollout_ref.rollout.val_kwargs.n=8",
                                         "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
                                         "+trainer.val_before_train=False", "trainer.test_freq=5",
                                         "rollout.temperature=0.9"])
    trainer = config.trainer
    assert (trainer.val_n, trainer.val_temperature, trainer.val_before_train, trainer.val_freq) == (8, 0.6, False, 5)
    assert ValSettings.from_config(config).temperature == 0.6
    assert ValSettings.from_config(load_config("grpo", DEMO + ["rollout.temperature=0.9"])).temperature == 0.9
    with pytest.raises(ConfigError, match="trainer.val_n .*use 0 or >= 2"):
        load_config("grpo", DEMO + ["actor_rollout_ref.rollout.val_kwargs.n=1"])
    with pytest.raises(ConfigError, match="always scores one greedy response"):
        load_config("grpo", DEMO + ["actor_rollout_ref.rollout.val_kwargs.do_sample=true"])
    with pytest.raises(ConfigError, match="rlkit eval"):
        load_config("grpo", DEMO + ["trainer.val_only=true"])


def test_synthetic_runs_validate_on_their_test_split_only_when_asked(tmp_path: Path) -> None:
    from rlkit.core.state.run_dir import prepare_val_files

    demo = load_config("grpo-demo")
    assert demo.trainer.val_freq == 20
    [path] = prepare_val_files(demo, tmp_path)
    assert path == str(tmp_path / "data" / "val.parquet") and Path(path).is_file()
    assert prepare_val_files(load_config("grpo-demo", ["trainer.val_freq=0"]), tmp_path) == []
    # Training on other data, the synthetic task's split is not a validation set.
    assert prepare_val_files(load_config("grpo-demo", ["data.train_files=[t.parquet]"]), tmp_path) == []
    assert prepare_val_files(load_config("grpo-demo", ["data.val_files=[~/v.parquet]"]), tmp_path) == [
        str(Path("~/v.parquet").expanduser())]
