"""The trace database: a SQLite file or a libSQL server, its schema and migrations, and
sessions as rows. Nothing here knows about writers or readers."""
