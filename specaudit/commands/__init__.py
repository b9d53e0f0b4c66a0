"""One module per `specaudit` subcommand; see specaudit/cli.py for the contract."""
