"""Persistence: sessions and messages (SQLAlchemy async), schema owned by Alembic (migrations/)."""
from app.store.store import Store

__all__ = ["Store"]
