"""Wire schemas (pydantic models only)."""
