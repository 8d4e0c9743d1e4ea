"""The base every Daedalus schema shares: strict about unknown fields, immutable once built."""

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """A frozen pydantic model that rejects unknown fields, so a typo in a spec is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True)
