"""The backend's database: SQLAlchemy models and Alembic migrations."""
