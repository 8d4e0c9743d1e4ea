"""The base every Daedalus schema shares: strict about unknown fields, immutable once built."""

from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """A frozen pydantic model that rejects unknown fields, so a typo in a spec is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def changed(self, **changes: Any) -> Self:
        """A copy with `changes`, validated as the model's own fields are: a misspelt field or a value of the
        wrong type raises here (pydantic's `model_copy(update=...)` would store either silently)."""
        return self.model_validate({**dict(self), **changes})


class SpecModel(Model):
    """A model a person files (a ticket or training-run spec and its parts): numbers must be finite.

    NaN and infinity pass every `gt`/`le` bound in surprising ways and overflow `timedelta`, so they are
    refused where they enter, not where they break a workflow task.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
