"""PostgreSQL: many worker hosts against one database."""
