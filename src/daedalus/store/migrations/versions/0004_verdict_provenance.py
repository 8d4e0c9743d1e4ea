"""verdicts keep what re-deriving them needs: the gate spec, the measurement, its provenance and evidence

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verdicts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("unit", sqltypes.AutoString(), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("rounds_needed", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("standard_error", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("error_dof", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("gate_spec", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("measurement", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("provenance", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("evidence", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("verdicts", schema=None) as batch_op:
        for column in (
            "evidence", "provenance", "measurement", "gate_spec", "error_dof", "standard_error", "rounds_needed",
            "unit",
        ):  # fmt: skip
            batch_op.drop_column(column)
