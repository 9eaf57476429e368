"""GPT-2 registered with MAX's serving engine (``max serve --custom-architectures``).

The name must equal config.json's ``architectures[0]``: every GPT-2
checkpoint Hugging Face writes says ``GPT2LMHeadModel``. The engine's flags
that this model needs are declared here, not left to the command line.
"""

from max.graph.weights import WeightsFormat
from max.pipelines.context import TextContext
from max.pipelines.kv_cache.memory_planner import PagedMemoryPlanner
from max.pipelines.lib import SupportedArchitecture
from max.pipelines.modeling.types import PipelineTask

from serve.model import GPT2PipelineModel
from serve.model_config import GPT2ServeConfig, served_options
from serve.tokenizer import GPT2ServeTokenizer


def required_arguments(echo: bool) -> dict[str, bool]:
    """The engine's config fields this model is served with, whatever the
    command line says (max's config.py `_apply_required_arguments`; a name
    that is no field is skipped silently, so tests/test_serve_parts.py
    checks each one is)."""
    required = {
        # SamplingConfig: compile the sampler with presence/frequency (and
        # repetition) penalties; without it the engine accepts them and only
        # logs that it ignores them.
        "enable_penalties": True,
        # PipelineRuntimeConfig: new requests' prefill joins the running
        # decode step instead of waiting for one of its own (docs/serving.md
        # has the served figures with it on).
        "enable_in_flight_batching": True,
    }
    if echo:
        # A prompt's log-probabilities are scored from the logits of the
        # tokens the step runs: a prefix taken from the cache (KVCacheConfig),
        # or a prompt split over steps (PipelineRuntimeConfig), would leave
        # some of its tokens unscored.
        required |= {"enable_prefix_caching": False, "enable_chunked_prefill": False}
    return required


gpt2_arch = SupportedArchitecture(
    name="GPT2LMHeadModel",
    task=PipelineTask.TEXT_GENERATION,
    example_repo_ids=["openai-community/gpt2", "openai-community/gpt2-medium", "distilbert/distilgpt2"],
    default_encoding=GPT2ServeConfig.DEFAULT_ENCODING,
    supported_encodings=GPT2ServeConfig.SUPPORTED_ENCODINGS,
    pipeline_model=GPT2PipelineModel,
    tokenizer=GPT2ServeTokenizer,  # names GPT-2's limits in its 400s
    context_type=TextContext,
    default_weights_format=WeightsFormat.safetensors,
    multi_gpu_supported=False,
    # Weights are read by weights/ (GPT2PipelineModel._load_state_dict).
    weight_adapters={},
    config=GPT2ServeConfig,
    memory_planner=PagedMemoryPlanner,
    # Both need a GPU; the CPU path (and this model) runs without them. Capture brings the overlap
    # scheduler, which gave no more tokens a second on a GPU, and is unmeasured here: docs/serving.md's
    # "Device graph capture" says what would declare it (--serve-flag=--device-graph-capture turns it on).
    supports_overlap_scheduler=False,
    supports_device_graph_capture=False,
    # python -m serve --echo scores every position (serve/model.py's
    # GPT2BatchProcessor; serve/__main__.py passes the build options in the
    # environment) and needs these.
    required_arguments=required_arguments(echo=served_options().every_position),
)
