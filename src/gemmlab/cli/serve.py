"""``gemmlab mcp``: the MCP server (``gemmlab.mcp``) on stdio or HTTP, until the client leaves or Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys


def run(args) -> int:
    from ..mcp.server import serve

    if not args.http:
        # The stdio transport reads stdin in a worker thread that a KeyboardInterrupt cannot stop, so the
        # first Ctrl-C would only cancel the event loop and leave the process waiting on that read. The
        # server holds no state worth a graceful shutdown: stop at once, with a line saying so.
        def stop(signum, frame):
            print("gemmlab mcp: stopped", file=sys.stderr, flush=True)
            os._exit(0)

        signal.signal(signal.SIGINT, stop)
    try:
        serve(http=args.http, host=args.host, port=args.port)
    except KeyboardInterrupt:
        print("gemmlab mcp: stopped", file=sys.stderr)
    return 0
