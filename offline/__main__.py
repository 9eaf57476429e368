"""``python -m offline``: this project's dependencies for a machine without network, for
that machine's Python and platform, as one file or in pieces (docs/platforms.md).

    python3.13 -m offline pack --python 3.12 --platform x86_64 --installed installed.txt  # here
    python3 -m offline unpack .offline/        # there, with every piece in .offline/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from offline import bundle

    p = argparse.ArgumentParser(prog="python -m offline", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True)
    pack = verbs.add_parser("pack", help="here, with PyPI at hand: download, install, compress (and cut) the bundle")
    pack.add_argument("--python", default=bundle.DEFAULT_PYTHON, metavar="3.N",
                      help=f"the target's Python version (default: {bundle.DEFAULT_PYTHON})")
    pack.add_argument("--platform", default="x86_64", choices=bundle.PLATFORMS, help="the target's Linux platform")
    pack.add_argument("--installed", type=Path, metavar="FILE",
                      help="what the target has (`python3 -m pip list --format=freeze` there): left out, but for "
                           "the few pinned packages (default: bundle everything; offline/installed-example.txt "
                           "is an example)")
    pack.add_argument("--piece-mib", type=float, metavar="N",
                      help="cut the bundle into pieces of at most N MiB (default: one file)")
    pack.add_argument("--out", type=Path, default=bundle.PIECES, help="where to write it (default: .offline/)")
    unpack = verbs.add_parser("unpack", help="there: join the pieces, check them, unpack (GPT2_MAX_OFFLINE_HOME, "
                                             "default ~/gpt2-on-max-offline)")
    unpack.add_argument("folder", type=Path, nargs="?", default=bundle.PIECES,
                        help="the folder holding the pieces (default: .offline/)")
    args = p.parse_args(argv)
    if args.verb == "pack":
        size = int(args.piece_mib * 2**20) if args.piece_mib else None
        bundle.pack(args.installed, size, args.python, args.platform, args.out)
        return 0
    return 0 if bundle.unpack(args.folder) else 3


if __name__ == "__main__":
    sys.exit(main())
