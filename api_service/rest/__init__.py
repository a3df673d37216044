"""REST adapter: /api/v1 routes over the memory core."""
