"""bench/learning.py's settings: the task, the model, SFT and the RL runs, for a GPU (and the harder task that
--sft-plateau runs), and for the CPU smoke run (--tiny)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Settings:
    task: dict  # rlkit prep-data arithmetic options
    size: str  # rlkit.core.train.scratch.SIZES
    vocab: int
    sft: dict  # SFT overrides
    sft_steps: int
    sft_save_freq: int  # every checkpoint is kept: the pick searches them all
    prompts: int  # per RL step
    samples: int  # per prompt
    response_length: int
    rl_lr: float
    rl_steps: int  # the most RL steps of one run (the deadline usually ends it first)
    val_freq: int
    extra: list[str] = field(default_factory=list)  # overrides of every rlkit RL run


SETTINGS = {
    # ~114M-parameter Qwen2 on an H200: SFT ~1.5 min, RL ~2 s a step after ~45 s of engine start. No torch.compile:
    # its start-up would be a large share of runs this short. Measured on the first GPU run (docs/learning.md), SFT
    # with a cosine schedule over 800 steps scored 0.168 at step 160, 0.879 at 320, 0.984 at 574: the climb through
    # 0.2-0.6 takes well under 160 steps. So SFT stops at 400 (every later checkpoint only scored above the mark),
    # with a constant learning rate (the schedule no longer runs out on the climb), and saves every 40 steps so the
    # pick lands inside 0.2-0.6. RL at 5e-5 fell from that start in both tools (TRL's train reward 0.18 -> 0.10 in
    # two steps; rlkit's first update moved the engine's log-probs by up to 0.52 nats): RL runs at 1e-5.
    "gpu": Settings(
        task={"n_train": 20000, "n_test": 256, "min_steps": 2, "max_steps": 4, "max_number": 20, "max_factor": 5,
              "max_value": 200},
        size="large", vocab=1024,
        sft={"data.train_batch_size": 128, "actor.mini_batch_size": 128, "actor.lr": 5e-4, "actor.warmup_steps": 20,
             "actor.lr_schedule": "constant", "data.max_prompt_length": 160, "data.max_response_length": 160,
             "model.compile": "false"},
        sft_steps=400, sft_save_freq=40, prompts=32, samples=8, response_length=128, rl_lr=1e-5, rl_steps=200,
        val_freq=5,
        extra=["rollout.vllm.enforce_eager=true", "model.compile=false", "rollout.gpu_memory_utilization=0.3",
               # The step-1 invariants and the weight-sync check warn instead of stopping the run: this model's
               # bf16 engine-vs-trainer gap was never measured, and one stopped run would cost the whole GPU call.
               # The gap is still logged (rollout/log_prob_diff) and a broken sync would show as a flat curve.
               "trainer.invariants=warn", "rollout.sync_check=warn"]),
    # --sft-plateau on a GPU: the task above plateaued near 1.0 (0.984 after 574 SFT steps, docs/learning.md), where
    # RL from the plateau has nothing left to show. Longer chains (3-5 calculations), larger numbers and results,
    # twice the SFT steps with a checkpoint every 80 (each one scored: the curve the plateau is read from), longer
    # responses. NOT YET RUN on a GPU: the plateau's height and step are unknown.
    "gpu-hard": Settings(
        task={"n_train": 40000, "n_test": 256, "min_steps": 3, "max_steps": 5, "max_number": 50, "max_factor": 9,
              "max_value": 999},
        size="large", vocab=1024,
        sft={"data.train_batch_size": 128, "actor.mini_batch_size": 128, "actor.lr": 5e-4, "actor.warmup_steps": 20,
             "actor.lr_schedule": "constant", "data.max_prompt_length": 192, "data.max_response_length": 224,
             "model.compile": "false"},
        sft_steps=800, sft_save_freq=80, prompts=32, samples=8, response_length=224, rl_lr=1e-5, rl_steps=40,
        val_freq=5,
        extra=["rollout.vllm.enforce_eager=true", "model.compile=false", "rollout.gpu_memory_utilization=0.3",
               "trainer.invariants=warn", "rollout.sync_check=warn"]),
    # The same pipeline on 2 CPU cores in about 2 minutes (no learning expected at this size and length). Each
    # run's worker is an object in its CLI process (trainer.workers=in_process): no Ray cluster to start per run;
    # the RL runs generate with the transformers engine, which starts in a second where vLLM's imports and
    # engine take ~10 s of each short run.
    "tiny": Settings(
        task={"n_train": 2000, "n_test": 16, "min_steps": 2, "max_steps": 2, "max_number": 9, "max_factor": 3,
              "max_value": 50},
        size="tiny", vocab=512,
        sft={"data.train_batch_size": 16, "actor.mini_batch_size": 16, "actor.lr": 3e-3,
             "data.max_prompt_length": 128, "data.max_response_length": 64, "actor.micro_batch_tokens": 8192,
             "trainer.workers": "in_process", "trainer.device": "cpu"},
        sft_steps=4, sft_save_freq=2, prompts=4, samples=4, response_length=48, rl_lr=3e-4, rl_steps=2, val_freq=1,
        extra=["actor.micro_batch_tokens=8192", "reward.num_workers=1", "trainer.workers=in_process",
               "trainer.device=cpu", "rollout.name=hf"]),
}

# The RL runs, in the default order: with --gpus 2, run i goes to GPU i % 2 (rlkit GRPO and TRL side by side).
RUNS = ("rlkit-grpo", "trl-grpo", "rlkit-ppo", "rlkit-dapo")
# Seconds a run stopped at its deadline may take to stop (Bench.run); a lane's last run leaves it inside the budget.
STOP_GRACE_S = 30


# The SFT checkpoint RL starts from is the latest whose greedy test score is at most this (issue: a middling
# score, 20-60%): a model that already solves most problems leaves the curves nothing to show.
SFT_MAX_SCORE = 0.6
