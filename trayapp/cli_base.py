"""What every command module shares: the exit statuses and the bad-usage error.

Kept apart so that ``cli`` (parsing, dispatch) and ``cli_jobs`` (the job commands) both import
it and not each other.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_ENGINE = 0, 1, 2, 3


class UsageError(Exception):
    """Bad usage or bad input: one line, exit status 2."""
