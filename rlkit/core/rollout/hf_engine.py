"""transformers `generate` as the rollout engine: slower, but needs nothing beyond transformers."""

from __future__ import annotations

from typing import Iterable

import torch

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HFEngine(RolloutEngine):
    def __init__(self, model_path: str, *, dtype: str, device: torch.device, batch_size: int = 256) -> None:
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
        kwargs = dict(do_sample=False) if sampling.greedy else dict(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else None)
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=sampling.max_tokens,
            pad_token_id=self.pad_id, eos_token_id=list(self.eos_ids), return_dict_in_generate=True,
            output_scores=True, **kwargs)
        new_tokens = out.sequences[:, width:].cpu()
        # Scores are the processed logits (temperature, top-p/k applied): the distribution sampled from.
        log_probs = torch.stack(out.scores, dim=1).float().log_softmax(-1)
        chosen = log_probs.gather(-1, new_tokens.to(log_probs.device).unsqueeze(-1)).squeeze(-1).cpu()
        samples = []
        for row, (prompt_index, _) in enumerate(requests):
            tokens = new_tokens[row].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
            samples.append(RolloutSample(prompt_index, tokens[:end], chosen[row, :end].tolist(),
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
