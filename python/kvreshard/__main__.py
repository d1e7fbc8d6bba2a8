"""python -m kvreshard COMMAND ...

Commands:

  demo    pages written by TP1/PP3 writer processes, read by TP2/PP2 reader
          processes in every layout, every byte verified, on any store URL
          (python -m kvreshard demo --help)
"""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from . import demo
        return demo.main(rest)
    print("python -m kvreshard: unknown command %r\n\n%s" % (cmd, __doc__.strip()), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
