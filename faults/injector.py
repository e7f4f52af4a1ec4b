"""Fault specifications and the injector that fires them.

A :class:`FaultSpec` names a point, an action, optionally a stage, and which hit of the point
fires it (``nth``). The :class:`FaultInjector` counts hits as the proxies and the runner report
them and fires each spec once. Before a fault fires it is appended to the injector's event file
(one JSON line, flushed), so a SIGKILL cannot hide what happened.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faults.points import Action, point

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """The exception of a ``raise`` fault."""


@dataclass(frozen=True)
class FaultSpec:
    point: str
    action: Action
    stage: str | None = None
    nth: int = 1
    delay_s: float = 0.0
    #: Sink-layer points: fire only in the sink of this kind (``iceberg``, ``delta``...), whose
    #: own hits ``nth`` counts; None: in any sink.
    sink: str | None = None
    #: DELAY only: hold until every ``"<stage>:<state>"`` holds (state ``started`` or
    #: ``finished``, read from the store), for at most ``delay_s``. Orders attempts of stages
    #: running side by side without betting on timing (the concurrent campaign's stragglers).
    until: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        spec = point(self.point)
        if self.action not in spec.actions:
            raise ValueError(
                f"action {self.action.value!r} is not possible at fault point {self.point!r} "
                f"(possible: {', '.join(a.value for a in spec.actions)})"
            )
        if self.nth < 1:
            raise ValueError(f"nth must be >= 1, got {self.nth}")
        if self.until and self.action is not Action.DELAY:
            raise ValueError(f"'until' needs action 'delay', got {self.action.value!r}")
        for condition in self.until:
            stage, _, state = condition.partition(":")
            if not stage or state not in HOLD_STATES:
                raise ValueError(
                    f"'until' condition {condition!r} is not '<stage>:<state>' with state "
                    f"{' or '.join(HOLD_STATES)}"
                )

    def describe(self) -> str:
        where = f"{self.point}@{self.stage}" if self.stage else self.point
        where += f" in sink {self.sink}" if self.sink else ""
        extra = f" {self.delay_s:.2f}s" if self.action is Action.DELAY else ""
        extra += f" until {', '.join(self.until)}" if self.until else ""
        return f"{self.action.value}{extra} at {where} (hit {self.nth})"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["action"] = self.action.value
        for optional in ("sink", "until"):
            if not data[optional]:
                del data[optional]  # the same dict as before these could be set
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultSpec:
        until = tuple(data.get("until", ()))
        return cls(**{**data, "action": Action(data["action"]), "until": until})


#: Lifecycles (``StageLifecycle`` values) that satisfy a hold's ``<stage>:<state>`` condition.
HOLD_STATES: dict[str, frozenset[str]] = {
    "started": frozenset({"RUNNING", "FINISHED", "SUSPENDED", "CLOSED"}),
    "finished": frozenset({"FINISHED", "CLOSED"}),
}
#: How often a hold reads the stages' lifecycles.
HOLD_POLL_S = 0.02


def conditions_hold(until: Iterable[str], lifecycles: Mapping[str, str]) -> bool:
    """Whether every ``"<stage>:<state>"`` condition holds for these stage lifecycles."""
    for condition in until:
        stage, _, state = condition.partition(":")
        if lifecycles.get(stage) not in HOLD_STATES[state]:
            return False
    return True


def _oserror(code: int, where: str) -> OSError:
    return OSError(code, f"{os.strerror(code)} (injected at {where})")


@dataclass
class FaultInjector:
    """Counts hits of fault points and fires the armed specs.

    ``stage`` is the stage currently running in this process; proxies that do not know the
    stage (storage, GC) report hits for it. ``zombie`` is called for ZOMBIE faults with the
    stage id: it must run a newer attempt of that stage to the end and return.
    """

    specs: tuple[FaultSpec, ...] = ()
    events_path: str | None = None
    label: str = ""
    stage: str | None = None
    zombie: Callable[[str], None] | None = None
    lifecycles: Callable[[], Mapping[str, str]] | None = None
    hits: Counter[str] = field(default_factory=Counter)
    #: Hits of sink-layer points per sink kind: ``"<point>@<kind>"``.
    sink_hits: Counter[str] = field(default_factory=Counter)
    fired: list[dict[str, Any]] = field(default_factory=list)
    _stage_hits: Counter[tuple[str, str | None]] = field(default_factory=Counter)
    _sink_hits: Counter[tuple[str, str]] = field(default_factory=Counter)
    _done: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.specs = tuple(self.specs)

    # -- reporting hits ---------------------------------------------------------------------

    def hit(self, name: str, stage: str | None = None, *, sink: str | None = None) -> None:
        """A process passed fault point ``name`` in ``stage`` (default: the current stage),
        in a sink of kind ``sink`` (sink-layer points)."""
        stage = stage if stage is not None else self.stage
        self.hits[name] += 1
        self._stage_hits[(name, stage)] += 1
        if sink is not None:
            self._sink_hits[(name, sink)] += 1
            self.sink_hits[f"{name}@{sink}"] += 1
        for index, spec in enumerate(self.specs):
            if index in self._done or spec.point != name:
                continue
            if spec.stage is not None and spec.stage != stage:
                continue
            if spec.sink is not None and spec.sink != sink:
                continue
            if spec.sink is not None:
                count = self._sink_hits[(name, spec.sink)]
            else:
                count = self._stage_hits[(name, stage)] if spec.stage else self.hits[name]
            if count != spec.nth:
                continue
            self._done.add(index)
            self._fire(spec, stage, sink)

    def runtime_fault(self, stage_id: str) -> Callable[[str], None]:
        """The ``fault`` callback for a StageRunner of ``stage_id``."""
        return lambda name: self.hit(name, stage_id)

    def example_fault(self, stage_id: str, name: str) -> None:
        """The ``fault`` callback of ``run_example_locally`` (stage id, point)."""
        self.stage = stage_id
        self.hit(name, stage_id)

    # -- firing -----------------------------------------------------------------------------

    def _record(self, spec: FaultSpec, stage: str | None, sink: str | None = None) -> None:
        event = {
            **spec.to_dict(),
            "event": "fault",
            "label": self.label,
            "pid": os.getpid(),
            "t": time.time(),
            "in_stage": stage,
        }
        if sink is not None:
            event["in_sink"] = sink
        self.fired.append(event)
        if self.events_path is not None:
            append_event(self.events_path, event)

    def _fire(self, spec: FaultSpec, stage: str | None, sink: str | None = None) -> None:
        self._record(spec, stage, sink)
        where = f"{spec.point} in stage {stage}" if stage else spec.point
        log.info("injecting fault: %s", spec.describe())
        if spec.action is Action.CRASH:
            crash()
        if spec.action is Action.RAISE:
            raise InjectedFault(f"injected fault at {where}")
        if spec.action is Action.EIO:
            raise _oserror(errno.EIO, where)
        if spec.action is Action.ENOSPC:
            raise _oserror(errno.ENOSPC, where)
        if spec.action is Action.DELAY:
            self._delay(spec)
            return
        if spec.action is Action.ZOMBIE:
            if self.zombie is None or stage is None:
                raise InjectedFault(f"zombie fault at {where} but no way to start a new attempt")
            self.zombie(stage)

    def _delay(self, spec: FaultSpec) -> None:
        if not spec.until:
            time.sleep(spec.delay_s)
            return
        if self.lifecycles is None:
            raise InjectedFault(f"{spec.describe()}: this process cannot read stage lifecycles")
        deadline = time.monotonic() + spec.delay_s
        while not conditions_hold(spec.until, self.lifecycles()):
            if time.monotonic() >= deadline:
                log.warning("%s: gave up after %.1f s", spec.describe(), spec.delay_s)
                return
            time.sleep(HOLD_POLL_S)

    def unfired(self) -> list[FaultSpec]:
        return [s for i, s in enumerate(self.specs) if i not in self._done]


def crash() -> None:
    """SIGKILL this process: no handler, no flush, no atexit runs (like a killed worker)."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is delivered asynchronously; never go on meanwhile
    raise AssertionError("SIGKILL did not kill the process")


def append_event(path: str, event: dict[str, Any]) -> None:
    """Append one JSON line; a line written before a SIGKILL is in the file (page cache)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(event, sort_keys=True, default=str) + "\n")
        handle.flush()


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every event of a file; a line cut short (a crash mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    target = Path(path)
    if not target.exists():
        return events
    for line in target.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def specs_from(data: Iterable[dict[str, Any]]) -> tuple[FaultSpec, ...]:
    return tuple(FaultSpec.from_dict(d) for d in data)
