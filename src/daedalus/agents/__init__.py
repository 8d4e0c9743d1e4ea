"""Coding agents: one interface (`CodingAgent.run(task) -> AgentResult`), several providers."""
