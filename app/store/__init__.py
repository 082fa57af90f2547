"""Persistence: sessions and messages (SQLAlchemy async), schema owned by Alembic (migrations/)."""

from app.store.store import Conflict, Store

__all__ = ["Conflict", "Store"]
