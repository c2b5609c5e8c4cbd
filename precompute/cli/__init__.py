"""The `precompute` command line: each subcommand delegates to the package that does the work."""
