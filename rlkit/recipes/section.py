"""The base of every section of a run's config: unknown keys are errors, and a validated config is never
changed (frozen): a value resolved later makes a copy (`with_resolved_budget`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
