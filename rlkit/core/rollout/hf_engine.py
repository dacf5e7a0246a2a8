"""transformers `generate` as the rollout engine: slower, but needs nothing beyond transformers."""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HFEngine(RolloutEngine):
    def __init__(self, model_path: str, *, dtype: str, device: torch.device, batch_size: int = 512) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.device, self.batch_size = device, batch_size
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_DTYPES[dtype]).to(device).eval()
        gen_config = GenerationConfig.from_model_config(self.model.config)
        eos = gen_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else next(iter(self.eos_ids))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        requests = [(i, prompt) for i, prompt in enumerate(prompts) for _ in range(sampling.n)]
        samples: list[RolloutSample] = []
        torch.manual_seed(sampling.seed)
        for start in range(0, len(requests), self.batch_size):
            samples += self._generate_chunk(requests[start:start + self.batch_size], sampling)
        return samples

    def _generate_chunk(self, requests: list[tuple[int, list[int]]], sampling: Sampling) -> list[RolloutSample]:
        width = max(len(p) for _, p in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (_, prompt) in enumerate(requests):  # left padding: generation continues at the right edge
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        recorder = _WarpAndRecord(sampling)
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=sampling.max_tokens,
            min_new_tokens=sampling.max_tokens if sampling.ignore_eos else None, do_sample=not sampling.greedy,
            temperature=1.0, top_p=1.0, top_k=None, logits_processor=LogitsProcessorList([recorder]),
            pad_token_id=self.pad_id, eos_token_id=list(self.eos_ids), return_dict_in_generate=True)
        new_tokens = out.sequences[:, width:]
        chosen = recorder.finish(new_tokens[:, -1]).cpu()
        new_tokens = new_tokens.cpu()
        samples = []
        for row, (prompt_index, _) in enumerate(requests):
            tokens = new_tokens[row].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
            log_probs = chosen[row, :end].tolist() if sampling.log_probs else []
            samples.append(RolloutSample(prompt_index, tokens[:end], log_probs,
                                         finished=end < len(tokens) or tokens[end - 1] in self.eos_ids))
        return samples

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        out = []
        for seq in sequences:
            ids = torch.tensor([seq], device=self.device)
            log_probs = self.model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            picked = log_probs.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
            out.append(picked[prompt_len - 1:].tolist())
        return out

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name in params:
                params[name].copy_(tensor.to(params[name].dtype))


class _WarpAndRecord(LogitsProcessor):
    """Applies temperature/top-k/top-p itself and records the log-prob of each sampled token.

    transformers runs user processors before its own warpers, so this one does the warping
    (generate is called with neutral warper settings) and sees the distribution actually
    sampled from. It keeps one step's log-softmax [B, V] and reads the token chosen from it
    at the next call, instead of keeping every step's scores ([B, steps, V]: tens of GB
    for a 150k vocabulary).
    """

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.previous: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self._record(input_ids[:, -1])
        sampling = self.sampling
        if not sampling.greedy:
            scores = scores / sampling.temperature
            if sampling.top_k > 0:
                kth = scores.topk(min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if sampling.top_p < 1.0:
                ordered, order = scores.sort(dim=-1, descending=True)
                # Drop a token once the tokens before it already hold top_p of the mass.
                probs = ordered.softmax(-1)
                drop_sorted = probs.cumsum(-1) - probs > sampling.top_p
                drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
                scores = scores.masked_fill(drop, float("-inf"))
        self.previous = scores.float().log_softmax(-1)
        return scores

    def _record(self, tokens: torch.Tensor) -> None:
        self.chosen.append(self.previous.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs, once the last step's tokens are known."""
        self._record(last_tokens)
        return torch.stack(self.chosen, dim=1)
