"""lessons, campaigns and campaign cells

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lessons",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("subject_kind", sqltypes.AutoString(), nullable=False),
        sa.Column("subject", sqltypes.AutoString(), nullable=False),
        sa.Column("kind", sqltypes.AutoString(), nullable=False),
        sa.Column("text", sqltypes.AutoString(), nullable=False),
        sa.Column("source", sqltypes.AutoString(), nullable=False),
        sa.Column("recorded_by", sqltypes.AutoString(), nullable=False),
        sa.Column("recorded_at", sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("subject_kind", "subject", "text", name="uq_lesson_subject_text"),
    )
    with op.batch_alter_table("lessons", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lessons_subject_kind"), ["subject_kind"], unique=False)
        batch_op.create_index(batch_op.f("ix_lessons_subject"), ["subject"], unique=False)
        batch_op.create_index(batch_op.f("ix_lessons_recorded_at"), ["recorded_at"], unique=False)

    op.create_table(
        "campaigns",
        sa.Column("campaign_id", sqltypes.AutoString(), nullable=False),
        sa.Column("title", sqltypes.AutoString(), nullable=False),
        sa.Column("host", sqltypes.AutoString(), nullable=False),
        sa.Column("engine", sqltypes.AutoString(), nullable=False),
        sa.Column("model", sqltypes.AutoString(), nullable=False),
        sa.Column("status", sqltypes.AutoString(), nullable=False),
        sa.Column("started_at", sqltypes.UTCDateTime(), nullable=False),
        sa.Column("updated_at", sqltypes.UTCDateTime(), nullable=False),
        sa.Column("finished_at", sqltypes.UTCDateTime(), nullable=True),
        sa.Column("proposal", sqltypes.AutoString(), nullable=True),
        sa.Column("proposal_reason", sqltypes.AutoString(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("campaign_id"),
    )
    with op.batch_alter_table("campaigns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_campaigns_status"), ["status"], unique=False)

    op.create_table(
        "campaign_cells",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sqltypes.AutoString(), nullable=False),
        sa.Column("cell", sqltypes.AutoString(), nullable=False),
        sa.Column("preset", sqltypes.AutoString(), nullable=False),
        sa.Column("label", sqltypes.AutoString(), nullable=False),
        sa.Column("axes", sa.JSON(), nullable=False),
        sa.Column("outcome", sqltypes.AutoString(), nullable=False),
        sa.Column("decode_tps", sa.Float(), nullable=True),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("cv", sa.Float(), nullable=True),
        sa.Column("samples", sa.JSON(), nullable=False),
        sa.Column("method", sqltypes.AutoString(), nullable=False),
        sa.Column("kib_per_token", sa.Float(), nullable=True),
        sa.Column("needle_found", sa.Integer(), nullable=True),
        sa.Column("needle_total", sa.Integer(), nullable=True),
        sa.Column("needle_lower", sa.Float(), nullable=True),
        sa.Column("garbage", sqltypes.AutoString(), nullable=False),
        sa.Column("ppl_delta_pct", sa.Float(), nullable=True),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("detail", sqltypes.AutoString(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("measured_at", sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("campaign_id", "cell", name="uq_campaign_cell"),
    )
    with op.batch_alter_table("campaign_cells", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_campaign_cells_campaign_id"), ["campaign_id"], unique=False)


def downgrade() -> None:
    op.drop_table("campaign_cells")
    op.drop_table("campaigns")
    op.drop_table("lessons")
