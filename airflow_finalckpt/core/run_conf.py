"""The one opt-in of a restore in a DAG run's conf: the stages whose progress may be dropped.

Read by every entry point that starts or checks a restore (the stage operator, the REST route,
the CLI, the DAG-run note listener) with the same parsing, so a value is refused the same way
everywhere.
"""

from __future__ import annotations

from airflow_finalckpt.core.errors import InvalidRunConfError

#: The DAG run conf key naming the stages whose progress may be dropped (the only opt-in).
ALLOW_DROP_STAGES_KEY = "allow_drop_stages"


def parse_allow_drop_stages(value: object) -> tuple[str, ...]:
    """The ``allow_drop_stages`` conf value: a list of stage ids (a single id is accepted);
    anything else is an InvalidRunConfError, never a silent "drop nothing" or "drop all".
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(
        isinstance(i, str) and i.strip() for i in items
    ):
        raise InvalidRunConfError(
            f"{ALLOW_DROP_STAGES_KEY} must be a list of stage ids, e.g. "
            f'{{"{ALLOW_DROP_STAGES_KEY}": ["b"]}}; got {value!r}'
        )
    return tuple(dict.fromkeys(i.strip() for i in items))
