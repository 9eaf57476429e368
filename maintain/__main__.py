"""``python -m maintain make`` / ``check``: every kind of shipped artifact made, or checked against this code.

    python -m maintain make                                  # every kind, every name, every level
    python -m maintain make --kind app-graph --name gpt2 --target neoverse-n1   # one of them
    python -m maintain make --kind eager-kernels --again     # MAX's eager kernels compiled anew (~20 min a level)
    python -m maintain check                                 # exit 1 when one is stale or missing
    python -m maintain check --first-checks                  # and each step's first check on empty caches

A kind is a module of this package (maintain/kinds.py): its ``NAMES``, its
``LEVELS``, ``make(name, target)`` and ``stale(name, target)``. The facts every
kind writes, its files and the licence's notice are shared (maintain/making.py,
artifacts/).
"""

from __future__ import annotations

import argparse
import sys

from artifacts.facts import SHIPPED
from artifacts.targets import TARGETS
from maintain import eager_kernels
from maintain.kinds import KINDS


def chosen(args) -> list[tuple[str, str, str]]:
    """(kind, name, level) of every artifact the arguments name."""
    return [(kind, name, level) for kind in args.kind or KINDS
            for name in KINDS[kind].NAMES if not args.name or name in args.name
            for level in KINDS[kind].LEVELS if not args.target or level in args.target]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m maintain", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="{make,check}")
    made = sub.add_parser("make", help=f"make the shipped artifacts from empty caches into {SHIPPED.name}/")
    checked = sub.add_parser("check", help="exit 1 when a shipped artifact no longer matches this code")
    for parser in (made, checked):
        parser.add_argument("--kind", choices=KINDS, action="append", help="only this kind (again for more)")
        parser.add_argument("--name", action="append", help="only this model (demo, gpt2; again for more)")
        parser.add_argument("--target", choices=[t for t in TARGETS if TARGETS[t].shipped], action="append",
                            help="only this CPU level (again for more)")
    made.add_argument("--again", action="store_true", help="MAX's eager kernels compiled even when the same MAX "
                      "made them for the same target")
    checked.add_argument("--first-checks", action="store_true", help="also time each step's first check on empty "
                         "caches (each in its own process); stale when one compiles a kernel")
    args = p.parse_args(argv)
    failed = 0
    for kind, name, level in chosen(args):
        module = KINDS[kind]
        if args.command == "make":
            done = module.make(name, TARGETS[level], args.again) if kind == "eager-kernels" else \
                module.make(name, TARGETS[level])
            if done:
                return done
            continue
        why = module.stale(name, TARGETS[level])
        print(f"{kind} {name} {level}: " + (f"{why}: python -m maintain make --kind {kind} --name {name} "
                                            f"--target {level}" if why else "matches this code"), flush=True)
        failed |= bool(why)
    if args.command == "check" and args.first_checks:
        failed |= eager_kernels.first_checks([])
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
