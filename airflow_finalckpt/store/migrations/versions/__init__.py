"""Alembic revision scripts; alembic ignores this file, it only makes the directory a package."""
