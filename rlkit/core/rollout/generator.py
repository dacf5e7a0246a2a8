"""The generation role: a rollout engine and everything that runs on it, in a device worker's process.

A colocated policy worker (rlkit.core.train.policy_worker) and a split-placement rollout worker
(rlkit.core.rollout.worker) each hold one. It generates (one turn, or the agent loop's episodes
and validation's: rlkit.core.agents.worker), scores sequences for the sync check, and loads
weights into the engine: from the actor beside it (`sync_weights`, colocated) or from what a
rollout worker received (`load`). A colocated engine sleeps between rollouts (its memory goes to
the update); a rollout worker's engine has its device to itself and never sleeps.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from rlkit.core.agents.client_loop import ClientAgentLoop
from rlkit.core.agents.loop import AgentLoop
from rlkit.core.agents.worker import build_agent_loop, run_episodes
from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.cluster.roles import Role
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling
from rlkit.core.rollout.engines import BesideStart, make_engine
from rlkit.core.rollout.scored_generation import episodes_scored, generate_scored
from rlkit.core.rollout.sync_check import SyncProbe, load_weights
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.state.shards import rng_state, set_rng_state
from rlkit.core.train import fsdp
from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.model_schema import DataConfig
from rlkit.recipes.reward_schema import RewardConfig
from rlkit.recipes.schema import RLConfig

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class Generator(Role):
    """`engine` on `device` (made by rlkit.core.rollout.engines.make_engine with `sleep_mode`);
    `weights` (colocated) yields the actor's full tensors for `sync_weights`. `agent` (rollout.agent) and
    `data` (the prompt and response lengths) describe the agent loop; `model_path` holds its tokenizer."""

    def __init__(
        self,
        phases: PhaseReporter,
        agent: AgentConfig,
        data: DataConfig,
        model_path: str,
        engine: RolloutEngine,
        *,
        device: torch.device,
        dtype: str,
        sleep_mode: bool,
        weights: Callable[[], Iterator[tuple[str, torch.Tensor]]] | None = None,
        reward: RewardConfig | None = None,
    ) -> None:
        """`reward` (reward.*): what `generate_scored` scores with, in reward worker processes of this one."""
        super().__init__(phases)
        self.agent, self.data, self.model_path, self.engine, self.weights = agent, data, model_path, engine, weights
        self.device, self.dtype, self.sleep_mode = device, dtype, sleep_mode
        self.sync_probe = SyncProbe()
        # A colocated engine frees its weights when it sleeps after a rollout (vLLM sleep level 2) where the sync
        # after the update loads them all: a host copy would cost a pinned buffer of their size (1.3 s to allocate
        # at the first sleep of a 0.5B model's engine on an H100) and two copies a step for nothing. The first
        # rollout that finds them gone (a second one before a sync: dynamic sampling's next round, ReMax's
        # baseline, a step without an update) loads the trainer's weights, the ones freed, and from then on the
        # engine keeps them (level 1).
        self.discard_on_sleep = sleep_mode and weights is not None and engine.discards_weights
        self.weights_discarded = False
        self._agent_loop: AgentLoop | ClientAgentLoop | None = None
        self.reward = reward
        self._scorer: RewardScorer | None = None  # the reward's pool, started on first use

    @classmethod
    def start(
        cls,
        phases: PhaseReporter,
        config: RLConfig,
        model_path: str,
        *,
        device: torch.device,
        dtype: str,
        seed: int,
        sleep_mode: bool,
        weights: Callable[[], Iterator[tuple[str, torch.Tensor]]] | None = None,
        beside_start: BesideStart | None = None,
    ) -> Generator:
        """The run's rollout engine on `device`, started (rlkit.core.rollout.engines.make_engine, with the
        caller's `beside_start`), and the role on it: a colocated policy worker's or a rollout worker's."""
        engine = make_engine(
            config.rollout,
            model_path,
            max_model_len=config.data.max_prompt_length + config.data.max_response_length,
            device=device,
            dtype=dtype,
            seed=seed,
            sleep_mode=sleep_mode,
            beside_start=beside_start,
        )
        return cls(
            phases,
            config.rollout.agent,
            config.data,
            model_path,
            engine,
            device=device,
            dtype=dtype,
            sleep_mode=sleep_mode,
            weights=weights,
            reward=config.reward,
        )

    def wake_engine(self, weights_only: bool = False, restore: bool = True) -> None:
        """Wake a sleeping engine, first handing back what PyTorch's allocator cached; with `restore`, load the
        weights its last sleep freed (`discard_on_sleep`) if no sync has loaded them since.

        The allocator keeps the training passes' freed blocks (the update's activations: ~45 GiB
        at 32k micro-batch tokens on a 0.5B model, measured on an H200), and a colocated engine
        would otherwise generate next to them; the next update allocates them again. An engine that
        never sleeps (a rollout worker's) has no update beside it: waking it does nothing.
        """
        if self.sleep_mode and self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.engine.wake_up(weights_only=weights_only)
        if restore:
            self.restore_weights()

    def restore_weights(self) -> None:
        """Load the trainer's weights into an engine whose last sleep freed them with no sync since, and keep
        them at later sleeps. The trainer's weights are those freed (every sync loads them; before the first,
        the checkpoint's both hold). A collective on every rank, as every sync: each rank's generator makes
        the same calls, so each finds its weights freed at the same call."""
        if not self.weights_discarded:
            return
        assert self.weights is not None  # discard_on_sleep needs them
        self.engine.wake_up(weights_only=True)
        load_weights(self.engine, self.weights())
        self.weights_discarded = self.discard_on_sleep = False

    def end_rollout(self) -> None:
        """After a rollout: the sync check's score before the next load (SyncProbe.score_before_load) while the
        engine still holds the weights it sampled with, then sleep, freeing them where `discard_on_sleep`."""
        self.sync_probe.score_before_load(self.engine)
        self.engine.sleep(discard_weights=self.discard_on_sleep)
        self.weights_discarded = self.weights_discarded or self.discard_on_sleep

    # -- generation ---------------------------------------------------------------------
    @in_phase("generate")
    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        self.wake_engine()
        samples = self.engine.generate(prompts, sampling, token_limits)
        self.sync_probe.record(prompts, samples)
        self.end_rollout()
        return samples

    @in_phase("generate")
    def generate_scored(self, rows: list[PromptRow], sampling: Sampling) -> tuple[list[RolloutSample], list[Any]]:
        """As `generate` on the rows' prompts, with each sample's reward outcome: scored in this process's reward
        pool as soon as the streaming engine finishes it (reward.while_generating;
        rlkit.core.rollout.scored_generation)."""
        self.wake_engine()
        samples, outcomes = generate_scored(self.engine, rows, sampling, *self.scoring())
        self.sync_probe.record([row.prompt_token_ids for row in rows], samples)
        self.end_rollout()
        return samples, outcomes

    def scoring(self) -> tuple[RewardScorer, Any]:
        """The reward's scorer (its worker processes start on first use) and the policy's tokenizer."""
        if self._scorer is None:
            if self.reward is None:
                raise RuntimeError("this generation role was built without a reward config: it cannot score")
            self._scorer = RewardScorer(self.reward)
        return self._scorer, self.tokenizer

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The policy's tokenizer (the agent loop's and the reward's text), loaded on first use."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    @in_phase("generate/agent")
    def agent_episodes(
        self, rows: list[Any], groups: list[int], sampling: Sampling, scored: bool = False
    ) -> list[Trajectory]:
        """sampling.n episodes per row, run turn by turn on the engine (rollout.agent.loop is not single_turn).
        `scored` (reward.while_generating): an episode its environment does not score is scored by the reward
        function as it ends, in this process's reward pool (an OpenAI-client agent's episodes score themselves)."""
        self.wake_engine()
        loop = self.agent_loop()
        if scored and isinstance(loop, AgentLoop):
            trajectories = episodes_scored(loop, self.engine, rows, groups, sampling, *self.scoring())
        else:
            trajectories = loop.run(self.engine, rows, groups, sampling)
        self.end_rollout()
        return trajectories

    def validation_episodes(self, rows: list[Any], groups: list[int], sampling: Sampling) -> list[Trajectory]:
        """Validation's episodes on the engine: the agent loop's (rollout.agent), or one-turn completions.
        This process's RNG states are put back afterwards (an engine may reseed them; the HF engine does),
        so validating never shifts what training draws next."""
        self.restore_weights()  # on every rank, those with no prompt too: a collective
        if not rows:  # fewer validation prompts than ranks
            return []
        state = rng_state()
        with self.reporting("validation"):
            self.wake_engine()
            try:
                loop = None if self.agent.loop == "single_turn" else self.agent_loop()
                return run_episodes(self.engine, loop, rows, groups, sampling)
            finally:
                self.engine.sleep()
                set_rng_state(state)

    def agent_loop(self) -> AgentLoop | ClientAgentLoop:
        """The agent loop, built on first use."""
        if self._agent_loop is None:
            self._agent_loop = build_agent_loop(self.agent, self.data, self.tokenizer)
        return self._agent_loop

    def engine_log_probs(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        """The engine's log-probs of given continuations (for checking the weight sync)."""
        self.restore_weights()
        return self.engine.score(sequences, prompt_len)

    # -- weights into the engine --------------------------------------------------------
    @in_phase("sync_weights")
    def sync_weights(self) -> dict[str, float]:
        """Colocated: stream the actor's full tensors from its FSDP2 shards into the engine, one at a time."""
        start = time.perf_counter()
        # A checked sync scores a sequence after loading: the whole engine must be awake. Every weight is loaded.
        self.wake_engine(weights_only=not self.sync_probe.pending, restore=False)
        moved, checked = self.load(self.weights())  # type: ignore[misc]
        self.weights_discarded = False
        # The engine stays awake (weights only, no KV cache) until the next rollout's generate.
        return {"sync/bytes": moved, "sync/seconds": time.perf_counter() - start, **checked}

    def load(self, named_tensors: NamedTensors) -> tuple[float, dict[str, float]]:
        """Load full tensors into the engine, checked by the SyncProbe (rlkit.core.rollout.sync_check):
        the bytes moved, and the check's metrics."""
        moved = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal moved
            for name, tensor in named_tensors:
                moved += tensor.numel() * tensor.element_size()
                yield name, tensor

        checked = self.sync_probe.load(self.engine, counted(), fsdp.DTYPES[self.dtype])
        return float(moved), checked
