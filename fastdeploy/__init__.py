"""PaddlePaddle-native LLM inference with FastDeploy's offline API.

    from fastdeploy import LLM, SamplingParams

Importing it needs PaddlePaddle 3.3.x; another version raises ImportError naming the supported range
(platforms/paddle_version.py says why).
"""
from fastdeploy.platforms.cpu import prepare_environment
from fastdeploy.platforms.paddle_version import require_supported_paddle

prepare_environment()  # must run before the first `import paddle`
require_supported_paddle()

from fastdeploy.engine.pooling_output import (ClassificationRequestOutput, EmbeddingRequestOutput,  # noqa: E402
                                              PoolingRequestOutput, RewardRequestOutput, ScoringRequestOutput)
from fastdeploy.engine.pooling_params import PoolingParams  # noqa: E402
from fastdeploy.engine.request import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from fastdeploy.engine.sampling_params import GuidedDecodingParams, SamplingParams, StructuredOutputsParams  # noqa: E402
from fastdeploy.entrypoints.llm import LLM  # noqa: E402

__all__ = ["LLM", "SamplingParams", "GuidedDecodingParams", "StructuredOutputsParams", "RequestOutput",
           "CompletionOutput", "RequestMetrics", "PoolingParams", "PoolingRequestOutput", "EmbeddingRequestOutput",
           "ClassificationRequestOutput", "ScoringRequestOutput", "RewardRequestOutput"]
__version__ = "0.1.0"
