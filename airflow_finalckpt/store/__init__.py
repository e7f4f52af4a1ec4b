"""The coordination store: schema, migrations, engines, and every SQL statement."""
