"""Fault injection for airflow-finalckpt: named fault points, fault-injecting proxies, a fake
pipeline, a verifier and a randomized campaign (``python -m faults.campaign``),
also on branching graphs whose stages run at the same time (``concurrent``, ``shapes``).

See docs/guarantees.md for what the campaign checks and what it has shown.
"""

from __future__ import annotations

from faults.injector import FaultInjector, FaultSpec, InjectedFault
from faults.points import POINTS, RUNTIME_POINTS, Action, FaultPoint, Layer

__all__ = [
    "POINTS",
    "RUNTIME_POINTS",
    "Action",
    "FaultInjector",
    "FaultPoint",
    "FaultSpec",
    "InjectedFault",
    "Layer",
]
