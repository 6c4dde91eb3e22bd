"""`python -m tools.call_path generate|chat [--all-branches] [--why CLASS]`: the types one call
touches; `--write-doc` regenerates docs/architecture.md's call-path sections, `--check` fails
(exit 1) when they are stale. See tools/call_path/__init__.py for the rules."""

from __future__ import annotations

import argparse
import sys

from .doc import ROOTS, doc_section, report, section, write_doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.call_path", description=__doc__)
    parser.add_argument("call", nargs="?", choices=sorted(ROOTS))
    parser.add_argument("--all-branches", action="store_true", help="read every branch and feature (an upper bound)")
    parser.add_argument("--why", metavar="CLASS", help="list the functions that touch CLASS")
    parser.add_argument("--write-doc", action="store_true", help="regenerate the doc's call-path sections")
    parser.add_argument("--check", action="store_true", help="exit 1 when the doc's sections are stale")
    args = parser.parse_args(argv)
    if args.write_doc:
        changed = write_doc()
        print(f"docs/architecture.md: {', '.join(changed) or 'no'} call-path section(s) changed")
        return 0
    if args.check:
        stale = [call for call in ROOTS if doc_section(call) != section(call)]
        if stale:
            print(f"stale call-path sections: {', '.join(stale)}; run python -m tools.call_path --write-doc")
        return 1 if stale else 0
    if args.call is None:
        parser.error("name a call (generate, chat), or --write-doc / --check")
    print(report(args.call, plain=not args.all_branches, why=args.why))
    return 0


if __name__ == "__main__":
    sys.exit(main())
