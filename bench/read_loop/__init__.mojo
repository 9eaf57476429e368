# python -m bench.sections' read loop (read.mojo), and the same loop as a MAX
# custom op (op.mojo): a Mojo package, so that the standalone program and the
# op library read the bytes with one piece of code.
