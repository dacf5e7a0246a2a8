"""`rlkit eval-reward`: score responses to a dataset and summarise what the reward did."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rlkit.core.rewards.scoring import RewardScorer
from rlkit.errors import UserError
from rlkit.recipes.reward_schema import RewardConfig

_TAIL_CHARS = 200  # how much of a response an example shows
NO_REASON = "scored 0: the reward gave no reason"  # a dict reward's "reason" key gives one


def response_reason(score: float, details: dict[str, float], reason: str | None) -> str | None:
    """Why a response scored what it did: the scorer's reason (the reward's own "reason" key, a failed call,
    an unusable score); for a 0 without one, what an answer-extracting rule's answer_found says; else None."""
    if reason or score != 0.0:
        return reason
    found = details.get("answer_found")
    if found == 0.0:
        return "no answer extracted: the response holds no answer in the form the rule reads"
    if found == 1.0:
        return "wrong answer: the extracted answer is not the ground truth"
    return NO_REASON


def reason_kind(reason: str) -> str:
    """A reason's kind, the text before its first ': ' (`timeout`, `no answer extracted`, ...)."""
    return reason.split(": ", 1)[0]


def read_responses(path: str | Path, num_rows: int, *, first_only: bool = False) -> list[list[str]]:
    """Responses per data row from a jsonl file: each line a JSON string, {"response": str}
    or {"responses": [str, ...]} (the same count on every line); blank lines are skipped.
    `first_only` (--limit): the first `num_rows` lines, the file may hold more."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"responses file {path} does not exist")
    per_row: list[list[str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}, line {number}: not valid JSON ({exc})") from None
        if isinstance(value, dict):
            value = value.get("responses", value.get("response"))
        texts = value if isinstance(value, list) else [value]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise UserError(
                f'{path}, line {number}: expected a JSON string, {{"response": "..."}} or {{"responses": ["...", ...]}}'
            )
        if per_row and len(texts) != len(per_row[0]):
            raise UserError(
                f"{path}, line {number}: {len(texts)} responses, but line 1 has {len(per_row[0])}; "
                "every line needs the same number"
            )
        per_row.append(texts)
        if first_only and len(per_row) == num_rows:
            break
    if len(per_row) != num_rows and first_only:
        raise UserError(f"--limit asks for {num_rows} rows but {path} has {len(per_row)} response lines; lower --limit")
    if len(per_row) != num_rows:
        raise UserError(
            f"the data has {num_rows} rows but {path} has {len(per_row)} response lines; "
            "it needs one line per data row, in the same order"
        )
    return per_row


def sample_responses(
    model_path: str, rows: list[dict[str, Any]], *, n: int, max_new_tokens: int, temperature: float, seed: int
) -> list[list[str]]:
    """n sampled responses per row from the model at `model_path` (transformers engine, CPU or GPU)."""
    import torch
    from transformers import AutoTokenizer

    from rlkit.core.data.dataset import tokenize_prompt
    from rlkit.core.rollout.base import Sampling
    from rlkit.core.rollout.engines import make_engine
    from rlkit.recipes.rollout_schema import RolloutConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except OSError as exc:
        raise UserError(f"--model {model_path}: cannot load a tokenizer ({exc})") from None
    prompts = [tokenize_prompt(tokenizer, row["prompt"]) for row in rows]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    engine = make_engine(
        RolloutConfig(name="hf"),
        model_path,
        max_model_len=max(map(len, prompts)) + max_new_tokens,
        dtype="float32",
        seed=seed,
        device=device,
        sleep_mode=False,
    )
    sampling = Sampling(n=n, max_tokens=max_new_tokens, temperature=temperature, seed=seed, greedy=temperature == 0)
    responses: list[list[str]] = [[] for _ in rows]
    for sample in engine.generate(prompts, sampling):
        responses[sample.prompt_index].append(tokenizer.decode(sample.token_ids, skip_special_tokens=True))
    return responses


def _histogram(scores: list[float]) -> list[dict[str, float]]:
    """Counts per distinct score when there are at most 10, else 10 equal-width bins."""
    distinct = Counter(scores)
    if len(distinct) <= 10:
        return [{"low": s, "high": s, "count": c} for s, c in sorted(distinct.items())]
    low, high = min(scores), max(scores)
    width = (high - low) / 10
    counts = Counter(min(int((s - low) / width), 9) for s in scores)
    return [{"low": low + i * width, "high": low + (i + 1) * width, "count": counts[i]} for i in range(10)]


def _reason_examples(
    flat: list[tuple[int, str]], scores: list[float], reasons: list[str | None], per_kind: int
) -> list[dict[str, Any]]:
    """Up to `per_kind` responses of each reason kind, in row order: row, response (its number in the row), score,
    reason and the response's end."""
    shown: Counter[str] = Counter()
    examples, number = [], Counter()
    for (row, text), score, reason in zip(flat, scores, reasons, strict=True):
        number[row] += 1
        if reason and shown[reason_kind(reason)] < per_kind:
            shown[reason_kind(reason)] += 1
            examples.append(
                {
                    "row": row,
                    "response": number[row] - 1,
                    "score": score,
                    "reason": reason,
                    "response_tail": text[-_TAIL_CHARS:],
                }
            )
    return examples


def evaluate(
    rows: list[dict[str, Any]], responses: list[list[str]], config: RewardConfig, *, examples: int = 3
) -> dict[str, Any]:
    """Score every response and summarise: mean, accuracy, histogram, extraction failures, errors and
    invalid scores (with examples), each response's reason (response_reason) and a count per reason kind,
    timing, and each row's scores and reasons (`per_row`, in response order)."""
    flat = [(i, text) for i, texts in enumerate(responses) for text in texts]
    ground_truths = [str((row.get("reward_model") or {}).get("ground_truth", "")) for row in rows]
    extra_infos = [dict(row.get("extra_info") or {}) for row in rows]
    start = time.perf_counter()
    with RewardScorer(config) as scorer:
        scored = scorer.score(
            [text for _, text in flat],
            [str(rows[i]["data_source"]) for i, _ in flat],
            [ground_truths[i] for i, _ in flat],
            [extra_infos[i] for i, _ in flat],
        )
    seconds = time.perf_counter() - start
    scores = scored.scores
    reasons = [response_reason(*r) for r in zip(scores, scored.details, scored.reasons, strict=True)]
    binary = all(0.0 <= s <= 1.0 for s in scores)
    not_found = [k for k, d in enumerate(scored.details) if d.get("answer_found") == 0.0]
    reports_extraction = any("answer_found" in d for d in scored.details)
    n = max(len(texts) for texts in responses) if responses else 0
    report: dict[str, Any] = {
        "rows": len(rows),
        "responses_per_row": n,
        "scored": len(scores),
        "mean_score": sum(scores) / len(scores) if scores else None,
        "accuracy": sum(s >= 1.0 for s in scores) / len(scores) if scores and binary else None,
        "histogram": _histogram(scores) if scores else [],
        "extraction_failures": len(not_found) if reports_extraction else None,
        "extraction_failure_examples": [
            {"row": flat[k][0], "ground_truth": ground_truths[flat[k][0]], "response_tail": flat[k][1][-_TAIL_CHARS:]}
            for k in not_found[:examples]
        ],
        "errors": len(scored.errors),
        "error_examples": scored.errors[:examples],
        "invalid": len(scored.invalid),
        "invalid_examples": scored.invalid[:examples],
        "reasons": dict(Counter(reason_kind(r) for r in reasons if r).most_common()),
        "reason_examples": _reason_examples(flat, scores, reasons, examples),
        "seconds_per_call_mean": scored.metrics.get("reward/call_seconds_mean"),
        "seconds_per_call_max": scored.metrics.get("reward/call_seconds_max"),
        "seconds_total": seconds,
        "metrics": scored.metrics,
        "per_row": [
            {"row": i, "ground_truth": ground_truths[i], "scores": [], "reasons": []} for i in range(len(rows))
        ],
    }
    for (i, _), score, reason in zip(flat, scores, reasons, strict=True):
        report["per_row"][i]["scores"].append(score)
        report["per_row"][i]["reasons"].append(reason)
    if n > 1 and binary:
        by_row = Counter(flat[k][0] for k, s in enumerate(scores) if s >= 1.0)
        report[f"pass@{n}"] = len(by_row) / len(rows)
    return report
