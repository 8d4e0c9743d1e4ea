"""Alembic environment: runs on the connection `daedalus.store.database.migrate` hands over."""

from alembic import context
from sqlmodel import SQLModel

import daedalus.store.tables  # noqa: F401  (registers the tables on SQLModel.metadata)

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=SQLModel.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
