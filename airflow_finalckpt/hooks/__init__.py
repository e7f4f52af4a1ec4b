"""Hooks of airflow-finalckpt."""

from __future__ import annotations

from airflow_finalckpt.hooks.finalckpt import DEFAULT_CONN_ID, FinalCkptHook

__all__ = ["DEFAULT_CONN_ID", "FinalCkptHook"]
