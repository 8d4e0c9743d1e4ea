"""audit hash chain: each audit event stores its predecessor's hash and its own

Revision ID: 0002
Revises: 0001
"""

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from daedalus.store.chain import GENESIS, event_hash

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prev_hash", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("hash", sa.String(), nullable=True))
    _chain_existing_events()
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_audit_chain", ["ticket_id", "prev_hash"])


def downgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_constraint("uq_audit_chain", type_="unique")
        batch_op.drop_column("hash")
        batch_op.drop_column("prev_hash")


def _chain_existing_events() -> None:
    """Events written before this revision are chained as they stand now, in the order they were written."""
    connection = op.get_bind()
    events = sa.table(
        "audit_events",
        sa.column("id", sa.Integer),
        sa.column("workflow_id", sa.String),
        sa.column("run_id", sa.String),
        sa.column("seq", sa.Integer),
        sa.column("ticket_id", sa.String),
        sa.column("kind", sa.String),
        sa.column("actor", sa.String),
        sa.column("at", sa.DateTime(timezone=True)),
        sa.column("status", sa.String),
        sa.column("summary", sa.String),
        sa.column("detail", sa.JSON),
        sa.column("prev_hash", sa.String),
        sa.column("hash", sa.String),
    )
    last: dict[str, str] = {}
    rows = connection.execute(sa.select(events).order_by(events.c.id)).mappings().all()
    for row in rows:
        prev = last.get(row["ticket_id"], GENESIS)
        fields: dict[str, Any] = {
            name: row[name]
            for name in ("workflow_id", "run_id", "seq", "ticket_id", "kind", "actor", "status", "summary")
        }
        detail = row["detail"]
        at = row["at"]
        if isinstance(at, str):  # SQLite without a type on the column: ISO text
            at = datetime.fromisoformat(at)
        digest = event_hash(
            prev_hash=prev, at=at, detail=json.loads(detail) if isinstance(detail, str) else detail, **fields
        )
        connection.execute(
            events.update().where(events.c.id == row["id"]).values(prev_hash=prev, hash=digest)
        )
        last[row["ticket_id"]] = digest
