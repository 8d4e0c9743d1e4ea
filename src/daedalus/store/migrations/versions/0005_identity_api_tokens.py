"""api_tokens: API bearer tokens as salted hashes (no plaintext at rest)

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sqltypes.AutoString(), nullable=False),
        sa.Column("person", sqltypes.AutoString(), nullable=False),
        sa.Column("salt", sqltypes.AutoString(), nullable=False),
        sa.Column("digest", sqltypes.AutoString(), nullable=False),
        sa.Column("created_at", sqltypes.UTCDateTime(), nullable=False),
        sa.Column("created_by", sqltypes.AutoString(), nullable=False),
        sa.Column("expires_at", sqltypes.UTCDateTime(), nullable=True),
        sa.Column("revoked_at", sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("token_id"),
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_person"), ["person"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_tokens_person"))
    op.drop_table("api_tokens")
