"""The audit store: SQLModel tables, sessions and queries. Table models never cross the Temporal boundary."""
