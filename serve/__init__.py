"""GPT-2 served by MAX's own engine (``max serve``): see docs/serving.md.

``ARCHITECTURES`` is what ``max serve --custom-architectures`` imports;
``python -m serve`` starts the server with this project's choices.
"""

from serve.arch import gpt2_arch

ARCHITECTURES = [gpt2_arch]
