"""The engine's tokenizer for GPT-2, refusing what GPT-2 cannot do, in words.

``max serve`` answers a request it refuses with 400 either way, but it only
passes a reason on to the client for an ``InputError``; any other
``ValueError`` reaches the client as just "Value error." (the reason goes to
the server's log). The tokenizer is the architecture's own hook into request
handling, so the refusals that concern the model are raised here, named:
an empty prompt, no tokens asked for, a prompt plus ``max_tokens`` that
does not fit GPT-2's window (the engine would otherwise cut the completion
short silently; OpenAI's API refuses it), more ``min_tokens`` than either
allows, and a stop string longer than the window (MAX's tokenizer blames
that on the prompt). What the engine's route drops, or cannot take, before
this hook sees the request is answered in serve/checks.py.
"""

from __future__ import annotations

from max.pipelines.context import TextContext
from max.pipelines.context.exceptions import InputError, PromptTooLongError
from max.pipelines.lib import TextTokenizer

from serve.checks import EMPTY_PROMPT


class GPT2ServeTokenizer(TextTokenizer):
    async def new_context(self, request) -> TextContext:
        prompt = request.prompt
        # Only a prompt of no tokens: whitespace is text GPT-2 has tokens for
        # (" " is token 220), so a prompt of spaces or newlines is served.
        if prompt is not None and len(prompt) == 0:
            raise InputError(EMPTY_PROMPT)
        wanted = request.sampling_params.max_new_tokens
        if wanted is not None and wanted < 1:
            raise InputError(f"max_tokens must be at least 1, was {wanted}")
        least = request.sampling_params.min_new_tokens
        if wanted is not None and least > wanted:
            raise InputError(f"min_tokens ({least}) must not be more than max_tokens ({wanted})")
        try:
            context = await super().new_context(request)
        except PromptTooLongError as error:  # MAX's own check, with its own wording: said as the others are
            raise InputError(too_long(error.num_tokens, wanted, error.max_length)) from None
        except InputError:
            raise
        except ValueError as error:  # the context's own checks (min_tokens past the window): said, not hidden
            raise InputError(str(error)) from None
        used = context.tokens.prompt_length
        if self.max_length and wanted is not None and used + wanted > self.max_length:
            raise InputError(too_long(used, wanted, self.max_length))
        return context

    async def create_eos_tracker(self, request):
        """The stop strings are tokenized with the prompt's own length check: one
        longer than the window is said to be the stop string, not the prompt."""
        try:
            return await super().create_eos_tracker(request)
        except PromptTooLongError as error:
            raise InputError(f"a stop string of {error.num_tokens} tokens is longer than this model's context "
                             f"length of {error.max_length} tokens, so no completion could contain it") from None


def too_long(prompt: int, wanted: int | None, window: int) -> str:
    """The refusal of a prompt (and the tokens asked for) that GPT-2's window cannot hold."""
    asked = f"prompt ({prompt} tokens)" + (f" + max_tokens ({wanted}) = {prompt + wanted}" if wanted else "")
    return f"{asked} exceeds this model's context length of {window} tokens"
