"""What serves the app beyond its tabs: the named endpoints (`api`), MCP tools, the endpoint guard and the
first-start page."""
