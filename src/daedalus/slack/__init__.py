"""Slack: decision requests posted as Block Kit messages, and button clicks turned into decisions."""
