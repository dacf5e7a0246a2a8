"""Bad agent code is caught before Ray starts: one line, exit code 2, no run directory."""

from __future__ import annotations

import pytest
from test_preflight import _one_line_error, _train

ENV_OK = "class Env:\n    def reset(self, row):\n        return None\n    def step(self, action):\n        return None, 1.0, True\n"


@pytest.mark.parametrize("source, overrides, message", [
    ("import no_such_module\n", [], "importing {file} failed: ModuleNotFoundError: No module named 'no_such_module'"),
    ("def broken(:\n", [], "importing {file} failed: SyntaxError"),
    (ENV_OK.replace("step(self, action)", "step(self)"), [],
     "Env.step(self) cannot be called as step(action); define it as def step(self, action)"),
    ("class Env:\n    def step(self, action):\n        return None, 1.0, True\n", [], "class Env has no method reset(row)"),
    ("Env = 3\n", [], "'Env' is not callable"),
    ("def Env():\n    pass\n", [], "names function 'Env', not a class with reset(row) and step(action)"),
    (ENV_OK, ["rollout.agent.env_kwargs={size: 3}"], "rollout.agent.env_kwargs={{'size': 3}} do not fit Env()"),
])
def test_bad_environment_code_exits_2_before_ray(tmp_path, source, overrides, message):
    file = tmp_path / "my_env.py"
    file.write_text(source)
    line = _one_line_error(_train(tmp_path, "rollout.agent.loop=env", f"rollout.agent.env={file}:Env", *overrides))
    assert message.format(file=file) in line


@pytest.mark.parametrize("overrides, message", [
    (["rollout.agent.loop=env"], "rollout.agent.loop=env needs rollout.agent.env=path/file.py:ClassName"),
    (["rollout.agent.loop=env", "rollout.agent.env=nowhere"], "unknown environment 'nowhere'"),
    (["rollout.agent.loop=tool"], "rollout.agent.loop=tool needs rollout.agent.tools"),
    (["rollout.agent.loop=tool", "rollout.agent.tools=[calculater]"], "did you mean 'calculator'"),
    (["rollout.agent.loop=chat"],
     "rollout.agent.loop='chat': choose one of single_turn, tool, env, verifiers:ENV (a verifiers environment), "
     "openenv:<env> (an OpenEnv environment), or your own"),
    (["rollout.agent.loop=verifiers:no_such_env"], "rollout.agent.loop=verifiers:no_such_env: loading the environment "
     "failed: ModuleNotFoundError: taskset 'no_such_env' not found"),
    (["rollout.agent.loop=verifiers:vf_arith", "reward.function=x.py:f"],
     "reward.function is set but rollout.agent.loop=verifiers:vf_arith is scored by its rubric; drop it"),
    (["rollout.agent.loop=verifiers:vf_arith", "rollout.agent.tools=[calculator]"],
     "rollout.agent.env and rollout.agent.tools are not used by rollout.agent.loop=verifiers:vf_arith"),
    (["rollout.agent.tools=[calculator]"], "rollout.agent.tools is set but rollout.agent.loop=single_turn never uses it"),
    (["rollout.agent.loop=tool", "rollout.agent.tools=[calculator]", "rollout.agent.max_tokens_per_turn=9",
      "data.max_response_length=8"], "rollout.agent.max_tokens_per_turn=9 is more than the whole response may hold"),
])
def test_bad_agent_settings_exit_2_before_ray(tmp_path, overrides, message):
    assert message in _one_line_error(_train(tmp_path, *overrides))


def test_a_tool_without_a_docstring_exits_2(tmp_path):
    file = tmp_path / "tools.py"
    file.write_text("def lookup(key: str) -> str:\n    return key\n")
    line = _one_line_error(_train(tmp_path, "rollout.agent.loop=tool", f"rollout.agent.tools=[{file}:lookup]"))
    assert f"{file}:lookup: tool 'lookup' has no docstring" in line


def test_an_agent_function_that_is_not_async_exits_2(tmp_path):
    file = tmp_path / "agent.py"
    file.write_text("def rollout(client, row):\n    return 1.0\n")
    line = _one_line_error(_train(tmp_path, f"rollout.agent.loop={file}:rollout", "rollout.agent.tools=[]"))
    assert "rollout must be `async def rollout(client, row) -> float`" in line


def test_a_chat_template_that_drops_the_tool_list_is_warned_about(tiny_model_dir, caplog):
    """The tiny model's template ignores tools= (the demo's policy learns its one-token call instead): the tool
    list never reaches the prompt, which a user cannot see from the reward alone. A template with tools: quiet."""
    from agent_helpers import CHATML_TOOLS_TEMPLATE
    from transformers import AutoTokenizer

    from rlkit.core.agents.preflight import check_agent
    from rlkit.recipes.agent_schema import AgentConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    agent = AgentConfig(loop="tool", tools=["calculator"])
    with caplog.at_level("WARNING", logger="rlkit.core.agents.preflight"):
        check_agent(agent, tokenizer, max_response_length=64, model_path="rlkit:tiny-qwen2")
    assert "the chat template of model.path=rlkit:tiny-qwen2 writes the same prompt with and without tools=, so " \
        "the model is never shown calculator" in caplog.text
    caplog.clear()
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    with caplog.at_level("WARNING", logger="rlkit.core.agents.preflight"):
        check_agent(agent, tokenizer, max_response_length=64, model_path="m")
    assert caplog.text == ""
