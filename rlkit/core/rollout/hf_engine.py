"""transformers `generate` as the rollout engine: slower, but needs nothing beyond transformers."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rlkit.core.rollout import base
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt, request_seed

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HFEngine(RolloutEngine):
    def __init__(self, model_path: str, *, dtype: str, device: torch.device, batch_size: int = 512) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.device, self.batch_size = device, batch_size
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_DTYPES[dtype]).to(device).eval()
        gen_config = GenerationConfig.from_model_config(self.model.config)
        eos = gen_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        pad = self.model.config.pad_token_id
        self.pad_id = pad if pad is not None else next(iter(self.eos_ids))

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        # Request k is sample j of prompt i with k = i * n + j, seeded by request_seed.
        limits = limits_per_prompt(prompts, sampling, token_limits)
        requests = [(i, prompt, limits[i]) for i, prompt in enumerate(prompts) for _ in range(sampling.n)]
        seeds = [request_seed(sampling, i, j) for i in range(len(prompts)) for j in range(sampling.n)]
        samples: list[RolloutSample] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            samples += self._generate_chunk(chunk, seeds[start : start + self.batch_size], sampling)
        return samples

    def _generate_chunk(
        self, requests: list[tuple[int, list[int], int]], seeds: list[int], sampling: Sampling
    ) -> list[RolloutSample]:
        width = max(len(p) for _, p, _ in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (_, prompt, _) in enumerate(requests):  # left padding: generation continues at the right edge
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        sampler = _SeededSampler(sampling, seeds, self.device)
        # ignore_eos as vLLM and SGLang mean it: EOS may be sampled and generation goes on past it. No stop
        # tokens rather than generate's min_new_tokens, which would take EOS out of the sampled distribution
        # (and so out of the log-probs).
        stop_ids = [] if sampling.ignore_eos else list(self.eos_ids)
        # Greedy decoding of the sampler's one-token distributions: generate draws no random
        # number itself, so the worker's global RNG is left alone.
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max(limit for _, _, limit in requests),  # a row is cut at its own limit below
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            logits_processor=LogitsProcessorList([sampler]),
            pad_token_id=self.pad_id,
            eos_token_id=stop_ids,
            return_dict_in_generate=True,
        )
        new_tokens = out.sequences[:, width:].cpu()
        chosen = sampler.log_probs().cpu()
        samples = []
        for row, ((prompt_index, _, limit), seed) in enumerate(zip(requests, seeds)):
            tokens = new_tokens[row, :limit].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in stop_ids), len(tokens))
            log_probs = chosen[row, :end].tolist() if base.returns_log_probs(sampling, seed) else []
            finished = end < len(tokens) or tokens[end - 1] in stop_ids
            samples.append(RolloutSample(prompt_index, tokens[:end], log_probs, finished))
        return samples

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        out = []
        for seq in sequences:
            ids = torch.tensor([seq], device=self.device)
            log_probs = self.model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            picked = log_probs.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
            out.append(picked[prompt_len - 1 :].tolist())
        return out

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name in params:
                params[name].copy_(tensor.to(params[name].dtype))


class _SeededSampler(LogitsProcessor):
    """Draws each row's next token from its own generator and records that token's log-prob.

    Row r has a ``torch.Generator`` seeded with its request's seed, so a sample depends only on
    its seed and its prompt, not on which other requests share the batch, and the worker's
    global RNG is never touched. The processor applies temperature/top-k/top-p itself, draws
    the token, and returns scores that leave only that token possible, which ``generate``
    (called greedy, after its own processors such as ``min_new_tokens``) then takes. It keeps
    the chosen tokens' log-probs, not every step's scores ([B, steps, V]: tens of GB for a 150k
    vocabulary).
    """

    def __init__(self, sampling: Sampling, seeds: Iterable[int], device: torch.device) -> None:
        self.sampling = sampling
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        self.chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = self._warp(scores)
        log_probs = scores.float().log_softmax(-1)
        if self.sampling.greedy:
            tokens = log_probs.argmax(-1, keepdim=True)
        else:
            probs = log_probs.exp()
            tokens = torch.cat(
                [torch.multinomial(row, 1, generator=gen) for row, gen in zip(probs, self.generators, strict=True)]
            )
            tokens = tokens.unsqueeze(-1)
        self.chosen.append(log_probs.gather(-1, tokens).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)

    def _warp(self, scores: torch.Tensor) -> torch.Tensor:
        sampling = self.sampling
        if sampling.greedy:
            return scores
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
        return scores

    def log_probs(self) -> torch.Tensor:
        """[B, steps]: the log-prob of each token drawn, under the distribution it was drawn from."""
        return torch.stack(self.chosen, dim=1)
