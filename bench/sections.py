"""``python -m bench.sections``: what a parallel section costs in MAX's runtime.

A decode step runs one parallel section per matmul (49 for GPT-2 124M), each
waiting for the one before, and each section starts its tasks on the
runtime's workers and waits for them to end. This builds
``bench/sections.mojo`` (with the mojo compiler in the max wheel) and reads
a decode step's float32 weight bytes (GPT-2 124M's matmul shapes) with a
plain vector loop on every core, as one section, as 49 sections in order,
and as 49 steps of one section separated by spinning barriers (what
llama.cpp's threads do between ops), alternated; it also times an empty
section. The difference between the three is only how the 48 boundaries
between matmuls are crossed.

Why: inside the model this project's fp32 decode step is ~1-1.5 ms slower
than its 49 matmuls back to back, and llama.cpp's is not (README, "Profile
of a decode step"); this shows how much of it a section boundary is, with
no model and no kernel of this project's in the way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import mojo_program

SOURCE = Path(__file__).with_name("sections.mojo")


def measure(passes: int) -> dict[str, float]:
    """The program's figures: cores, bytes, sections, empty_us, one_ms, split_ms, spin_ms."""
    out = mojo_program.run(SOURCE, str(passes))
    return {name: float(value) for name, value in (line.split() for line in out.splitlines())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sections", description=__doc__.split("\n\n")[0])
    p.add_argument("--passes", type=int, default=40, help="passes over the bytes in each form; medians are printed (default 40)")
    args = p.parse_args(argv)
    f = measure(args.passes)
    boundaries = int(f["sections"]) - 1
    print(f"a decode step's float32 weights (GPT-2 124M's {int(f['sections'])} matmuls, {f['bytes'] / 1e6:.0f} MB), "
          f"read by {int(f['cores'])} cores, medians of {args.passes} passes:")
    print(f"  one parallel section:                        {f['one_ms']:6.2f} ms ({f['bytes'] / f['one_ms'] / 1e6:.1f} GB/s)")
    for key, what in (("split_ms", "one section per matmul (MAX's runtime):"), ("spin_ms", "one section, spinning barriers between:")):
        extra = (f[key] - f["one_ms"]) * 1e3 / boundaries
        print(f"  {what:<45}{f[key]:6.2f} ms: {extra:+.1f} us a boundary")
    print(f"  an empty parallel section, back to back:     {f['empty_us']:6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
