"""Scripts that run ON the host, under the host's own Python, and the launcher that sends them.

Each script in this package is self-contained and uses the standard library only (the host may have
nothing else, and ``import sglang`` is slow or broken on a ``--no-deps`` install). The launcher sends
the script's source inside the command line, so one operation = one exec channel, no SFTP.
"""
