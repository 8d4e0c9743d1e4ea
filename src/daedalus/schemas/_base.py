"""The base every Daedalus schema shares: strict about unknown fields, immutable once built."""

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """A frozen pydantic model that rejects unknown fields, so a typo in a spec is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecModel(Model):
    """A model a person files (a ticket or training-run spec and its parts): numbers must be finite.

    NaN and infinity pass every `gt`/`le` bound in surprising ways and overflow `timedelta`, so they are
    refused where they enter, not where they break a workflow task.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
