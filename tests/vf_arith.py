"""A verifiers 0.4 taskset for the tests, importable by its id `vf_arith` (verifiers' installed-environment
convention): four one-digit sums; a rubric of two weighted rewards and a metric."""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["ArithTaskset"]


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=2.0)
    async def correct(self, task, trace) -> float:
        return 1.0 if trace.last_reply == task.answer else 0.0

    @vf.reward(weight=0.5)
    async def brief(self, trace) -> float:
        # The guard's test: a rubric that raises. Three characters, so that a tiny model's sampled reply, which
        # the end-to-end test scores with this rubric, is not it by chance (a one-character "?" once was).
        if trace.last_reply == "???":
            raise ValueError("the rubric broke")
        return 1.0 if len(trace.last_reply) <= 1 else 0.0

    @vf.metric
    async def replies(self, trace) -> float:
        return float(trace.num_turns)


class ArithTaskset(vf.Taskset[ArithTask]):
    def load(self):
        for a in range(4):
            yield ArithTask(ArithData(prompt=f"{a}+1=", answer=str(a + 1)))
