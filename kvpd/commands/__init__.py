"""One module per `kvpd` subcommand; see `kvpd.cli`."""
