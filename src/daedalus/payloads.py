"""Daedalus's Temporal data converter: temporalio's pydantic JSON converter, its parts built once per process.

temporalio builds a payload converter (its class, called with no arguments) for every workflow activation it
decodes and every completion it encodes; the pydantic one builds a schema serializer and a type-adapter cache
each time, which was 5% of the control worker's Python time in a burst of decisions (py-spy `--gil`). The parts
keep no per-use state but that cache (a `functools.lru_cache`, safe across threads), so every converter the SDK
builds shares one set. Payloads are byte for byte those of `temporalio.contrib.pydantic.pydantic_data_converter`.
"""

from __future__ import annotations

from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter

_PARTS = tuple(PydanticPayloadConverter().converters.values())


class SharedPydanticPayloadConverter(PydanticPayloadConverter):
    def __init__(self) -> None:
        CompositePayloadConverter.__init__(self, *_PARTS)


DATA_CONVERTER = DataConverter(payload_converter_class=SharedPydanticPayloadConverter)
"""What every client and worker of Daedalus converts payloads with."""
