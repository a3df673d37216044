"""The memory operations both interfaces (REST and MCP) call: one core, thin adapters."""
