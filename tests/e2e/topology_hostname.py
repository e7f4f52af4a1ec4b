"""The ``[core] hostname_callable`` of the topology tier's Celery workers: each worker "pod"
reports its own name (``FINALCKPT_TOPOLOGY_POD``) as a pod's hostname would, so the task
instances' ``hostname`` tells the two workers apart on one machine."""

from __future__ import annotations

import os
import socket


def pod_hostname() -> str:
    return os.environ.get("FINALCKPT_TOPOLOGY_POD") or socket.getfqdn()
