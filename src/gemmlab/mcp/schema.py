"""The MCP tools' types: bounded inputs, and outputs made from the report dataclasses (``out_model``), so a
report's fields and their descriptions are written once, in ``gemmlab.reports``."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, StringConstraints, create_model, field_validator

from ..reports import MAX_CLOCK_MHZ, MAX_DIM, MIN_CLOCK_MHZ, as_dict
from .safety import EXPR_RE, MAX_SOURCE_BYTES, NAME_RE

KernelName = Annotated[str, StringConstraints(pattern=NAME_RE, max_length=97)]
ParamName = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,31}$")]
Config = Annotated[dict[ParamName, Annotated[int, Field(ge=0, le=1_000_000)]], Field(max_length=16)]
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
ClockMHz = Annotated[float, Field(ge=MIN_CLOCK_MHZ, le=MAX_CLOCK_MHZ)]
Arch = Literal["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]
SourceText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SOURCE_BYTES)]
NameExpression = Annotated[str, StringConstraints(pattern=EXPR_RE, max_length=256)]


class Out(BaseModel):
    """Floats to 5 significant digits: the answers are read by a model, not fed to a solver."""

    @field_validator("*", mode="after")
    @classmethod
    def _round(cls, v):
        return float(f"{v:.5g}") if isinstance(v, float) and v == v and abs(v) != float("inf") else v


def _convert(tp):
    """A report field's type with every report dataclass in it replaced by its model."""
    if dataclasses.is_dataclass(tp):
        return out_model(tp)
    origin = typing.get_origin(tp)
    if origin is None or origin is Literal:
        return tp
    args = tuple(_convert(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return Union[args]
    return origin[args]


@functools.cache
def out_model(report_cls) -> type[Out]:
    """The pydantic model of a report dataclass: the same fields and types, each field's ``doc`` as its
    description, floats rounded (``Out``)."""
    hints = typing.get_type_hints(report_cls)
    fields = {}
    for f in dataclasses.fields(report_cls):
        default = f.default if f.default is not dataclasses.MISSING else ...
        fields[f.name] = (_convert(hints[f.name]), Field(default, description=f.metadata.get("doc")))
    text = report_cls.__doc__ or ""
    if text.startswith(report_cls.__name__ + "("):  # the signature dataclasses write where there is no docstring
        text = None
    return create_model(report_cls.__name__, __base__=Out, __doc__=text, **fields)


def out(report) -> Out:
    """A report as its model (what a tool returns)."""
    return out_model(type(report)).model_validate(as_dict(report))
