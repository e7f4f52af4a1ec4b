"""What the Iceberg sink needs of its tables besides committing: comparing a batch's schema
with the table's, and surviving concurrent first runs that race to create the catalog's tables,
the namespace or the table (the losers load what the winner created).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

#: Attempts at opening a new SQL catalog / creating a namespace and table that concurrent
#: first runs race to create.
CREATE_ATTEMPTS = 3
T = TypeVar("T")


def after_creation_races(call: Callable[[], T]) -> T:
    """``call``, again (up to ``CREATE_ATTEMPTS`` in all) while it fails only because a
    concurrent first writer created the catalog's tables, the namespace or the table: the
    next attempt loads what the winner created. Any other error is raised at once.
    """
    retrying = Retrying(
        retry=retry_if_exception(lost_creation_race),
        stop=stop_after_attempt(CREATE_ATTEMPTS),
        wait=wait_random(0, 0.05),
        reraise=True,
    )
    return retrying(call)


def _shape(kind: IcebergType) -> str:
    """A type without its field ids, to compare schemas across tables."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(kind, StructType):
        return "struct<" + ", ".join(f"{f.name}: {_shape(f.field_type)}" for f in kind.fields) + ">"
    if isinstance(kind, ListType):
        return f"list<{_shape(kind.element_type)}>"
    if isinstance(kind, MapType):
        return f"map<{_shape(kind.key_type)}, {_shape(kind.value_type)}>"
    return str(kind)


def lost_creation_race(exc: BaseException) -> bool:
    """Whether creating a catalog's tables, a namespace or a table failed only because another
    writer created it first (then loading it succeeds).
    """
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
    from sqlalchemy.exc import IntegrityError, OperationalError

    if isinstance(exc, TableAlreadyExistsError | NamespaceAlreadyExistsError | IntegrityError):
        return True
    return isinstance(exc, OperationalError) and "already exists" in str(exc)


def schema_mismatch(table: Schema, batch: Schema) -> str | None:
    """Why a batch with schema ``batch`` cannot go into a table with ``table``; None if it can."""
    have = {f.name: f for f in table.fields}
    got = {f.name: f for f in batch.fields}
    problems = []
    if missing := [name for name in have if name not in got]:
        problems.append(f"batch lacks columns {missing}")
    if extra := [name for name in got if name not in have]:
        problems.append(f"table has no columns {extra}")
    changed = [
        f"{name} {_shape(have[name].field_type)} vs {_shape(got[name].field_type)}"
        for name in have.keys() & got.keys()
        if _shape(have[name].field_type) != _shape(got[name].field_type)
    ]
    if changed:
        problems.append(f"types differ (table vs batch): {sorted(changed)}")
    nullable = [n for n in have.keys() & got.keys() if have[n].required and not got[n].required]
    if nullable:
        problems.append(f"columns {sorted(nullable)} are required in the table, nullable here")
    return "; ".join(problems) or None
