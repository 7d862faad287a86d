"""moelora's tuned kernel table, `<GPU>.json` (moelora.kernels' bundled configs/, or a mounted kernel-config folder):
the one schema its writers (the tuner, the benchmark's sweep, the merge script) and its readers (the kernels at run
time, the operator when it cuts the table to a model's shape) share.

A table lists launch parameters per problem: the op's K and N, the experts, the adapters' rank, the adapter slots,
the token count M, and the routing kind it was tuned with. An entry's `config` names only the parameters its writer
chose; the rest take the kernel's defaults (moelora.kernels.KernelConfig, whose defaults tests/kernels hold equal
to these). `KernelTable.dump` writes back exactly the keys a table was read with, in the layout the writers use.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

Positive = Annotated[int, Field(ge=1)]
Route = Literal["grouped", "direct"]
# Strict: a JSON float or string where the kernel takes an int is a mistake to report, not to coerce.
_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class KernelTableError(ValueError):
    """A table the schema refuses; the message names the file and each bad field (e.g. `entries[3].config.split_k`)."""


class EntryConfig(BaseModel):
    """The launch parameters of one op (moelora.kernels.KernelConfig's fields, in its order)."""

    model_config = _STRICT

    split_k: Positive = 1
    shrink_block_k: Positive = 64
    shrink_warps: Positive = 4
    shrink_stages: Positive = 3
    expand_block_n: Positive = 128
    expand_warps: Positive = 4
    expand_stages: Positive = 1
    expand_tiles: Positive = 1
    wait_per_block: bool = True
    shrink_maxnreg: Positive | None = None  # None: the compiler's choice
    expand_maxnreg: Positive | None = None
    pdl: bool | None = None  # None: on where the GPU supports it
    one_pass_block_k: Positive = 128
    one_pass_block_n: Positive = 256
    one_pass_warps: Positive = 4
    one_pass_stages: Positive = 2
    one_pass_ctas_per_sm: Positive = 4
    one_pass_max_split: int = Field(0, ge=0)  # 0: up to the kernel's own cap


class TableEntry(BaseModel):
    """One tuned problem and its launch parameters. Sizes are positive: the readers compare them on a log scale."""

    model_config = _STRICT

    k: Positive
    n: Positive
    rank: Positive
    num_experts: Positive
    max_loras: Positive
    m: Positive  # tokens in the batch
    config: EntryConfig
    route: Route = "grouped"  # left out by the writers for grouped routing

    def key(self) -> tuple[int, int, int, int, int, int, str]:
        """What makes an entry unique in a table (the order the writers sort by)."""
        return self.k, self.n, self.num_experts, self.rank, self.max_loras, self.m, self.route


class KernelTable(BaseModel):
    """A whole `<GPU>.json`. `device` and `source` are what the tuner writes (the GPU's name, the runs it came from);
    the readers need only the entries."""

    model_config = _STRICT

    device: str | None = None
    source: str | None = None
    entries: tuple[TableEntry, ...]

    @model_validator(mode="after")
    def _one_config_per_problem(self) -> KernelTable:
        """Two entries for one problem must agree: a reader could not tell which one was meant."""
        seen: dict[tuple[int, int, int, int, int, int, str], int] = {}
        for i, entry in enumerate(self.entries):
            first = seen.setdefault(entry.key(), i)
            if first != i and self.entries[first].config != entry.config:
                raise ValueError(
                    f"entries[{i}] and entries[{first}] tune the same problem (k, n, num_experts, rank, max_loras, "
                    "m, route) with different configs"
                )
        return self

    @classmethod
    def parse(cls, text: str | bytes, *, origin: str) -> KernelTable:
        """The table in `text`; KernelTableError names `origin` (a file or ConfigMap key) and each bad field."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            problems = "; ".join(_message(detail) for detail in error.errors(include_url=False))
            raise KernelTableError(f"{origin}: not a moelora kernel table: {problems}") from None

    def dump(self) -> str:
        """The JSON text the writers write: one-space indent, fields in schema order, only the fields that were set
        (so a table read and dumped again is the same bytes), a final newline."""
        return json.dumps(self.model_dump(mode="json", exclude_unset=True), indent=1) + "\n"


def _message(detail: ErrorDetails) -> str:
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in detail["loc"]).lstrip(".")
    got = detail.get("input")
    shown = f" (got {got!r:.40})" if detail["type"] != "missing" and isinstance(got, str | int | float) else ""
    return f"{where or 'the table'}: {detail['msg']}{shown}"
