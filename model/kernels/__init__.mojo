# GPT-2 on MAX's own kernels, loaded by MAX as a custom-op library (see
# matmul.mojo). This file makes the folder a Mojo package.
