"""In-band network telemetry (INT): the reports the sinks export, decoded into hop records."""
