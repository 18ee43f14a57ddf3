"""What every layer stands on: settings, the database and its unit of work, the ORM
base, the broker, the embedded servers, the file store and the stream door's logs."""
