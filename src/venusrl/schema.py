"""Base class of every config section: unknown keys and bad values are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section. Subclasses live next to the component they configure."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
