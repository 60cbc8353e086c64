"""ERNIE-4.5-VL through LLM.chat: the chat example of FastDeploy's offline inference docs, on a local model
directory and a local image instead of a model name and an https URL.

    python examples/vl_chat.py MODEL_DIR IMAGE [--max-tokens N]

MODEL_DIR: an ERNIE-4.5-VL checkpoint (transformers' layout or FastDeploy's -Paddle layout).
"""
import argparse
from pathlib import Path

from fastdeploy.entrypoints.llm import LLM
from fastdeploy.engine.sampling_params import SamplingParams

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("model")
parser.add_argument("image")
parser.add_argument("--max-tokens", type=int, default=None, help="default: up to max_model_len")
args = parser.parse_args()

# Load the model
llm = LLM(model=args.model, tensor_parallel_size=1, max_model_len=32768, enable_mm=True,
          limit_mm_per_prompt={"image": 100}, reasoning_parser="ernie-45-vl")

outputs = llm.chat(
    messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": Path(args.image).resolve().as_uri()}},
                                     {"type": "text", "text": "图中的文物属于哪个年代"}]}
    ],
    sampling_params=SamplingParams(max_tokens=args.max_tokens),
    chat_template_kwargs={"enable_thinking": False})

# Output results
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs.text
    reasoning_text = output.outputs.reasoning_content
    print(f"prompt: {prompt!r}\nreasoning: {reasoning_text!r}\ngenerated: {generated_text!r}\n"
          f"image tokens: {output.num_input_image_tokens}")
