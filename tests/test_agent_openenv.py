"""rollout.agent.loop=openenv:<env>: OpenEnv environments, in-process and behind openenv's own server on
localhost, through the token-exact AgentLoop on a scripted engine; the adapter's defaults and hooks; failures
that cost one episode; the checks made before a run starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_helpers import ScriptedEngine, rows
from openenv_envs import SayDigit, SayDigitOnOneThread, serve
from transformers import AutoTokenizer

from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Limits
from rlkit.core.agents.openenv_env import Adapter, Target, episode_factory, text_field
from rlkit.core.agents.preflight import check_agent
from rlkit.core.rollout.base import Sampling
from rlkit.errors import UserError
from rlkit.recipes.agent_schema import AgentConfig

IM_START, IM_END = 1, 2  # the tiny tokenizer's special tokens
ENVS = Path(__file__).parent / "openenv_envs.py"
LIMITS = Limits(max_turns=3, max_tokens_per_turn=1, max_response_tokens=16, max_prompt_tokens=32)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _digit_policy(tok):
    """Says "a" until the environment named a digit (the token before its end of turn and the next turn's
    start), then that digit."""
    digits = {tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    a = tok.convert_tokens_to_ids("a")
    return ScriptedEngine(lambda ctx: ([ctx[-3]], False) if ctx[-3] in digits else ([a], False))


def _run(tok, spec: str, engine, *, n_rows=3, n=2, timeout=5.0, adapter=None, env_kwargs=None, limits=LIMITS):
    make_env = episode_factory(f"openenv:{spec}", env_kwargs or {}, adapter, timeout)
    loop = AgentLoop(tok, make_env, limits, Guard(timeout))
    data = rows(tok, ["x"] * n_rows, ["0"] * n_rows)
    return loop.run(engine, data, list(range(n_rows)), Sampling(n=n, max_tokens=1, seed=1, log_probs=True))


def _expected(tok, digit: int) -> list[int]:
    a, d = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids(str(digit))
    # turn 1 | the template closes it, the user message (the digit), the next turn | turn 2
    return [a, IM_END, IM_START, d, IM_END, IM_START, d]


def test_an_in_process_environment_plays_token_exact_episodes(tok):
    trajectories = _run(tok, f"{ENVS}:SayDigit", _digit_policy(tok))
    prompt = tok.apply_chat_template([{"role": "user", "content": "digit?"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    # Row i's two episodes reset with seed i (the default reset_kwargs): the same digit, one GRPO group.
    assert [t.group for t in trajectories] == [0, 0, 1, 1, 2, 2]
    for k, t in enumerate(trajectories):
        assert t.row.prompt_token_ids == prompt  # reset's observation is the first user turn
        assert t.response_ids == _expected(tok, k // 2)
        assert t.loss_mask == [1, 0, 0, 0, 0, 0, 1]
        # The engine's log-probs on the policy's tokens (sample i of a call: -0.1 - i/1000), 0 on the env's.
        assert t.log_probs == pytest.approx([-0.1 - k / 1000, 0, 0, 0, 0, 0, -0.1 - k / 1000])
        assert t.reward == 1.25 and t.finish_reason == "stop"  # 0.25 (turn 1) + 1.0 (the right digit)


def test_the_same_environment_behind_openenvs_server_gives_the_same_episodes(tok):
    local = _run(tok, f"{ENVS}:SayDigit", _digit_policy(tok))
    with serve(SayDigit, max_sessions=6) as url:
        remote = _run(tok, url, _digit_policy(tok))
        # Every session was closed after its episode: a second rollout gets all 6 again.
        again = _run(tok, url, _digit_policy(tok))
    for trajectories in (remote, again):
        assert [(t.response_ids, t.loss_mask, t.log_probs, t.reward, t.finish_reason) for t in trajectories] == [
            (t.response_ids, t.loss_mask, t.log_probs, t.reward, t.finish_reason) for t in local]


def test_each_episode_keeps_one_thread_and_single_thread_environments_share_one(tok):
    """As openenv's server runs a session: the 6 episodes' steps on 6 threads, each its reset's (SayDigit
    checks); a class with REQUIRES_SINGLE_THREAD_EXECUTOR gets one thread for all."""
    SayDigit.step_threads.clear()
    assert [t.reward for t in _run(tok, "openenv_envs:SayDigit", _digit_policy(tok))] == [1.25] * 6
    assert len(SayDigit.step_threads) == 6
    assert [t.reward for t in _run(tok, "openenv_envs:SayDigitOnOneThread", _digit_policy(tok))] == [1.25] * 6
    assert len(SayDigitOnOneThread.step_threads) == 1


def test_wrong_answers_score_only_the_first_turns_reward_and_environments_are_closed(tok):
    a = tok.convert_tokens_to_ids("a")
    before = SayDigit.closed
    trajectories = _run(tok, "openenv_envs:SayDigit", ScriptedEngine(lambda ctx: ([a], False)), n_rows=2)
    assert [t.reward for t in trajectories] == [0.25] * 4  # 0.25 + 0.0
    assert SayDigit.closed - before == 4


def test_failing_or_hanging_steps_cost_their_episode_only(tok):
    start = time.perf_counter()
    trajectories = _run(tok, f"{ENVS}:SayDigit", _digit_policy(tok), timeout=0.5,
                        env_kwargs={"fail_seed": 1, "hang_seed": 2})
    assert time.perf_counter() - start < 5
    assert [t.finish_reason for t in trajectories] == ["stop", "stop", "error", "error", "error", "error"]
    assert [t.reward for t in trajectories] == [1.25, 1.25, 0.0, 0.0, 0.0, 0.0]
    assert "ValueError: cannot play seed 1" in trajectories[2].info["env_error"]
    assert "TimeoutError: did not return within 0.5 s" in trajectories[4].info["env_error"]


def test_a_server_that_fails_or_goes_away_costs_episodes(tok):
    with serve(lambda: SayDigit(fail_seed=1)) as url:
        make_env = episode_factory(f"openenv:{url}", {}, None, 5.0)
        trajectories = _run(tok, url, _digit_policy(tok))
        assert [t.reward for t in trajectories] == [1.25, 1.25, 0.0, 0.0, 1.25, 1.25]
        assert "cannot play seed 1" in trajectories[2].info["env_error"]
    with serve(SayDigit, max_sessions=4) as small:  # 6 episodes at once: 2 get no session
        trajectories = _run(tok, small, _digit_policy(tok))
    errors = [t.info["env_error"] for t in trajectories if t.finish_reason == "error"]
    assert len(errors) == 2 and all("start it with a larger max_concurrent_envs" in e for e in errors), errors
    # The server is gone: the loop built while it ran now fails every episode, saying where it tried.
    loop = AgentLoop(tok, make_env, LIMITS, Guard(5.0))
    [t] = loop.run(_digit_policy(tok), rows(tok, ["x"], ["0"]), [0], Sampling(n=1, max_tokens=1))
    assert t.finish_reason == "error" and f"the OpenEnv server at {url} is unreachable" in t.info["env_error"]


ADAPTER = '''
class Numbers:
    def reset_kwargs(self, row):
        return {"seed": int(row["ground_truth"]), "level": "easy"}  # AddUp.reset takes no level: dropped

    def action(self, text, row):
        return {"value": int(text) if text.isdigit() else 0}

    def observation(self, fields, row):
        return f"at {fields['total']} of {fields['target']}"
'''


def test_an_adapter_maps_text_to_typed_actions_and_observations_to_turns(tok, tmp_path):
    (tmp_path / "adapter.py").write_text(ADAPTER)
    three = tok.convert_tokens_to_ids("3")
    limits = Limits(max_turns=4, max_tokens_per_turn=1, max_response_tokens=40, max_prompt_tokens=32)
    make_env = episode_factory(f"openenv:{ENVS}:AddUp", {}, f"{tmp_path}/adapter.py:Numbers", 5.0)
    data = rows(tok, ["x", "x", "x"], ["6", "7", "six"])
    trajectories = AgentLoop(tok, make_env, limits, Guard(5.0)).run(
        ScriptedEngine(lambda ctx: ([three], False)), data, [0, 1, 2], Sampling(n=1, max_tokens=1))
    assert tok.decode(trajectories[0].row.prompt_token_ids, skip_special_tokens=True) == "at 0 of 6"
    # 3 + 3 reaches 6 (reward 1); 3 + 3 + 3 passes 7 (reward 0); the turn between says the total.
    assert [(t.info["turns"], t.reward) for t in trajectories[:2]] == [(2, 1.0), (3, 0.0)]
    # A hook that raises (int("six")) costs its episode only.
    assert trajectories[2].finish_reason == "error" and "invalid literal for int()" in trajectories[2].info["env_error"]
    assert "at 3 of 6" in tok.decode(trajectories[0].response_ids, skip_special_tokens=True)


def test_the_default_adapter_fills_the_one_text_field_and_shows_observations_as_text():
    text_action = {"properties": {"metadata": {"type": "object"}, "message": {"type": "string"}},
                   "required": ["message"]}
    assert text_field(text_action) == "message"
    assert text_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}}) is None
    assert text_field({"properties": {"a": {"type": "string"}, "n": {"type": "integer"}}, "required": ["a", "n"]}) \
        is None
    assert text_field({"properties": {"a": {"type": "string"}, "n": {"type": "integer"}}}) == "a"
    adapter = Adapter(Target("x", text_action), None)
    row = {"index": 4}
    assert adapter.reset_kwargs(row) == {"seed": 4}
    assert adapter.action("hi", row) == {"message": "hi"}
    assert adapter.observation({"text": "hello", "n": 2}, row) == "hello"
    assert adapter.observation({"total": 3, "target": 6}, row) == '{"total": 3, "target": 6}'
    assert adapter.step_result({"text": "bye"}, 1.0, True, row) == (None, 1.0, True)


def _check(tok, **agent):
    check_agent(AgentConfig(**agent), tok, max_response_length=16, model_path="tiny")


def test_checks_before_the_run_name_the_key_and_the_fix(tok, tmp_path):
    _check(tok, loop=f"openenv:{ENVS}:SayDigit", env_kwargs={"fail_seed": 1})
    (tmp_path / "adapter.py").write_text(ADAPTER)
    _check(tok, loop=f"openenv:{ENVS}:AddUp", openenv_adapter=f"{tmp_path}/adapter.py:Numbers")
    for agent, message in [
        ({"loop": f"openenv:{ENVS}:AddUp"}, "has fields {'metadata': 'object', 'value': 'integer'}, not one required "
                                            "string field for the policy's text; write rollout.agent.openenv_adapter"),
        ({"loop": f"openenv:{ENVS}:SayAction"}, "'SayAction' is not a subclass of openenv's Environment"),
        ({"loop": "openenv:no_such_module:Env"}, "cannot import no_such_module (ModuleNotFoundError"),
        ({"loop": f"openenv:{ENVS}:SayDigit", "env_kwargs": {"tries": 2}}, "rollout.agent.env_kwargs={'tries': 2} "
                                                                          "do not fit SayDigit"),
        ({"loop": "openenv:http://127.0.0.1:9", "env_kwargs": {"a": 1}}, "are not used by a server"),
        ({"loop": "openenv:http://127.0.0.1:9"}, "no OpenEnv server answers at http://127.0.0.1:9"),
        ({"loop": "env", "env": f"{ENVS}:SayDigit", "openenv_adapter": "a.py:A"}, "rollout.agent.loop=env never"),
        ({"loop": f"openenv:{ENVS}:SayDigit", "openenv_adapter": f"{ENVS}:SayAction"}, "defines none of"),
    ]:
        with pytest.raises(UserError) as error:
            _check(tok, **agent)
        assert message in str(error.value), (agent, str(error.value))
    with serve(SayDigit) as url:
        _check(tok, loop=f"openenv:{url}")  # the server's /schema: a text action
