"""gdpo (rlkit/core/algos/gdpo.py) against hand-computed numbers, the scoring stage that hands it the reward
function's components, and the config keys it reads (algorithm.gdpo_reward_keys, gdpo_reward_weights)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_algos_advantages import CONSTANT_SCORES

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages
from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.batch import Batch
from rlkit.core.rewards.scoring import ScoredBatch
from rlkit.core.rewards.worker_pool import RewardError
from rlkit.core.rollout.stages import Score
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config

G = 1e3  # garbage in padding: never read
# Group 0: (accuracy, format) = (1, 1) and (0, 0); group 1: (1, 0) and (0, 0). One token each, R = 2.
COMPONENTS = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]


def gdpo_inputs(components: list[list[float]] = COMPONENTS, groups: list[int] = (0, 0, 1, 1)) -> AdvantageInputs:
    n = len(components)
    rewards = torch.tensor([[sum(c), G] for c in components])  # the summed score: gdpo does not read it
    return AdvantageInputs(rewards, torch.tensor([[1, 0]] * n), torch.tensor(groups),
                           reward_components=torch.tensor(components))


def test_each_component_is_normalised_in_its_group_then_summed_and_whitened() -> None:
    # Two samples a group: centred +-.5, unbiased std 1/sqrt 2, so a differing component gives +-1/sqrt 2.
    # Group 0: accuracy +-1/sqrt 2, format +-1/sqrt 2 -> sums +-sqrt 2. Group 1: accuracy +-1/sqrt 2, format equal
    # (0) -> sums +-1/sqrt 2. Whitened over the 4 tokens: mean 0, unbiased var (2 + 2 + .5 + .5) / 3 = 5/3
    # -> +-sqrt 2 / sqrt(5/3) = +-sqrt 1.2 and +-(1/sqrt 2) / sqrt(5/3) = +-sqrt .3.
    adv, ret = compute_advantages("gdpo", gdpo_inputs())
    want = [math.sqrt(1.2), -math.sqrt(1.2), math.sqrt(0.3), -math.sqrt(0.3)]
    assert torch.allclose(adv, torch.tensor([[w, 0.0] for w in want]), atol=1e-5) and torch.equal(ret, adv)
    # GRPO on the summed scores [2, 0] and [1, 0] gives both groups +-1/sqrt 2: the collapse GDPO avoids.
    grpo, _ = compute_advantages("grpo", gdpo_inputs())
    assert torch.allclose(grpo[:, 0], torch.tensor([1, -1, 1, -1]) / math.sqrt(2), atol=1e-5)


def test_weights_and_no_std_division() -> None:
    # Weights (2, 1), centred only: group 0 2 x .5 + .5 = 1.5 -> +-1.5; group 1 2 x .5 + 0 = 1 -> +-1.
    # Whitened: mean 0, var (2.25 + 2.25 + 1 + 1) / 3 = 13/6 -> +-1.5 / sqrt(13/6), +-1 / sqrt(13/6).
    adv, _ = compute_advantages("gdpo", gdpo_inputs(), norm_adv_by_std=False, gdpo_reward_weights=[2.0, 1.0])
    scale = math.sqrt(6 / 13)
    assert torch.allclose(adv[:, 0], torch.tensor([1.5, -1.5, 1.0, -1.0]) * scale, atol=1e-6)


def test_a_sample_alone_keeps_its_components_and_padding_stays_zero() -> None:
    # Two groups of one: mean 0, std 1, so the sums are 1 + 0 = 1 and 0 + 0 = 0; whitened: mean .5, var .5
    # -> +-.5 / sqrt .5 = +-1/sqrt 2 on the valid token, 0 on the padding slot.
    adv, _ = compute_advantages("gdpo", gdpo_inputs([[1.0, 0.0], [0.0, 0.0]], [3, 8]))
    assert torch.allclose(adv, torch.tensor([[1, 0.0], [-1, 0.0]]) / math.sqrt(2), atol=1e-6)


def test_components_equal_within_every_group_give_exactly_zero() -> None:
    # 16 samples a group, each component one fractional value per group: every centred term is exactly 0.
    components = [[s, 1 - s] for s in CONSTANT_SCORES for _ in range(16)]
    groups = [g for g in range(len(CONSTANT_SCORES)) for _ in range(16)]
    adv, _ = compute_advantages("gdpo", gdpo_inputs(components, groups))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_it_needs_the_components_and_one_weight_each() -> None:
    with pytest.raises(ValueError, match="reward_components"):
        compute_advantages("gdpo", AdvantageInputs(torch.ones(1, 1), torch.ones(1, 1), torch.tensor([0])))
    with pytest.raises(ValueError, match="2 reward components but 3 weights"):
        compute_advantages("gdpo", gdpo_inputs(), gdpo_reward_weights=[1.0, 1.0, 1.0])


BASE = ["model.path=some/model", "data.synthetic_task=echo", "algorithm.adv_estimator=gdpo"]


def test_the_algorithm_reads_the_components_and_passes_the_weights() -> None:
    config = load_config("grpo-demo", [*BASE, "algorithm.gdpo_reward_keys=[accuracy,format]",
                                       "algorithm.gdpo_reward_weights=[2,1]", "algorithm.norm_adv_by_std=false"])
    algorithm = Algorithm.from_config(config)
    assert algorithm.reward_components == ("accuracy", "format") and algorithm.groups
    batch = Batch({"response_mask": torch.tensor([[1, 0]] * 4), "scores": torch.zeros(4),
                   "group_ids": torch.tensor([0, 0, 1, 1]), "reward_components": torch.tensor(COMPONENTS)})
    adv, _ = algorithm.advantages(algorithm.advantage_inputs(batch, algorithm.kl_controller()))
    assert torch.allclose(adv[:, 0], torch.tensor([1.5, -1.5, 1.0, -1.0]) * math.sqrt(6 / 13), atol=1e-6)


@pytest.mark.parametrize(("overrides", "key"), [
    ([], "algorithm.gdpo_reward_keys"),
    (["algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1]"], "algorithm.gdpo_reward_weights"),
    (["algorithm.gdpo_reward_keys=[a,a]"], "algorithm.gdpo_reward_keys"),
    (["algorithm.gdpo_reward_keys=[a]", "algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward"),
    (["algorithm.gdpo_reward_keys=[a]", "reward.overlong_buffer.enable=true", "reward.overlong_buffer.length=1"],
     "reward.overlong_buffer.enable"),
])
def test_contradictory_or_missing_settings_are_refused_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("grpo-demo", [*BASE, *overrides])


def test_the_keys_are_refused_where_the_estimator_does_not_read_them() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.gdpo_reward_keys.*only adv_estimator=gdpo reads it"):
        load_config("grpo-demo", ["model.path=some/model", "data.synthetic_task=echo", "algorithm.gdpo_reward_keys=[a]"])


def scoring_stage(details: list[dict[str, float]], failed: list[bool]) -> Score:
    """A Score stage whose reward function returned `details` besides each score (a stand-in scorer)."""
    scored = ScoredBatch([1.0] * len(details), {}, details, failed=failed)
    scorer = SimpleNamespace(score=lambda *_: scored)
    tokenizer = SimpleNamespace(pad_token_id=0, batch_decode=lambda ids, **_: ["x"] * len(ids))
    return Score(None, None, tokenizer, scorer, None, reward_model=False, max_response_length=4,
                 components=("accuracy", "format"))


def rule_batch(n: int) -> Batch:
    batch = Batch({"responses": torch.ones(n, 2, dtype=torch.long), "response_mask": torch.ones(n, 2)})
    batch.meta.update(data_source=["mine"] * n, ground_truth=["1"] * n, extra_info=[{}] * n)
    return batch


def test_the_scoring_stage_collects_the_named_components_in_order() -> None:
    # Row 1's call failed (scored 0, no details): its components are 0 too.
    stage = scoring_stage([{"format": 0.5, "accuracy": 1.0, "length": 9.0}, {}], [False, True])
    _, _, components = stage.rule_scores(rule_batch(2))
    assert components["reward_components"].tolist() == [[1.0, 0.5], [0.0, 0.0]]
    assert stage.keys == ("scores", "verifier_scores", "reward_components")


def test_a_row_that_scored_without_a_component_is_a_reward_error_naming_it() -> None:
    stage = scoring_stage([{"accuracy": 1.0, "format": 1.0}, {"accuracy": 0.0}], [False, False])
    with pytest.raises(RewardError, match=r"row 1 .*no 'format'.*algorithm\.gdpo_reward_keys"):
        stage.rule_scores(rule_batch(2))
