"""``python -m gpu``: run this project on a GPU machine without network
(its own Python, no MAX): what it lacks of this project's dependencies, carried in pieces.
docs/gpu.md has the whole recipe.

    python3.13 -m gpu pack --python 3.12 --installed installed.txt   # here -> .gpu/kit-*.N-of-M
    python3 -m gpu receive                 # there, once per call carrying one piece
    python3 -m gpu run check tests ...     # there: stages, logs in $OUT
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from gpu import kit, run

    p = argparse.ArgumentParser(prog="python -m gpu", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True)
    pack = verbs.add_parser("pack", help="here: download, install, compress and cut MAX for the GPU machine")
    pack.add_argument("--python", default=kit.DEFAULT_PYTHON, metavar="3.N",
                      help=f"the target's Python version (default: {kit.DEFAULT_PYTHON})")
    pack.add_argument("--arch", default="x86_64", choices=kit.ARCHES, help="the target's Linux architecture")
    pack.add_argument("--installed", type=Path, metavar="FILE",
                      help="what the target has (`python3 -m pip list --format=freeze` there): not carried, but "
                           "for the few pinned packages (default: carry everything; gpu/installed-example.txt "
                           "is one machine image's)")
    pack.add_argument("--piece-mib", type=float, help="piece size (default: what a call leaves beside the tree)")
    pack.add_argument("--recut", action="store_true",
                      help="only cut the last pack's archive again (seconds), e.g. after the tree grew")
    pack.add_argument("--lean", action="store_true",
                      help="fewer pieces: all but the last cut to travel beside the lean tree (python -m gpu lean "
                           "before their calls, python -m gpu whole before the last's)")
    verbs.add_parser("lean", help="here: leave the checkpoints, reference data and docs out of what travels "
                                  "(for the calls that only carry a piece)")
    verbs.add_parser("whole", help="here: undo lean (before the last piece's call, which runs the stages)")
    verbs.add_parser("receive", help="there: keep this call's piece; unpack MAX once all are in")
    stages = run.stages(sys.executable, "gpu", kit.ROOT)
    go = verbs.add_parser("run", help="there: run stages, logging to $OUT",
                          description="stages: " + ", ".join(stages))
    go.add_argument("stages", nargs="+", metavar="STAGE", help=", ".join(stages))
    go.add_argument("--device", default="gpu", choices=["gpu", "cpu"],
                    help="cpu: try the stages here first, on the CPU (default: gpu)")
    args = p.parse_args(argv)
    if args.verb == "pack":
        size = int(args.piece_mib * 2**20) if args.piece_mib else None
        if args.recut:
            kit.recut(size, args.lean)
        else:
            kit.pack(args.installed, size, args.lean, args.python, args.arch)
        return 0
    if args.verb in ("lean", "whole"):
        print(kit.lean() if args.verb == "lean" else kit.whole())
        return 0
    if args.verb == "receive":
        return 0 if kit.receive() else 3
    return run.run(args.stages, args.device)


if __name__ == "__main__":
    sys.exit(main())
