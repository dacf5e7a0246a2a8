"""Turn boundaries in token ids: what the chat template puts between a policy turn and the next one.

The tokens of a multi-turn episode are never decoded and re-encoded. The policy's tokens stay
exactly as the engine sampled them; after each turn only the *new* text is tokenized: the end
of the assistant turn, the tool or environment messages, and the start of the next assistant
turn. That text is cut out of the tokenizer's own chat template, rendered for a conversation
whose assistant message is a probe string, so whatever the template writes after an
assistant message (Qwen2.5: `<|im_end|>\\n<|im_start|>user\\n<tool_response>...`) is exactly
what is appended. The cut always starts right after assistant content, where templates put a
special token, so tokenizing the piece on its own gives the ids that tokenizing the whole
conversation would give there.
"""

from __future__ import annotations

import json
from typing import Any

# Content no template changes (no whitespace at the edges, no tags) and no real message contains.
PROBE = "RLKIT-TURN-PROBE-7f3a"
# Distinct environment answers whose ids a TurnBoundary keeps (then it starts over): an environment that
# answers with a few fixed messages, as games and many tool loops do, renders each through the template once.
MAX_REMEMBERED = 4096


class TurnBoundary:
    """Token ids to append after a policy turn, for a given tokenizer (and its tools, if any)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        if not tokenizer.chat_template:
            raise ValueError(
                "the tokenizer has no chat template, so there is no way to write tool or environment "
                "messages into the conversation"
            )
        self.tokenizer, self.tools = tokenizer, tools or None
        self.remembered: dict[str, list[int]] = {}  # `delta`'s ids by its messages

    def render_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """A whole prompt (an environment's first observation), ready for the policy's first turn."""
        return list(
            self.tokenizer.apply_chat_template(
                messages, tools=self.tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    def after_turn(self, turn_ids: list[int], messages: list[dict[str, Any]]) -> list[int]:
        """The ids that close the policy's turn, carry `messages`, and open the next assistant turn.

        A turn that ended with the template's own end-of-turn token (the engine stopped on it)
        already holds that token, so it is not appended twice; a turn cut at its token limit is
        closed here on the policy's behalf (those tokens are the environment's: loss mask 0).
        """
        ids = self.delta(messages)
        if turn_ids and ids and turn_ids[-1] == ids[0]:
            return ids[1:]
        return ids

    def delta(self, messages: list[dict[str, Any]]) -> list[int]:
        """Everything the template writes after an assistant message's content, up to the next
        assistant turn's first content token. Rendering the template and encoding its text took 0.23 ms a
        turn on 2 cores, a quarter of the agent loop's host time for 512 episodes of 3 turns (docs/agents.md),
        so the ids of messages seen before are remembered: the same messages give the same ids."""
        try:
            key = json.dumps(messages, sort_keys=True)
        except (TypeError, ValueError):  # content that is not JSON (an object a tool returned): rendered each time
            return self.render_delta(messages)
        ids = self.remembered.get(key)
        if ids is None:
            ids = self.render_delta(messages)
            if len(self.remembered) >= MAX_REMEMBERED:
                self.remembered.clear()
            self.remembered[key] = ids
        return list(ids)

    def render_delta(self, messages: list[dict[str, Any]]) -> list[int]:
        conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": PROBE}, *messages]
        text = self.tokenizer.apply_chat_template(
            conversation, tools=self.tools, add_generation_prompt=True, tokenize=False
        )
        at = text.find(PROBE)
        if at < 0:
            raise ValueError(
                "the chat template does not write an assistant message's content, so turns cannot be "
                "joined token by token"
            )
        return list(self.tokenizer.encode(text[at + len(PROBE) :], add_special_tokens=False))
