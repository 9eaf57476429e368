# The interleaved Q8_0 experiment (layout.mojo) as a Mojo package.
